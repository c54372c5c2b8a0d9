"""``decode_line`` takes the common line without ``json.loads``; every line, valid or
damaged, still decodes to the record (or fails with the message) the full path gives."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agent_saga import WALCorrupt
from agent_saga.records import _decode_line, decode_line

BASE: dict[str, Any] = {
    "v": 1, "seq": 7, "ts": 17, "type": "STEP_INTENT", "saga": "s-1", "step": "s-1/0",
    "payload": {"a": [1, "é"]}, "salt": "ab", "digest": "d", "prev": "p", "hash": "h",
}


def enc(d: dict[str, Any]) -> str:
    return json.dumps(d, ensure_ascii=False, separators=(",", ":"))


def lines() -> list[bytes | str]:
    out: list[bytes | str] = [enc(BASE), enc(BASE).encode()]
    for k in BASE:
        missing = {f: v for f, v in BASE.items() if f != k}
        out += [enc(missing), enc(missing).encode()]
        for bad in (None, True, 1.5, "x", [], {}, 3):
            out += [enc({**BASE, k: bad}), enc({**BASE, k: bad}).encode()]
    out += [
        enc({**BASE, "redacted": True, "payload": None, "salt": None}).encode(),
        enc({**BASE, "gseq": 5}).encode(),  # a field beyond the known ones
        b"\xef\xbb\xbf" + enc(BASE).encode(), "\ufeff" + enc(BASE),  # byte order marks
        enc(BASE).encode("utf-16"), enc(BASE).encode("utf-16-le"), enc(BASE).encode("utf-32"),
        b"{bad", b"[1]", b"", b"1", b"{\x00", b"  " + enc(BASE).encode(), enc(BASE).encode() + b"\n",
        b'{"v":1,"seq":1}\xff',  # not UTF-8
    ]
    return out


def outcome(decode: Any, line: bytes | str) -> tuple[Any, ...]:
    try:
        r = decode(line, "wal line 3")
    except WALCorrupt as exc:
        return ("WALCorrupt", str(exc), exc.location)
    return ("record", r.type, r.saga, r.step, r.payload, r.seq, r.ts, r.salt, r.digest, r.prev,
            r.hash, r.redacted, r.extra)


@pytest.mark.parametrize("line", lines())
def test_every_line_decodes_as_the_full_path_decodes_it(line: bytes | str) -> None:
    assert outcome(decode_line, line) == outcome(_decode_line, line)


def test_a_damaged_line_names_its_field_and_location() -> None:
    with pytest.raises(WALCorrupt, match="wal line 3: field 'seq' must be an integer") as err:
        decode_line(enc({**BASE, "seq": True}).encode(), "wal line 3")
    assert err.value.location == "wal line 3"
    with pytest.raises(WALCorrupt, match="missing required field 'hash'"):
        decode_line(enc({f: v for f, v in BASE.items() if f != "hash"}).encode(), "wal line 3")


def test_the_common_line_gets_a_fresh_extra() -> None:
    a = decode_line(enc(BASE).encode(), "x")
    b = decode_line(enc(BASE).encode(), "x")
    a.extra["gseq"] = 1
    assert b.extra == {}
