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

Invariants:
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

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from ..errors import ConfigurationError
from .limits import BudgetLimit, RateLimit
from .scopes import Scope, by_arg, by_tool, combine, global_scope
from .stores.base import LimitSpec
from .subscriptions import confirmed_subscription

__all__ = ["LimitSnapshot", "LimitSource", "RedisLimitSource", "limits_from_documents", "scope_from_name"]

log = logging.getLogger("agent_saga.controls")

DEFAULT_PREFIX = "agentsaga:v1"


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


@runtime_checkable
class LimitSource(Protocol):
    """Where a gate's limit definitions come from when they can change at run time."""

    def snapshot(self) -> LimitSnapshot:
        """The definitions in force now. Must not do I/O (it is on the hot path)."""
        ...

    def describe(self) -> str: ...


class RedisLimitSource:
    """BudgetLimit definitions from the operator's documents, cached and watched (see the
    module doc). ``namespaces``: only limits of these Kubernetes namespaces (default:
    every namespace). Needs ``pip install agent-saga[redis]``."""

    # KEYS[1] the index   KEYS[2] the change counter   KEYS[3] the synced marker
    # ARGV[1] the documents' key prefix ("P:v1:budgetlimit:")   ARGV[2] "1": keep only the
    # namespaces ARGV[3..] ("0": every namespace)
    # One atomic read: {rev or nil, marker fields, ids, documents} (an id whose document
    # is missing is left out). The document keys are derived from the index, as the
    # operator writes them; on a Redis Cluster the "{agentsaga}" prefix puts them all in
    # the index's slot.
    LUA_READ = """
local wanted = nil
if ARGV[2] == '1' then
  wanted = {}
  for i = 3, #ARGV do wanted[ARGV[i]] = true end
end
local ids, docs = {}, {}
for _, id in ipairs(redis.call('SMEMBERS', KEYS[1])) do
  if wanted == nil or wanted[string.match(id, '^[^/]*')] then
    local doc = redis.call('GET', ARGV[1] .. id)
    if doc then
      ids[#ids + 1] = id
      docs[#docs + 1] = doc
    end
  end
end
return {redis.call('GET', KEYS[2]), redis.call('HKEYS', KEYS[3]), ids, docs}
"""
    #: The marker field whose presence vouches for every BudgetLimit document (the
    #: operator sets it only after a full projection; it is their only writer).
    AUTHORITY = "operator"

    def __init__(
        self,
        url: str,
        *,
        namespaces: Collection[str] | None = None,
        prefix: str = DEFAULT_PREFIX,
        heartbeat: float = 1.0,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ConfigurationError("RedisLimitSource needs a redis:// URL")
        if isinstance(namespaces, str):
            raise ConfigurationError(f"namespaces must be a collection of names, not the string {namespaces!r}")
        if not 0 < heartbeat < math.inf:
            raise ConfigurationError(f"heartbeat must be a positive number of seconds, got {heartbeat!r}")
        from ..wal.urls import Scrubber, secrets_in

        self.url = url
        self.prefix = prefix
        self.namespaces = None if namespaces is None else frozenset(namespaces)
        self.heartbeat = float(heartbeat)
        self.index_key = f"{prefix}:budgetlimit:index"
        self.rev_key = f"{prefix}:rev"
        self.synced_key = f"{prefix}:synced"
        self.channel = f"{prefix}:events"
        self._socket_timeout = socket_timeout
        self._connect_timeout = connect_timeout
        self._scrub = Scrubber(secrets_in(url))
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._snapshot = LimitSnapshot(0, usable=False, problem=f"{self.describe()} has not been read yet")
        self._rev: Any = None
        self.reloads = 0
        self.last_error: str | None = None
        #: Writer fields of the synced marker seen by this process (never shrinks).
        self.writers_seen: frozenset[str] = frozenset()
        #: Why the last known definitions are kept, while the plane has lost its data.
        self.data_lost: str | None = None

    def describe(self) -> str:
        from ..wal.urls import redact

        return f"RedisLimitSource({redact(self.url)})"

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
        if self._thread is None:
            self.start()
        return self._snapshot

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Read the definitions now (blocking) and start the watcher (idempotent). A
        failed first read is logged; until a read succeeds the gate refuses everything."""
        with self._start_lock:
            if self._thread is not None:
                return
            self._stop.clear()
            try:
                self.refresh()
            except ConnectionError as exc:
                log.error("%s; until limits can be read, the gate refuses every call", exc)
            thread = threading.Thread(target=self._watch, name="agent-saga-limits", daemon=True)
            self._thread = thread
            thread.start()

    def refresh(self) -> None:
        """Re-read every definition now (blocking). Raises ``ConnectionError``."""
        client = self._new_client()
        try:
            self._load(client)
        finally:
            with contextlib.suppress(Exception):
                client.close()

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 + self._socket_timeout)
        self._thread = None

    def __enter__(self) -> RedisLimitSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading
    def _new_client(self) -> Any:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError("RedisLimitSource needs the redis package: pip install agent-saga[redis]") from exc
        return redis.Redis.from_url(self.url, socket_timeout=self._socket_timeout,
                                    socket_connect_timeout=self._connect_timeout, retry=Retry(NoBackoff(), 0))

    def _read(self, client: Any) -> tuple[Any, frozenset[str], list[tuple[str, Any]]]:
        """``(rev, marker fields, [(id, raw document)])`` in one atomic round trip."""
        args = [f"{self.prefix}:budgetlimit:", "0" if self.namespaces is None else "1",
                *sorted(self.namespaces or ())]
        rev, fields, ids, raws = client.register_script(self.LUA_READ)(
            keys=[self.index_key, self.rev_key, self.synced_key], args=args, client=client)
        writers = frozenset(f.decode() if isinstance(f, bytes) else str(f) for f in fields or ())
        docs = sorted(zip((i.decode() if isinstance(i, bytes) else str(i) for i in ids or ()), raws or (),
                          strict=True))
        return rev, writers, docs

    def _load(self, client: Any) -> None:
        try:
            rev, writers, docs = self._read(client)
        except Exception as exc:
            self.last_error = self._scrub(f"{type(exc).__name__}: {exc}")
            raise ConnectionError(f"{self.describe()} could not be read ({self.last_error})") from exc
        self._adopt(rev, writers, docs)

    def _adopt(self, rev: Any, writers: frozenset[str], docs: Sequence[tuple[str, Any]]) -> None:
        """Take what was read, unless the marker says the server lost its data."""
        missing = self.writers_seen - writers
        if missing and self.AUTHORITY not in writers:
            self._marker_lost(missing)
            return
        limits: list[BudgetLimit | RateLimit] = []
        problems: list[str] = []
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
        specs = tuple(lim.spec() for lim in limits)
        with self._lock:
            restored, self.data_lost = self.data_lost, None
            self.writers_seen |= writers
            self._rev = rev
            self.last_error = None
            self.reloads += 1
            cur = self._snapshot
            changed = not cur.usable or cur.specs != specs or cur.problems != tuple(problems)
            if changed:
                self._snapshot = LimitSnapshot(cur.version + 1, tuple(limits), specs, True, None, tuple(problems))
        if changed:
            for p in problems:
                log.warning("%s: %s", self.describe(), p)
        if restored is not None:
            log.warning("%s: the policy plane's synced marker is back (%s): the limit definitions in Redis "
                        "are authoritative again (%d limit(s) in force)", self.describe(),
                        ", ".join(sorted(writers)), len(limits))

    def _marker_lost(self, missing: frozenset[str]) -> None:
        """The server answers but a synced-marker field this process saw is gone: it lost
        its data. Keep the last known definitions (never the empty or partial state)."""
        with self._lock:
            first = self.data_lost is None
            self._rev = _NEVER  # re-read on every heartbeat until the marker is back
            self.last_error = None
            self.reloads += 1
            if first:
                self.data_lost = (f"{self.describe()} lost its data: the policy plane's synced marker "
                                  f"({self.synced_key}, writer {', '.join(sorted(missing))}) is gone "
                                  f"(FLUSHALL, or a restart without persistence); the last known limit "
                                  f"definitions stay in force until the plane is re-projected")
            n = len(self._snapshot.limits)
        if first:
            log.warning("%s: the policy plane lost its data (synced marker %s gone, writer %s); an empty or "
                        "partial index is not read as 'no limits': the last %d known limit definition(s) stay "
                        "in force until the operator re-projects them and sets its synced marker again. Spend "
                        "windows kept in a Redis without persistence restarted empty.",
                        self.describe(), self.synced_key, ", ".join(sorted(missing)), n)

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                # subscribed (and confirmed) before reading: no change is missed
                with confirmed_subscription(
                    self._new_client, self.channel, self._stop, max(self._socket_timeout, 1.0)
                ) as (client, pubsub):
                    self._load(client)
                    next_check = time.monotonic() + self.heartbeat
                    while not self._stop.is_set():
                        msg = pubsub.get_message(timeout=max(0.0, min(0.5, next_check - time.monotonic())))
                        if msg is not None and msg.get("type") == "message" and _about_limits(msg.get("data")):
                            self._load(client)
                        if time.monotonic() >= next_check:
                            if self._rev is _NEVER or client.get(self.rev_key) != self._rev:
                                self._load(client)
                            next_check = time.monotonic() + self.heartbeat
            except Exception as exc:  # noqa: BLE001 - any failure: keep the last definitions, reconnect
                if not self._stop.is_set():
                    self.last_error = self._scrub(f"{type(exc).__name__}: {exc}")
            self._stop.wait(min(self.heartbeat, 0.5))


#: A ``rev`` no server holds: while the plane has lost its data, every heartbeat re-reads.
_NEVER: Any = object()


def _about_limits(data: Any) -> bool:
    """Does a change notification concern limits (or the synced marker)? (Unreadable
    ones are assumed to.)"""
    try:
        doc = json.loads(data)
        kind = doc.get("kind") if isinstance(doc, dict) else None
    except (ValueError, TypeError):
        return True
    return not isinstance(kind, str) or kind.replace("-", "").replace("_", "").lower() in ("budgetlimit", "policyplane")
