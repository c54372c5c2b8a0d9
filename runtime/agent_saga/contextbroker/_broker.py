"""``ContextBroker``: what a model may see, tiered, receipted, and recorded when served.

    broker = ContextBroker(budget_tokens=6000)
    broker.add_file("docs/refund-policy.md")                       # HOT: served verbatim
    broker.add("ticket-4711", lambda: tickets.read(4711), tier=Tier.COLD)
    broker.summarize("refunds-summary", "Refunds within 30 days ...",
                     sources=["docs/refund-policy.md", "ticket-4711"])  # WARM, with receipts
    served = broker.serve()                                         # re-verified, recorded
    request = ModelRequest(served.messages + (Message("user", question),))
    router.complete(request, context=served)

Tiers:
    HOT    served verbatim on every call, first (never dropped for the budget)
    WARM   served while the budget allows, in the order added (summaries by default)
    COLD   kept, receipted, not served unless ``serve(recall=[...])`` names it

Invariants:
- Every source is captured with its SHA-256 (its receipt) and a way to read it again.
  Every summary carries the receipts of the sources it summarises, taken when it was made.
- Serving re-reads every source it is about to serve or that a served summary cites; a
  source whose content no longer hashes to its receipt has drifted: it is evicted (with
  every summary citing it), recorded (``CONTEXT_EVICTED``), and never served. A source that
  cannot be read any more counts as drifted.
- What was served is recorded (``CONTEXT_SERVED``): every item's id, tier, SHA-256 and,
  for a summary, its receipts; the record's ``served`` id is what ``Router.complete(...,
  context=served)`` puts in the routing decision, so "what exactly did the model see" is
  answered from the log alone. Contents are not recorded, only their digests.
"""

from __future__ import annotations

import enum
import hashlib
import itertools
import logging
import os
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..chain import RESERVED_SAGA
from ..context import current_saga_id
from ..errors import ConfigurationError, SagaError
from ..records import ExtensionType
from ..routing import Message, estimate_tokens
from ..wal.base import BaseWAL
from ..wal.default import DEFAULT_WAL

__all__ = ["SERVED", "EVICTED", "ContextBroker", "ContextItem", "DriftedSource", "Eviction", "Receipt",
           "ServedContext", "Tier"]

log = logging.getLogger("agent_saga.contextbroker")

SERVED = ExtensionType.CONTEXT_SERVED.value
EVICTED = ExtensionType.CONTEXT_EVICTED.value

Reader = Callable[[], str | bytes]

_PROCESS = os.urandom(5).hex()
_SEQ = itertools.count(1)


class Tier(enum.StrEnum):
    """How close to the prompt an item is kept (see the module doc)."""

    HOT = "HOT"
    WARM = "WARM"
    COLD = "COLD"


class DriftedSource(SagaError):
    """A summary was asked for over a source whose content no longer matches its receipt."""


@dataclass(frozen=True, slots=True)
class Receipt:
    """Proof of what a source held: its id and the SHA-256 of its content."""

    source: str
    sha256: str

    def to_doc(self) -> dict[str, str]:
        """The receipt as JSON."""
        return {"source": self.source, "sha256": self.sha256}


def _digest(content: str | bytes) -> str:
    return hashlib.sha256(content.encode() if isinstance(content, str) else content).hexdigest()


def _text(content: str | bytes) -> str:
    return content if isinstance(content, str) else content.decode("utf-8", errors="replace")


@dataclass(frozen=True, slots=True)
class ContextItem:
    """A source (``receipts`` empty, ``read`` set) or a summary (``receipts`` into its
    sources) held by the broker, with its tier and the SHA-256 of its text."""

    id: str
    text: str
    sha256: str
    tier: Tier
    receipts: tuple[Receipt, ...] = ()
    read: Reader | None = None

    @property
    def is_summary(self) -> bool:
        """True for a summary."""
        return self.read is None

    def to_doc(self) -> dict[str, Any]:
        """The item as recorded (never its text)."""
        doc: dict[str, Any] = {"id": self.id, "kind": "summary" if self.is_summary else "source",
                               "tier": self.tier.value, "sha256": self.sha256}
        if self.is_summary:
            doc["receipts"] = [r.to_doc() for r in self.receipts]
        return doc


@dataclass(frozen=True, slots=True)
class Eviction:
    """A drifted source and what left with it."""

    source: str
    expected: str
    found: str | None
    summaries: tuple[str, ...]

    def to_doc(self) -> dict[str, Any]:
        """The eviction as recorded."""
        return {"source": self.source, "expected": self.expected, "found": self.found,
                "summaries": list(self.summaries)}


def _message(item: ContextItem) -> Message:
    what = "summary" if item.is_summary else "source"
    cites = "".join(f" {r.source}@{r.sha256[:12]}" for r in item.receipts)
    head = f"[{what} {item.id} sha256:{item.sha256[:12]}" + (f" cites{cites}" if cites else "") + "]"
    return Message("system", f"{head}\n{item.text}")


