"""Limit definitions that live in the policy plane: ``RedisLimitSource``.

``PreFlightGate(limits=RedisLimitSource(url, namespaces=["payments"]))`` enforces the
``BudgetLimit`` resources the operator projected (docs/policy-plane.md, "BudgetLimit"),
and follows edits made with kubectl while the agent runs::

    P:v1:budgetlimit:index           SET     "<ns>/<name>" of every limit document
    P:v1:budgetlimit:<ns>/<name>     STRING  {"rev", "v": 1, ..., "limit": <LimitSpec doc>}
    P:v1:rev                         STRING  change counter
    P:v1:events                      channel {"kind": "BudgetLimit", "op": "put"|"delete", ...}
    P:v1:synced                      HASH    the synced marker: one field per writer

``limits_from_documents`` and ``scope_from_name`` are the one parser of those documents:
the operator imports them from here (agents do not install the operator).

Invariants (the watching, the atomic read and the marker are the policy-plane reader's,
``agent_saga.controls._policyplane``):
- The hot path (``snapshot``) reads one attribute: no I/O, no lock. Definitions are
  cached; a watcher thread subscribes to the change channel BEFORE it reads (nothing is
  missed between the two), reloads on every BudgetLimit notification, and compares
  ``rev`` every ``heartbeat`` seconds anyway (pub/sub is at-most-once).
- Fail closed: until the definitions have been read once, ``snapshot`` is unusable and
  the gate refuses every call. Once read, a lost Redis keeps the last definitions (the
  windows live in Redis too, so debits fail closed on their own).
- Data loss is not "no limits": every read takes the index, the documents, ``rev`` and
  the synced marker's fields in one Lua script (atomic). A marker field this process
  has seen that is now missing means the server lost its data (FLUSHALL, a restart
  without persistence): the last known definitions stay in force (``data_lost``) until
  the plane is authoritative again — every field seen is back, or the ``operator``
  field is (the operator is the only writer of BudgetLimit documents and sets it only
  after re-projecting every resource). A source that has never seen a field takes what
  it finds: an empty plane without a marker is a fresh installation, with no limits.
- A document this version cannot read is skipped and reported (``problems``), never
  guessed at; a document of an unknown ``v`` is skipped (written by a newer operator).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ...errors import ConfigurationError
from .._policyplane import PolicyPlaneReader, about_kind
from ._model import BudgetLimit, LimitSpec, RateLimit
from ._scopes import Scope, by_arg, by_tool, combine, global_scope
from ._store import LimitStoreUnavailable

__all__ = ["LimitSnapshot", "LimitSource", "RedisLimitSource", "limits_from_documents", "scope_from_name"]

log = logging.getLogger("agent_saga.controls")


def scope_from_name(name: str) -> Scope:
    """The runtime scope a ``LimitSpec.scope`` names: ``global``, ``tool``, ``arg:x``,
    and ``+``-joined combinations (``tool+arg:customer_id``). Raises ``ValueError``."""
    if name == "global":
        return global_scope
    parts: list[Scope] = []
    for part in name.split("+"):
        if part == "tool":
            parts.append(by_tool)
        elif part.startswith("arg:") and len(part) > 4:
            parts.append(by_arg(part[4:]))
        else:
            raise ValueError(f"limit scope {name!r} is not global, tool, arg:<name> or a '+' combination")
    return combine(*parts)


def limit_from_spec(spec: LimitSpec) -> BudgetLimit | RateLimit:
    """The runtime limit a ``LimitSpec`` describes (raises ``ValueError`` /
    ``ConfigurationError`` naming what is wrong)."""
    scope = scope_from_name(spec.scope)
    if spec.kind == "budget":
        if spec.arg is None:
            raise ValueError(f"budget limit {spec.name!r} has no arg")
        return BudgetLimit(spec.name, arg=spec.arg, max_total=spec.max_total, window=spec.window,
                           scope=scope, escalate_to_human=spec.escalate_to_human, tools=spec.tools)
    return RateLimit(spec.name, max_calls=int(spec.max_total), window=spec.window, scope=scope, tools=spec.tools)


def limits_from_documents(docs: Sequence[dict[str, Any]]) -> list[BudgetLimit | RateLimit]:
    """The runtime limits the BudgetLimit documents define (in document order). Raises
    ``ValueError`` / ``ConfigurationError`` / ``KeyError`` on an unreadable document."""
    return [limit_from_spec(LimitSpec.from_doc(doc["limit"])) for doc in docs]


@dataclass(frozen=True, slots=True)
class LimitSnapshot:
    """The definitions in force: ``limits`` and their ``specs``; ``version`` changes
    whenever they do. ``usable`` False (never read): the gate refuses, saying ``problem``."""

    version: int
    limits: tuple[BudgetLimit | RateLimit, ...] = ()
    specs: tuple[LimitSpec, ...] = ()
    usable: bool = True
    problem: str | None = None
    problems: tuple[str, ...] = ()
    #: ``(id, uid, generation)`` of the BudgetLimit document each limit came from.
    documents: tuple[tuple[str, str, int], ...] = ()


@runtime_checkable
class LimitSource(Protocol):
    """Where a gate's limit definitions come from when they can change at run time."""

    def snapshot(self) -> LimitSnapshot:
        """The definitions in force now. Must not do I/O (it is on the hot path)."""
        ...

    def describe(self) -> str:
        """A name for messages (never a password)."""


