"""What each BudgetLimit and SagaPolicy refused, or held for a human, added up over the agents.

Every agent process counts, in its heartbeat (``Heartbeat.refusals``), the calls its gate
refused because of a document and the questions to a human a document asked, with the
tool, saga and limit or rule of the last one. ``RefusalBook`` keeps each process's latest
counts per document ``uid`` and adds them up into ``status.refusals``:

    refused        calls refused (BLOCK) because of it
    heldForHuman   calls it sent to a human (whatever the human answered)
    last           the latest of them: outcome, tool, saga, limit or rule, agent@pod, time

Invariants:
- Only counts an agent reported: nothing is inferred, estimated or carried over from an
  earlier object of the same name (counts are per uid).
- A process that stopped (its heartbeat gone: deleted, crashed, scaled down) still counts
  with the last numbers it reported, while this operator runs; a process seen again
  replaces its own numbers (a process's counts only grow), so nothing is counted twice.
  An operator that restarts counts what the live agents report from then on.
- Bounded: at most ``MAX_PROCESSES`` processes per document are kept apart; the oldest
  are folded into one sum, and at most ``MAX_DOCUMENTS`` documents are kept.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from agent_saga.heartbeat import Heartbeat, RefusalCount

from .conditions import rfc3339

__all__ = ["MAX_DOCUMENTS", "MAX_PROCESSES", "RefusalBook", "RefusalTotal"]

MAX_PROCESSES = 512
MAX_DOCUMENTS = 1024


@dataclass(frozen=True, slots=True)
class RefusalTotal:
    """The sum over processes for one document, and the latest refusal (with its agent)."""

    refused: int = 0
    held: int = 0
    last: Mapping[str, Any] | None = None

    def plus(self, c: RefusalCount, agent: str) -> RefusalTotal:
        """This total with one process's counts (``agent``: how status names it) added."""
        last = self.last
        if c.last is not None and (last is None or float(c.last.get("at") or 0) >= float(last.get("at") or 0)):
            last = {**c.last, "agent": agent}
        return RefusalTotal(self.refused + c.refused, self.held + c.held, last)

    def to_status(self) -> dict[str, Any]:
        """The ``status.refusals`` block."""
        out: dict[str, Any] = {"refused": self.refused, "heldForHuman": self.held}
        if self.last is not None:
            last = self.last
            at = datetime.fromtimestamp(float(last.get("at") or 0), UTC)
            out["last"] = {"outcome": "Refused" if last.get("outcome") == "refused" else "HeldForHuman",
                           "tool": str(last.get("tool", ""))[:253], "saga": str(last.get("saga", ""))[:253],
                           "by": str(last.get("by", ""))[:253], "agent": str(last.get("agent", ""))[:253],
                           "at": rfc3339(at)}
        return out


class RefusalBook:
    """Each process's latest counts per document uid (see the module doc)."""

    def __init__(self) -> None:
        self._seen: OrderedDict[str, OrderedDict[str, tuple[RefusalCount, str]]] = OrderedDict()
        self._folded: dict[str, RefusalTotal] = {}

    def fold(self, beats: Iterable[Heartbeat]) -> dict[str, RefusalTotal]:
        """Take the counts of ``beats`` in; return the totals per document uid."""
        for b in beats:
            for c in b.refusals or ():
                per = self._seen.setdefault(c.uid, OrderedDict())
                self._seen.move_to_end(c.uid)
                per.pop(b.id, None)
                per[b.id] = (c, b.label)
                while len(per) > MAX_PROCESSES:
                    _, (old, agent) = per.popitem(last=False)
                    self._folded[c.uid] = self._folded.get(c.uid, RefusalTotal()).plus(old, agent)
        while len(self._seen) > MAX_DOCUMENTS:
            uid, _ = self._seen.popitem(last=False)
            self._folded.pop(uid, None)
        totals: dict[str, RefusalTotal] = {}
        for uid, per in self._seen.items():
            total = self._folded.get(uid, RefusalTotal())
            for c, agent in per.values():
                total = total.plus(c, agent)
            totals[uid] = total
        return totals