@dataclass(frozen=True, slots=True)
class ServedContext:
    """What one ``serve`` handed out: the items, as messages, and their receipts.

    ``id``: the ``served`` id of the ``CONTEXT_SERVED`` record. ``left_out``: ids not
    served for the budget. ``evicted``: the drifted sources found while serving.
    """

    id: str
    items: tuple[ContextItem, ...]
    evicted: tuple[Eviction, ...] = ()
    left_out: tuple[str, ...] = ()

    @property
    def messages(self) -> tuple[Message, ...]:
        """One system ``Message`` per item, headed by its id and SHA-256 (HOT first)."""
        return tuple(_message(i) for i in self.items)

    @property
    def receipts(self) -> tuple[Receipt, ...]:
        """A receipt for every item served and every source a served summary cites."""
        out: dict[tuple[str, str], Receipt] = {}
        for i in self.items:
            for r in (Receipt(i.id, i.sha256), *i.receipts):
                out.setdefault((r.source, r.sha256), r)
        return tuple(out.values())

    def to_doc(self) -> dict[str, Any]:
        """The record's payload."""
        return {"served": self.id, "items": [i.to_doc() for i in self.items],
                "evicted": [e.to_doc() for e in self.evicted], "left_out": list(self.left_out)}


class ContextBroker:
    """Tiered, receipted context for model calls (see the module doc).

    ``wal``: where serving and evictions are recorded (default: the process-wide WAL;
    ``None`` records nothing, for tests only). ``budget_tokens``: the most a ``serve`` may
    hand out (``None``: no limit); ``count_tokens``: text -> tokens (default: the
    router's estimate).
    """

    def __init__(self, *, wal: BaseWAL | None = DEFAULT_WAL, budget_tokens: int | None = None,
                 count_tokens: Callable[[str], int] | None = None) -> None:
        if wal is not None and not isinstance(wal, BaseWAL):
            raise ConfigurationError(f"wal must be a BaseWAL (or None), got {wal!r}")
        if budget_tokens is not None and (isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int)
                                          or budget_tokens < 1):
            raise ConfigurationError(f"budget_tokens must be a positive integer or None, got {budget_tokens!r}")
        self._wal = wal
        self.budget_tokens = budget_tokens
        self._count = count_tokens or estimate_tokens
        self._items: dict[str, ContextItem] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ holding
    def add(self, source_id: str, read: Reader, *, tier: Tier | str = Tier.HOT) -> Receipt:
        """Capture the source ``source_id`` now (``read()`` returns its content; it is
        called again on every serve to check the content has not drifted). Replaces a
        source of the same id and evicts the summaries citing the old content."""
        if not isinstance(source_id, str) or not source_id:
            raise ConfigurationError(f"a context source needs an id, got {source_id!r}")
        if not callable(read):
            raise ConfigurationError(f"source {source_id}: read must be callable() -> str | bytes (how to read it "
                                     f"again), got {read!r}")
        content = read()
        if not isinstance(content, str | bytes):
            raise ConfigurationError(f"source {source_id}: read() must return str or bytes, got "
                                     f"{type(content).__name__}")
        item = ContextItem(source_id, _text(content), _digest(content), Tier(tier), read=read)
        with self._lock:
            old = self._items.get(source_id)
            self._items[source_id] = item
        if old is not None and old.sha256 != item.sha256:
            self._evict([Eviction(source_id, old.sha256, item.sha256, self._citing(source_id, old.sha256))],
                        record=False)
        return Receipt(source_id, item.sha256)

    def add_file(self, path: str | Path, *, tier: Tier | str = Tier.HOT, id: str | None = None) -> Receipt:
        """``add`` for a file (its id defaults to the path as given)."""
        p = Path(path)
        return self.add(id or str(path), p.read_bytes, tier=tier)

    def add_text(self, source_id: str, text: str, *, tier: Tier | str = Tier.HOT) -> Receipt:
        """``add`` for a fixed text (it cannot drift: it is its own source)."""
        return self.add(source_id, lambda: text, tier=tier)

    def summarize(self, summary_id: str, text: str | Callable[[Sequence[ContextItem]], str],
                  sources: Iterable[str], *, tier: Tier | str = Tier.WARM) -> ContextItem:
        """Hold a summary of ``sources`` (``text``, or ``text(items)`` computing it from the
        sources' current items) with their receipts. Raises ``DriftedSource`` (and evicts)
        when a source drifted, ``KeyError`` naming an unknown source."""
        ids = list(sources)
        if not ids:
            raise ConfigurationError(f"summary {summary_id}: name the sources it summarises (its receipts)")
        items = []
        for sid in ids:
            item = self._items.get(sid)
            if item is None or item.is_summary:
                raise KeyError(f"summary {summary_id}: {sid!r} is not a source held by this broker")
            items.append(item)
        drifted = self._check(items)
        if drifted:
            self._evict(drifted)
            raise DriftedSource(f"summary {summary_id} was not made: {', '.join(e.source for e in drifted)} drifted "
                                f"from its receipt and was evicted; add it again to summarise its new content")
        body = text(items) if callable(text) else text
        if not isinstance(body, str):
            raise ConfigurationError(f"summary {summary_id}: the text must be a string, got {type(body).__name__}")
        summary = ContextItem(summary_id, body, _digest(body), Tier(tier),
                              tuple(Receipt(i.id, i.sha256) for i in items))
        with self._lock:
            self._items[summary_id] = summary
        return summary

    def set_tier(self, item_id: str, tier: Tier | str) -> None:
        """Move an item to another tier (``KeyError`` if it is not held)."""
        with self._lock:
            item = self._items[item_id]
            self._items[item_id] = ContextItem(item.id, item.text, item.sha256, Tier(tier), item.receipts, item.read)

    def items(self) -> tuple[ContextItem, ...]:
        """Every item held, in the order added."""
        return self._snapshot()

    def _snapshot(self) -> tuple[ContextItem, ...]:
        with self._lock:
            return tuple(self._items.values())

    def __contains__(self, item_id: object) -> bool:
        return item_id in self._items

    # ------------------------------------------------------------------ serving
    def serve(self, *, recall: Iterable[str] = ()) -> ServedContext:
        """The context for one call: HOT items, then WARM ones while the budget allows,
        then the COLD ones named in ``recall``; every source re-verified first (drifted
        ones evicted, never served) and the serving recorded (``CONTEXT_SERVED``)."""
        recall = set(recall)
        held = self._snapshot()
        unknown = recall - {i.id for i in held}
        if unknown:
            raise KeyError(f"recall names {', '.join(sorted(unknown))}, which this broker does not hold")
        wanted = [i for i in held if i.tier != Tier.COLD or i.id in recall]
        cited = {r.source for i in wanted for r in i.receipts}
        to_check = [i for i in held if not i.is_summary and (i in wanted or i.id in cited)]
        drifted = self._check(to_check)
        gone: set[str] = set()
        if drifted:
            gone = self._evict(drifted)
        wanted = [i for i in wanted if i.id not in gone]
        order = {Tier.HOT: 0, Tier.WARM: 1, Tier.COLD: 2}
        wanted.sort(key=lambda i: order[i.tier])
        served, left_out, used = [], [], 0
        for i in wanted:
            cost = self._count(i.text)
            if self.budget_tokens is not None and i.tier != Tier.HOT and used + cost > self.budget_tokens:
                left_out.append(i.id)
                continue
            used += cost
            served.append(i)
        out = ServedContext(f"ctx-{_PROCESS}{next(_SEQ):06x}", tuple(served), tuple(drifted), tuple(left_out))
        self._append(SERVED, {**out.to_doc(), "tokens": used, "saga": current_saga_id()})
        return out

    def verify(self) -> tuple[Eviction, ...]:
        """Re-read every source now; evict (and record) the drifted ones."""
        drifted = self._check([i for i in self._snapshot() if not i.is_summary])
        if drifted:
            self._evict(drifted)
        return tuple(drifted)

    # ------------------------------------------------------------------ internals
    def _check(self, sources: Sequence[ContextItem]) -> list[Eviction]:
        out = []
        for s in sources:
            assert s.read is not None
            try:
                found: str | None = _digest(s.read())
            except Exception as exc:  # noqa: BLE001 - a source that cannot be read cannot be vouched for
                log.warning("context source %s cannot be read (%s: %s): treated as drifted", s.id,
                            type(exc).__name__, exc)
                found = None
            if found != s.sha256:
                out.append(Eviction(s.id, s.sha256, found, self._citing(s.id, s.sha256)))
        return out

    def _citing(self, source: str, sha: str) -> tuple[str, ...]:
        return tuple(i.id for i in self._snapshot() if Receipt(source, sha) in i.receipts)

    def _evict(self, evictions: Sequence[Eviction], *, record: bool = True) -> set[str]:
        gone: set[str] = set()
        with self._lock:
            for e in evictions:
                item = self._items.get(e.source)
                if record and item is not None and item.sha256 == e.expected:
                    del self._items[e.source]
                    gone.add(e.source)
                for sid in e.summaries:
                    if self._items.pop(sid, None) is not None:
                        gone.add(sid)
        for e in evictions:
            log.warning("context source %s drifted from its receipt (sha256 %s, now %s): evicted with %s",
                        e.source, e.expected[:12], (e.found or "unreadable")[:12],
                        ", ".join(e.summaries) or "no summary")
            self._append(EVICTED, {**e.to_doc(), "replaced": not record, "saga": current_saga_id()})
        return gone

    def _append(self, type_: str, payload: dict[str, Any]) -> None:
        if self._wal is None:
            return
        try:
            self._wal.append(type_, RESERVED_SAGA, None, payload)
        except Exception:
            log.error("context broker: %s could not be recorded in the WAL", type_)
            raise
