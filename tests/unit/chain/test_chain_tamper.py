"""The hash chain detects any single-byte tamper, reorder, deletion or insertion (hypothesis)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest
from agent_saga import FileWAL, verify_records
from agent_saga.chain import check_record, content_digest, header_hash
from agent_saga.records import GENESIS, canonical_json, decode_line
from agent_saga.wal.file import iter_file_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

N = 8


def _make_log(path: Path) -> bytes:
    async def fill() -> None:
        wal = FileWAL(path)
        for i in range(N):
            wal.append("STEP_COMMITTED", f"s-{i % 3}", f"s-{i % 3}/{i}",
                       {"amount": 100 * i, "to": f"acct_{i}", "nested": {"k": [i, "é"]}})
        await wal.barrier()
        wal.close()

    asyncio.run(fill())
    return path.read_bytes()


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _make_log(tmp_path_factory.mktemp("chain") / "base.wal")


def _verify_bytes(tmp: Path, data: bytes):
    p = tmp / "t.wal"
    p.write_bytes(data)
    return verify_records(iter_file_records(p))


def test_pristine_log_verifies(pristine: bytes, tmp_path: Path) -> None:
    res = _verify_bytes(tmp_path, pristine)
    assert res.ok and res.records == N


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_single_byte_change_is_detected(pristine: bytes, tmp_path: Path, data: st.DataObject) -> None:
    # Every byte but the final newline: removing that one turns the last record into an
    # unacknowledged torn fragment, which is indistinguishable from truncation and is
    # caught by comparing the head (`verify --head`), tested separately.
    pos = data.draw(st.integers(0, len(pristine) - 2), label="position")
    new = data.draw(st.integers(0, 255).filter(lambda b: b != pristine[pos]), label="byte")
    tampered = pristine[:pos] + bytes([new]) + pristine[pos + 1 :]
    res = _verify_bytes(tmp_path, tampered)
    assert not res.ok, f"byte {pos} -> {new!r} went undetected"
    assert res.location is not None and res.reason


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_reorder_delete_insert_are_detected(pristine: bytes, tmp_path: Path, data: st.DataObject) -> None:
    lines = pristine.splitlines(keepends=True)
    op = data.draw(st.sampled_from(["swap", "delete", "duplicate", "move"]))
    i = data.draw(st.integers(0, N - 1))
    j = data.draw(st.integers(0, N - 1).filter(lambda x: x != i))
    if op == "swap":
        lines[i], lines[j] = lines[j], lines[i]
    elif op == "delete":
        if i == N - 1:
            i = 0  # deleting the last line is truncation: caught with --head (below)
        del lines[i]
    elif op == "duplicate":
        lines.insert(j, lines[i])
    else:
        lines.insert(j, lines.pop(i))
    res = _verify_bytes(tmp_path, b"".join(lines))
    assert not res.ok, f"{op} {i} {j} went undetected"


def test_broken_record_is_named(pristine: bytes, tmp_path: Path) -> None:
    lines = pristine.splitlines(keepends=True)
    lines[4] = lines[4].replace(b'"amount":400', b'"amount":900')
    res = _verify_bytes(tmp_path, b"".join(lines))
    assert not res.ok and res.first_bad_seq == 5
    assert res.location is not None and res.location.endswith("line 5")
    assert "payload does not match its digest" in (res.reason or "")


def test_rewritten_digest_still_breaks_header_hash(pristine: bytes, tmp_path: Path) -> None:
    # An attacker who recomputes the digest for new contents still breaks the hash link.
    p = tmp_path / "x.wal"
    p.write_bytes(pristine)
    rec = decode_line(pristine.splitlines()[2], "x")
    rec.payload = {"amount": 1}
    rec.digest = content_digest(rec.salt or "", canonical_json(rec.payload))
    assert check_record(rec, rec.prev, rec.seq) == (
        "hash does not match the record's header: seq, ts, type, saga, step or digest was altered"
    )


def test_chain_rule_is_reproducible_without_our_code(pristine: bytes) -> None:
    # The rule in chain.py's docstring, re-implemented with hashlib and json only.
    import json

    prev = GENESIS
    for line in pristine.splitlines():
        d = json.loads(line)
        payload = json.dumps(d["payload"], sort_keys=True, separators=(",", ":"), ensure_ascii=False)
        assert hashlib.sha256(bytes.fromhex(d["salt"]) + payload.encode()).hexdigest() == d["digest"]
        header = "\n".join(str(x) for x in (d["v"], d["seq"], d["ts"], d["type"], d["saga"],
                                              d["step"] or "", d["digest"], d["prev"]))
        assert hashlib.sha256(header.encode()).hexdigest() == d["hash"]
        assert d["prev"] == prev
        prev = d["hash"]
    rec = decode_line(pristine.splitlines()[0], "x")
    assert header_hash(rec) == rec.hash


def test_salt_spelled_in_uppercase_is_detected(pristine: bytes, tmp_path: Path) -> None:
    # bytes.fromhex("AB") == bytes.fromhex("ab"): the digest alone cannot see this edit.
    import json

    lines = pristine.splitlines(keepends=True)
    salt = json.loads(lines[2])["salt"]
    assert any(c in "abcdef" for c in salt)
    lines[2] = lines[2].replace(salt.encode(), salt.upper().encode())
    res = _verify_bytes(tmp_path, b"".join(lines))
    assert not res.ok and res.first_bad_seq == 3 and "lowercase hex" in (res.reason or "")
