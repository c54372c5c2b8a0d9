"""What the crash suite asserts after every kill, against the bank rather than the log."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_saga import idempotency_key, verify_records
from agent_saga.history import COMPENSATING, COMPLETED, IN_FLIGHT, ROLLED_BACK, fold
from agent_saga.recovery import FileLedger, RecoveryDaemon, SweepReport, escalation_id
from agent_saga.wal.file import iter_file_records
from chaos_bank import Bank


def future() -> float:
    return time.time() + 3600  # past every lease: the worker is dead, we know it is


def chain_ok(wal: Path) -> None:
    result = verify_records(iter_file_records(wal))
    assert result.ok, result.describe()


def sagas(wal: Path) -> dict[str, Any]:
    return fold(r for _, r in iter_file_records(wal))


def in_doubt(wal: Path) -> set[str]:
    """Steps whose compensation was started and not finished when the worker died."""
    return {s.step_id for saga in sagas(wal).values() for s in saga.steps.values() if s.state == COMPENSATING}


def recover(wal: Path, times: int = 1, **kw: Any) -> list[SweepReport]:
    async def go() -> list[SweepReport]:
        out = []
        for _ in range(times):
            d = RecoveryDaemon(wal, imports=["chaos_handlers"], clock=future, **kw)
            out.append(await d.sweep())
            await d.close()
        return out

    return asyncio.run(go())


@dataclass
class Verdict:
    status: dict[str, str]
    charges: int = 0
    refunded: int = 0
    escalated: int = 0
    notes: list[str] = field(default_factory=list)


def check_money(wal: Path, bank_path: Path, doubt: set[str], *, context: str = "") -> Verdict:
    """The acceptance rule for one log after recovery (see the module doc of the suite).

    - no saga is left in flight (zero orphans without escalation);
    - every charge of a saga that did not complete is refunded exactly once, or its step
      has an escalation in the human queue; a COMPLETED saga keeps its charges;
    - a saga reported clean (ROLLED_BACK) has no money outstanding;
    - the strong claim: every refund call carried the step's deterministic key, and a
      step was called a second time only if its compensation was in doubt at the kill.
    """
    state = sagas(wal)
    ledger = FileLedger(f"{wal}.recovery.jsonl")
    escalated = {(e.saga_id, e.step_id) for e in ledger.escalations_sync(include_resolved=True)}
    v = Verdict({s: st.status for s, st in state.items()})
    where = f" [{context}]" if context else ""
    for saga_id, saga in state.items():
        assert saga.status != IN_FLIGHT, f"saga {saga_id} is an orphan with no resolution{where}"
    for c in Bank(bank_path).state().values():
        v.charges += 1
        saga_id = c.account
        step = next(
            (sid for sid in state[saga_id].steps if idempotency_key(saga_id, sid, "forward") == c.key), None
        )
        assert step is not None, f"charge {c.id} belongs to no step of {saga_id}{where}"
        comp_key = idempotency_key(saga_id, step, "compensate")
        assert len(c.applied) <= 1, f"DOUBLE REFUND of {c.id} ({step}): {c.applied}{where}"
        assert all(k == comp_key for k in c.attempts), f"refund of {c.id} under a foreign key{where}"
        allowed = 2 if step in doubt else 1
        assert len(c.attempts) <= allowed, (
            f"refund of {c.id} ({step}) was called {len(c.attempts)} times, allowed {allowed} "
            f"(in doubt at the kill: {step in doubt}){where}"
        )
        status = state[saga_id].status
        if status == COMPLETED:
            assert not c.applied, f"{c.id} refunded though saga {saga_id} completed{where}"
            continue
        if c.applied:
            v.refunded += 1
            continue
        assert status != ROLLED_BACK, f"saga {saga_id} reported clean with {c.id} outstanding{where}"
        assert (saga_id, step) in escalated, (
            f"charge {c.id} ({step}) is outstanding and nobody was told: no escalation{where}"
        )
        assert escalation_id(saga_id, step)  # deterministic id exists
        v.escalated += 1
    return v


def attempts(bank_path: Path) -> int:
    return sum(len(c.attempts) for c in Bank(bank_path).state().values())