class RedisLimitSource(PolicyPlaneReader):
    """BudgetLimit definitions from the operator's documents, cached and watched (see the
    module doc). ``namespaces``: only limits of these Kubernetes namespaces (default:
    every namespace). Needs ``pip install agent-saga[redis]``. ``refresh`` raises
    ``LimitStoreUnavailable``."""

    NAME = "RedisLimitSource"
    KIND = "BudgetLimit"
    SLUG = "budgetlimit"
    UNAVAILABLE = LimitStoreUnavailable
    #: The marker field whose presence vouches for every BudgetLimit document (the
    #: operator sets it only after a full projection; it is their only writer).
    AUTHORITY = "operator"
    THREAD_NAME = "agent-saga-limits"
    UNREAD = "the gate refuses every call"
    DATA_LOST_SUFFIX = "; the last known limit definitions stay in force until the plane is re-projected"

    def _initial_state(self) -> None:
        self._snapshot = LimitSnapshot(0, usable=False, problem=f"{self.describe()} has not been read yet")

    def __repr__(self) -> str:
        return self.describe()

    def status(self) -> dict[str, Any]:
        """The source's state for ``PreFlightGate.status()`` (JSON). ``data_lost``: the
        policy plane lost its data and the last known definitions are kept."""
        snap = self._snapshot
        return {
            "source": self.describe(),
            "usable": snap.usable,
            "problem": snap.problem,
            "version": snap.version,
            "limits": [lim.name for lim in snap.limits],
            "problems": list(snap.problems),
            "reloads": self.reloads,
            "last_error": self.last_error,
            "writers_seen": sorted(self.writers_seen),
            "data_lost": self.data_lost is not None,
            "data_lost_reason": self.data_lost,
        }

    # ------------------------------------------------------------------ hot path
    def snapshot(self) -> LimitSnapshot:
        """The definitions in force now (no I/O; starts the watcher on first use)."""
        if not self.running:
            self.start()
        return self._snapshot

    # ------------------------------------------------------------------ reader hooks
    def _apply(self, docs: Sequence[tuple[str, Any]]) -> None:
        limits: list[BudgetLimit | RateLimit] = []
        problems: list[str] = []
        refs: list[tuple[str, str, int]] = []
        seen: set[str] = set()
        for id_, raw in docs:
            try:
                doc = json.loads(raw)
                if doc.get("v") != 1:
                    problems.append(f"{id_}: document v={doc.get('v')!r} is not supported (skipped)")
                    continue
                (lim,) = limits_from_documents([doc])
            except (ValueError, KeyError, TypeError, AttributeError, ConfigurationError) as exc:
                problems.append(f"{id_}: unreadable limit ({exc}) (skipped)")
                continue
            if lim.name in seen:
                problems.append(f"{id_}: a second limit named {lim.name!r} (skipped)")
                continue
            seen.add(lim.name)
            limits.append(lim)
            refs.append((id_, str(doc.get("uid") or ""), int(doc.get("generation") or 0)))
        specs = tuple(lim.spec() for lim in limits)
        with self._lock:
            self.last_error = None
            cur = self._snapshot
            changed = (not cur.usable or cur.specs != specs or cur.problems != tuple(problems)
                       or cur.documents != tuple(refs))
            if changed:
                self._snapshot = LimitSnapshot(cur.version + 1, tuple(limits), specs, True, None, tuple(problems),
                                               tuple(refs))
        if changed:
            for p in problems:
                log.warning("%s: %s", self.describe(), p)

    def _on_restored(self, writers: frozenset[str]) -> None:
        log.warning("%s: the policy plane's synced marker is back (%s): the limit definitions in Redis "
                    "are authoritative again (%d limit(s) in force)", self.describe(),
                    ", ".join(sorted(writers)), len(self._snapshot.limits))

    def _on_data_lost(self, missing: frozenset[str], first: bool) -> None:
        """Keep the last known definitions (never the empty or partial state)."""
        self.last_error = None
        if first:
            log.warning("%s; an empty, partial or old index is not read as the limits in force: the last %d known "
                        "limit definition(s) stay in force until the operator re-projects them and sets its synced "
                        "marker again. Spend windows kept in a Redis without persistence restarted empty.",
                        self.data_lost, len(self._snapshot.limits))


def _about_limits(data: Any) -> bool:
    """Does a change notification concern limits (or the synced marker)? (Unreadable
    ones are assumed to.)"""
    return about_kind(RedisLimitSource.KIND, data)
