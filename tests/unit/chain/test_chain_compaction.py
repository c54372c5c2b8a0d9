"""Verification accepts exactly the gaps compaction attestations explain, and nothing else."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from agent_saga import FileWAL, verify_records
from agent_saga.chain import parse_attestation, removal_digest, seal
from agent_saga.records import GENESIS, Record
from agent_saga.wal.file import iter_file_records
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


def _verify_bytes(tmp: Path, data: bytes):
    p = tmp / "v.wal"
    p.write_bytes(data)
    return verify_records(iter_file_records(p))


def _build(path: Path, plan: list[tuple[int, bool]], compact_after: set[int]) -> None:
    """Sagas ``(n_steps, settles)`` in order; compact after the listed sagas."""

    async def fill() -> None:
        wal = FileWAL(path)
        for i, (steps, settles) in enumerate(plan):
            sid = f"s-{i}"
            wal.append("SAGA_STARTED", sid, None, {})
            for k in range(steps):
                wal.append("STEP_COMMITTED", sid, f"{sid}/{k}", {"amount": k})
            if settles:
                wal.append("SAGA_COMPLETED", sid, None, {})
            if i in compact_after:
                await wal.barrier()
                await wal.compact()
        await wal.barrier()
        wal.close()

    asyncio.run(fill())


plans = st.lists(st.tuples(st.integers(0, 3), st.booleans()), min_size=2, max_size=10)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans, data=st.data())
def test_compacted_logs_verify_and_any_deletion_is_caught(tmp_path: Path, plan, data: st.DataObject) -> None:
    compact_after = set(data.draw(st.lists(st.integers(0, len(plan) - 1), min_size=1, max_size=3)))
    p = tmp_path / "h.wal"
    p.unlink(missing_ok=True)
    _build(p, plan, compact_after)
    pristine = p.read_bytes()
    res = _verify_bytes(tmp_path, pristine)
    assert res.ok, res
    lines = pristine.splitlines(keepends=True)
    if len(lines) < 2:
        return
    # Deleting any line but the last (truncation: caught with --head) breaks verification.
    i = data.draw(st.integers(0, len(lines) - 2), label="deleted line")
    res = _verify_bytes(tmp_path, b"".join(lines[:i] + lines[i + 1 :]))
    assert not res.ok, f"deleting line {i + 1} went undetected"
    # So does moving a line.
    j = data.draw(st.integers(0, len(lines) - 1).filter(lambda x: x != i), label="moved to")
    moved = list(lines)
    moved.insert(j, moved.pop(i))
    assert not _verify_bytes(tmp_path, b"".join(moved)).ok


def _chain(specs: list[tuple[int, str, str, dict | None]]) -> list[Record]:
    prev, out = GENESIS, []
    for seq, type_, saga, payload in specs:
        r = Record(type_, saga, None, payload, seq, 1)
        seal(r, prev)
        prev = r.hash
        out.append(r)
    return out


def _check(recs: list[Record]):
    return verify_records((f"rec {r.seq}", r) for r in recs)


def test_hand_built_gap_needs_exact_cover_and_link() -> None:
    # Records 1..3 existed; 2 and 3 were removed; 4 links to 3; attestation 5 names 2..3.
    full = _chain([(1, "X", "a", {}), (2, "X", "b", {}), (3, "X", "b", {}), (4, "X", "a", {})])
    h3 = full[2].hash
    kept = [full[0], full[3]]
    good = {"removed": [[2, 3, h3]], "count": 2, "digest": removal_digest([full[1].hash, h3])}

    def attest(payload: dict) -> list[Record]:
        att = Record("COMPACTION", "wal", None, payload, 5, 1)
        seal(att, kept[-1].hash)
        return [*kept, att]

    assert _check(attest(good)).ok
    assert _check(attest(good)).attested == 2
    partial = {"removed": [[3, 3, h3]], "count": 1, "digest": "0" * 64}
    res = _check(attest(partial))
    assert not res.ok and "no compaction attestation accounts" in (res.reason or "")
    wrong_link = {"removed": [[2, 3, "e" * 64]], "count": 2, "digest": "0" * 64}
    res = _check(attest(wrong_link))
    assert not res.ok and "attested hash" in (res.reason or "")
    no_attestation = _check(kept)
    assert not no_attestation.ok and no_attestation.first_bad_seq == 4


def test_malformed_attestations_are_refused() -> None:
    base = _chain([(1, "X", "a", {})])
    for payload, why in [
        ({"removed": "1-3", "count": 3}, "no 'removed' list"),
        ({"removed": [[1, 2]], "count": 2}, "malformed run"),
        ({"removed": [[3, 2, "a" * 64]], "count": 0}, "out of order"),
        ({"removed": [[1, 9, "a" * 64]], "count": 9}, "not before the attestation"),
        ({"removed": [[1, 1, "a" * 64]], "count": 5}, "count=5"),
    ]:
        att = Record("COMPACTION", "wal", None, payload, 2, 1)
        assert isinstance(parse_attestation(att), str)
        att.seq = 2
        seal(att, base[0].hash)
        res = _check([base[0], att])
        assert not res.ok and why in (res.reason or ""), (payload, res.reason)


def test_an_unexplained_gap_is_reported_before_a_later_break(tmp_path: Path) -> None:
    p = tmp_path / "g.wal"
    _build(p, [(1, False)] * 5, set())
    lines = p.read_bytes().splitlines(keepends=True)
    del lines[2]  # seq 3 goes: a deletion
    d = json.loads(lines[-1])
    d["payload"] = {"amount": 99}  # and a later record is altered
    lines[-1] = (json.dumps(d, separators=(",", ":")) + "\n").encode()
    res = _verify_bytes(tmp_path, b"".join(lines))
    assert not res.ok and res.first_bad_seq == 4 and "records 3 are missing" in (res.reason or "")


def test_nan_in_a_tampered_payload_is_a_failure_not_a_crash(tmp_path: Path) -> None:
    p = tmp_path / "n.wal"
    _build(p, [(1, False)], set())
    data = p.read_bytes().replace(b'"amount":0', b'"amount":NaN')
    res = _verify_bytes(tmp_path, data)
    assert not res.ok and "NaN" in (res.reason or "")
