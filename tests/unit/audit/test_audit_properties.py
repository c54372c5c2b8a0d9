"""Properties (hypothesis): against a signed checkpoint, any edit, reorder, insertion, deletion
or truncation is detected; redaction, appends and a compaction that removes none of the
signed records are accepted, a compaction that removes signed records is not."""

from __future__ import annotations

import asyncio
import itertools
import shutil
from pathlib import Path

import pytest
from agent_saga import FileWAL
from agent_saga.audit import (
    audit_root,
    generate_signing_key,
    load_private_key,
    load_public_key,
    make_checkpoint,
    redact_records,
    verify_checkpoint,
)
from agent_saga.records import Record
from agent_saga.wal.file import iter_file_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SAGAS = 5
_counter = itertools.count()


def _build(p: Path) -> None:
    wal = FileWAL(p)
    for i in range(SAGAS):
        sid = f"s-{i}"
        wal.append("SAGA_STARTED", sid, None, {"name": "pay", "who": f"cust-{i}"})
        wal.append("STEP_INTENT", sid, f"{sid}/0", {"tool": "stripe.charge", "semantics": "COMPENSABLE"})
        wal.append("STEP_COMMITTED", sid, f"{sid}/0", {"compensation": {"handler": "refund",
                                                        "kwargs": {"amount": 100 * i, "note": "é"}}})
        if i % 2 == 0:
            wal.append("SAGA_COMPLETED", sid, None, {})
    wal.barrier_sync()
    wal.close()


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    d = tmp_path_factory.mktemp("props")
    p = d / "base.wal"
    _build(p)
    priv_path, pub_path = generate_signing_key(d / "k")
    cp = make_checkpoint(iter_file_records(p), load_private_key(priv_path), log_id="props")
    return p.read_bytes(), cp, load_public_key(pub_path)


def _verdict(tmp: Path, data: bytes, cp, pub):  # noqa: ANN001
    f = tmp / "t.wal"
    f.write_bytes(data)
    return verify_checkpoint(cp, pub, iter_file_records(f))


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_tampering_after_a_checkpoint_is_detected(world: tuple, tmp_path: Path, data: st.DataObject) -> None:
    pristine, cp, pub = world
    lines = pristine.splitlines(keepends=True)
    n = len(lines)
    op = data.draw(st.sampled_from(["byte", "swap", "move", "delete", "duplicate", "insert-forged",
                                    "truncate", "drop-tail"]), label="op")
    if op == "byte":  # every byte, the final newline included
        pos = data.draw(st.integers(0, len(pristine) - 1), label="pos")
        new = data.draw(st.integers(0, 255).filter(lambda b: b != pristine[pos]), label="byte")
        blob = pristine[:pos] + bytes([new]) + pristine[pos + 1 :]
    elif op == "truncate":
        blob = pristine[: data.draw(st.integers(0, len(pristine) - 1), label="cut")]
    elif op == "drop-tail":
        blob = b"".join(lines[: data.draw(st.integers(0, n - 1), label="keep")])
    else:
        i = data.draw(st.integers(0, n - 1), label="i")
        j = data.draw(st.integers(0, n - 1).filter(lambda x: x != i), label="j")
        if op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "move":
            lines.insert(j, lines.pop(i))
        elif op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(j, lines[i])
        else:  # a well-formed record with a made-up payload, inserted before the head
            forged = lines[i].replace(b'"name":"pay"', b'"name":"pax"').replace(b'"tool":"', b'"tool":"x')
            lines.insert(min(j, n - 1), forged if forged != lines[i] else b'{"v":1}\n')
        blob = b"".join(lines)
    res = _verdict(tmp_path, blob, cp, pub)
    assert not res.ok, f"{op} went undetected"
    assert res.reason


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_redaction_appends_and_compaction_against_a_checkpoint(world: tuple, tmp_path: Path, data: st.DataObject) -> None:
    pristine, cp, pub = world
    f = tmp_path / f"t-{next(_counter)}.wal"
    f.write_bytes(pristine)
    seqs = [r.seq for _, r in iter_file_records(f) if isinstance(r, Record)]
    before = audit_root(r for _, r in iter_file_records(f) if isinstance(r, Record))
    redact_first = data.draw(st.booleans(), label="redact first")
    to_redact = data.draw(st.lists(st.sampled_from(seqs), unique=True, max_size=6), label="redact")
    note = data.draw(st.booleans(), label="note")
    compact = data.draw(st.booleans(), label="compact")
    keep = data.draw(st.sets(st.sampled_from(["s-0", "s-2", "s-4"])), label="keep")
    appended = data.draw(st.integers(0, 3), label="appended")

    async def compact_and_append() -> None:
        wal = FileWAL(f)
        try:
            for k in range(appended):
                wal.append("SAGA_STARTED", f"late-{k}", None, {})
            if compact:
                await wal.compact(keep_sagas=keep)
            await wal.barrier()
        finally:
            wal.close()

    if redact_first and to_redact:
        redact_records(f, to_redact, note=note)
    asyncio.run(compact_and_append())
    if not redact_first and to_redact:
        present = {r.seq for _, r in iter_file_records(f) if isinstance(r, Record) and r.saga != "wal"}
        if present & set(to_redact):
            redact_records(f, sorted(present & set(to_redact)))
    res = verify_checkpoint(cp, pub, iter_file_records(f))
    present = {r.seq for _, r in iter_file_records(f) if isinstance(r, Record)}
    if set(range(1, cp.seq + 1)) <= present:
        assert res.ok, res.describe()
    else:  # a compaction after the checkpoint removed records it signed: refused
        assert not res.ok and "pins every record it signed" in (res.reason or ""), res.describe()
    if not compact:
        # Without compaction the earlier records are all there: their tree is unchanged.
        head = [r for _, r in iter_file_records(f) if isinstance(r, Record)][: before.size]
        assert audit_root(head).root == before.root


def test_the_world_is_what_the_properties_assume(world: tuple, tmp_path: Path) -> None:
    pristine, cp, pub = world
    assert _verdict(tmp_path, pristine, cp, pub).ok
    assert cp.seq == len(pristine.splitlines())
    shutil.rmtree(tmp_path, ignore_errors=True)
