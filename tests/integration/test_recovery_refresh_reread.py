"""A claimed saga's records are read again in the same request as the claim's refresh read
(its confirmation), not in a request of their own; what that read finds is checked as any
re-read is: an edited record (even re-sealed) halts, a deleted one stops the saga, and a
saga that gained records in that very read is read again on its own."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agent_saga.recovery import RecoveryDaemon
from agent_saga.wal.redis import RedisWAL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_recovery_bounded_scan import (  # noqa: E402 - the same orphans, daemon and edits
    CALLS,
    HANDLER,
    KEY,
    attacker,
    daemon,
    rewrite,
    write_orphans,
)
from verified_support import comp  # noqa: E402

__all__ = ["daemon"]  # the fixture, shared


def separate_rereads(d: RecoveryDaemon) -> int:
    """Requests made only to read claimed sagas' records again."""
    return int(d.source._rereads.batches)  # type: ignore[attr-defined]


async def test_each_claimed_saga_is_read_again_with_its_refresh_and_nothing_is_kept_after(
    daemon: tuple[RecoveryDaemon, Any],
) -> None:
    d, server = daemon
    write_orphans(server.url, 6)
    try:
        await d._refresh()
        rep = await d.sweep()
    finally:
        await d.close()
    assert rep.ok and rep.recovered == 6
    assert CALLS == Counter({f"ch_{i}": 1 for i in range(6)})
    assert d.source.prefetched == 6 and separate_rereads(d) == 0
    assert d.source._fetched == {}  # bounded: nothing read ahead outlives its claim


CHANGES = {  # what is done to s0 after the scan: (record seq, edit, where the sweep says so, what)
    "edited": (4, lambda line: attacker(line, reseal=False), "halted", "payload does not match its digest"),
    "edited-and-resealed": (4, lambda line: attacker(line, reseal=True), "halted", "its hash differs"),
    "deleted": (3, lambda line: None, "error", "a record of saga s0 is gone since recovery read it"),
}


@pytest.mark.parametrize("change", list(CHANGES))
async def test_a_record_the_refresh_reads_again_changed_or_gone_is_never_acted_on(
    daemon: tuple[RecoveryDaemon, Any], change: str
) -> None:
    seq, edit, field, reason = CHANGES[change]
    d, server = daemon
    write_orphans(server.url, 1)
    try:
        await d._refresh()
        rewrite(server, seq, edit)  # 4: the STEP_COMMITTED, 3: the STEP_INTENT
        rep = await d.sweep()
    finally:
        await d.close()
    assert d.source.prefetched == 1 and separate_rereads(d) == 0  # found by the refresh's own request
    said = getattr(rep, field)
    assert said is not None and reason in said
    if field == "halted":
        assert "a record of saga s0 changed after recovery verified it" in said and d.halted is not None
    assert CALLS == Counter() and rep.recovered == 0


async def test_a_saga_that_gained_records_in_its_refresh_is_read_again_on_its_own(
    daemon: tuple[RecoveryDaemon, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    d, server = daemon
    write_orphans(server.url, 1)
    real_acquire = d.lock.acquire

    async def acquire_then_another_writer_adds_a_step(name: str, ttl: float) -> Any:
        # Once the claim is held, another writer adds a second committed step to s0: the
        # refresh that serves the claim reads it, so the places read ahead are not all.
        claim = await real_acquire(name, ttl)
        other = RedisWAL(server.url, key=KEY, writer="agent-2")
        try:
            other.append("STEP_INTENT", "s0", "s0/1", {
                "tool": "pay.charge", "semantics": "COMPENSABLE", "policy_args": {"amount": 5},
                "idempotency_key": "k-s0-1"})
            other.append("STEP_COMMITTED", "s0", "s0/1", {
                "tool": "pay.charge", "semantics": "COMPENSABLE", "compensation": comp("ch_late", HANDLER)})
            other.barrier_sync()
        finally:
            other.close()
        return claim

    monkeypatch.setattr(d.lock, "acquire", acquire_then_another_writer_adds_a_step)
    try:
        await d._refresh()
        rep = await d.sweep()
    finally:
        await d.close()
    assert d.source.prefetched == 0 and separate_rereads(d) == 1  # every place, read on its own
    assert rep.ok and rep.recovered == 1
    assert CALLS == Counter({"ch_0": 1, "ch_late": 1})  # both steps, each once
