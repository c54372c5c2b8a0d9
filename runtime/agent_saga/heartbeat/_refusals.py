"""What this process's gate refused, or held for a human, because of a policy-plane document.

    note_refusal(AppliedRef("agent-saga/per-customer", uid, 3), "refused",
                 tool="payments.charge", saga="saga-8f3c", by="limit:agent-saga.per-customer")

The gate notes each refusal a BudgetLimit or a SagaPolicy decided and each question to a
human one of them asked (``PreFlightGate``); the heartbeat carries the counts
(``Heartbeat.refusals``) and the operator adds them up, over the agents, into the
object's ``status.refusals`` (docs/crds.md, "What a BudgetLimit or SagaPolicy refused").

Invariants:
- Only what happened is counted: a BLOCK verdict the document decided, or a question to a
  human it asked (counted when asked, whatever the human answers). A call the document
  allowed, or one another control refused first, is not counted.
- Counts are per process and only grow; they are kept per document ``uid`` (a document
  deleted and created again under the same name starts at zero).
- No argument value and no reason text: the last refusal names the tool, the saga, the
  limit or rule, and when.
- At most ``MAX_DOCUMENTS`` documents are kept (the least recently noted is dropped).
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Literal

from ._model import AppliedRef, RefusalCount

__all__ = ["MAX_DOCUMENTS", "RefusalCount", "RefusalLedger", "note_refusal", "refusal_ledger"]

MAX_DOCUMENTS = 256
Outcome = Literal["refused", "held"]


class RefusalLedger:
    """The counts of one process (thread-safe; see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: OrderedDict[str, RefusalCount] = OrderedDict()

    def note(self, ref: AppliedRef, outcome: Outcome, *, tool: str, saga: str, by: str,
             at: float | None = None) -> None:
        """Count one refusal (``refused``) or question to a human (``held``) of ``ref``."""
        if not ref.uid:
            return  # not a resource (a file, a test's in-process policy): nobody's status
        last = {"outcome": outcome, "tool": tool, "saga": saga, "by": by,
                "at": round(time.time() if at is None else at, 3)}
        with self._lock:
            cur = self._counts.pop(ref.uid, None) or RefusalCount(ref.id, ref.uid)
            self._counts[ref.uid] = RefusalCount(
                ref.id, ref.uid, cur.refused + (outcome == "refused"), cur.held + (outcome == "held"), last)
            while len(self._counts) > MAX_DOCUMENTS:
                self._counts.popitem(last=False)

    def snapshot(self) -> tuple[RefusalCount, ...]:
        """Every document's counts, sorted by id."""
        with self._lock:
            return tuple(sorted(self._counts.values(), key=lambda c: (c.id, c.uid)))

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()


_LEDGER = RefusalLedger()


def refusal_ledger() -> RefusalLedger:
    """The process-wide ledger (what the heartbeat reports)."""
    return _LEDGER


def note_refusal(ref: AppliedRef, outcome: Outcome, *, tool: str, saga: str, by: str) -> None:
    """Count in the process-wide ledger (``RefusalLedger.note``)."""
    _LEDGER.note(ref, outcome, tool=tool, saga=saga, by=by)
