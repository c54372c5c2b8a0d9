"""Helpers for the recovery unit tests: logs left behind by a dead owner, and handlers.

``write_orphan`` writes, through a real FileWAL, exactly the records the engine writes for
the steps it is given, then closes the WAL (its flock is released: the owner is gone).
The crash suite (tests/chaos) gets the same logs from real processes killed mid-saga.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from agent_saga import FileWAL, compensator, idempotency_key
from agent_saga.history import fold
from fixtures.wal import records as wal_records

CALLS: list[tuple[str, dict[str, Any]]] = []  # (idempotency key, kwargs) per refund call
FAIL_NEXT: list[str] = []
_lock = threading.Lock()

FUTURE = lambda: time.time() + 3600  # noqa: E731 - a daemon clock far past every lease


@compensator("test.recovery.refund")
def refund(charge_id: str, idempotency_key: str) -> str:
    with _lock:
        CALLS.append((idempotency_key, {"charge_id": charge_id}))
        if FAIL_NEXT:
            raise RuntimeError(FAIL_NEXT.pop())
    return "refunded"


def desc(charge_id: str, handler: str = "test.recovery.refund") -> dict[str, Any]:
    return {"handler": handler, "kwargs": {"charge_id": charge_id}, "description": ""}


def append_orphan(wal: FileWAL, saga_id: str, handler: str, charge_id: str | None = None) -> None:
    """One committed COMPENSABLE step of a saga whose owner is gone, appended to an open
    log (``charge_id``, default the saga id, is what its compensation ``handler`` gets)."""
    step = f"{saga_id}/0"
    wal.append("SAGA_STARTED", saga_id, None, {"name": None, "tags": []})
    wal.append("STEP_INTENT", saga_id, step, {"tool": "pay.charge", "semantics": "COMPENSABLE", "policy_args": None,
                                              "idempotency_key": idempotency_key(saga_id, step, "forward")})
    wal.append("STEP_COMMITTED", saga_id, step, {"compensation": desc(charge_id or saga_id, handler)})
    wal.barrier_sync()


def write_orphan(path: Path, saga_id: str, steps: Iterable[tuple[str, ...] | dict[str, Any]], *, lease: float | None = None) -> None:
    """Append one saga's records; each step is a dict:

    ``{"tool", "sem", "state": INTENT|COMMITTED|UNKNOWN|FAILED|STARTED|DONE|SKIPPED|FAILED_COMP,
      "comp": descriptor or None, "args": policy_args}``
    """
    wal = FileWAL(path)
    try:
        wal.append("SAGA_STARTED", saga_id, None, {"name": None, "tags": []})
        if lease is not None:
            wal.append("SAGA_LEASE", saga_id, None, {"lease_seconds": lease})
        for i, raw in enumerate(steps):
            s = dict(raw) if isinstance(raw, dict) else {}
            step = f"{saga_id}/{i}"
            tool, sem, state = s.get("tool", "pay.charge"), s.get("sem", "COMPENSABLE"), s.get("state", "COMMITTED")
            wal.append("STEP_INTENT", saga_id, step, {
                "tool": tool, "semantics": sem, "policy_args": s.get("args"),
                "idempotency_key": idempotency_key(saga_id, step, "forward"),
            })
            if state == "INTENT":
                continue
            if state == "FAILED":
                wal.append("STEP_FAILED", saga_id, step, {"tool": tool, "error_type": "E", "message": "no"})
                continue
            if state == "UNKNOWN":
                wal.append("STEP_UNKNOWN", saga_id, step, {"tool": tool, "error_type": "Expired", "message": "t"})
                continue
            wal.append("STEP_COMMITTED", saga_id, step, {"compensation": s.get("comp")})
            base = {"tool": tool, "semantics": sem, "outcome_unknown": False}
            if state in ("STARTED", "DONE", "FAILED_COMP"):
                wal.append("COMPENSATION_STARTED", saga_id, step, {
                    **base, "compensation": s.get("comp"),
                    "idempotency_key": idempotency_key(saga_id, step, "compensate"),
                })
            if state == "DONE":
                wal.append("COMPENSATION_DONE", saga_id, step, base)
            if state == "FAILED_COMP":
                wal.append("COMPENSATION_FAILED", saga_id, step, {**base, "error_type": "E", "message": "boom"})
            if state == "SKIPPED":
                wal.append("COMPENSATION_SKIPPED", saga_id, step, {**base, "outcome": "NOTHING_TO_UNDO", "reason": "r"})
        wal.barrier_sync()
    finally:
        wal.close()


def records(path: Path) -> list[Any]:
    return wal_records(path, damaged="keep")


def status(path: Path, saga_id: str) -> str:
    return fold(records(path))[saga_id].status


def key(saga_id: str, step: int) -> str:
    return idempotency_key(saga_id, f"{saga_id}/{step}", "compensate")
