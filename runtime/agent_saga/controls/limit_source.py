"""Limit definitions that live in the policy plane: ``RedisLimitSource``.

``PreFlightGate(limits=RedisLimitSource(url, namespaces=["payments"]))`` enforces the
``BudgetLimit`` resources the operator projected (docs/policy-plane.md, "BudgetLimit"),
and follows edits made with kubectl while the agent runs::

    P:v1:budgetlimit:index           SET     "<ns>/<name>" of every limit document
    P:v1:budgetlimit:<ns>/<name>     STRING  {"rev", "v": 1, ..., "limit": <LimitSpec doc>}
    P:v1:rev                         STRING  change counter
    P:v1:events                      channel {"kind": "BudgetLimit", "op": "put"|"delete", ...}

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

    def describe(self) -> str:
        from ..wal.urls import redact

        return f"RedisLimitSource({redact(self.url)})"

    def __repr__(self) -> str:
        return self.describe()

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

    def _load(self, client: Any) -> None:
        try:
            rev = client.get(self.rev_key)
            ids = sorted(i.decode() if isinstance(i, bytes) else str(i) for i in client.smembers(self.index_key))
            if self.namespaces is not None:
                ids = [i for i in ids if i.partition("/")[0] in self.namespaces]
            raws = client.mget([f"{self.prefix}:budgetlimit:{i}" for i in ids]) if ids else []
        except Exception as exc:
            self.last_error = self._scrub(f"{type(exc).__name__}: {exc}")
            raise ConnectionError(f"{self.describe()} could not be read ({self.last_error})") from exc
        limits: list[BudgetLimit | RateLimit] = []
        problems: list[str] = []
        seen: set[str] = set()
        for id_, raw in zip(ids, raws, strict=True):
            if raw is None:
                continue  # deleted between SMEMBERS and MGET
            try:
                doc = json.loads(raw)
                if doc.get("v") != 1:
                    problems.append(f"{id_}: document v={doc.get('v')!r} is not supported (skipped)")
                    continue
                (lim,) = limits_from_documents([doc])
            except (ValueError, KeyError, TypeError, ConfigurationError) as exc:
                problems.append(f"{id_}: unreadable limit ({exc}) (skipped)")
                continue
            if lim.name in seen:
                problems.append(f"{id_}: a second limit named {lim.name!r} (skipped)")
                continue
            seen.add(lim.name)
            limits.append(lim)
        specs = tuple(lim.spec() for lim in limits)
        with self._lock:
            self._rev = rev
            self.last_error = None
            self.reloads += 1
            cur = self._snapshot
            if not cur.usable or cur.specs != specs or cur.problems != tuple(problems):
                self._snapshot = LimitSnapshot(cur.version + 1, tuple(limits), specs, True, None, tuple(problems))
                for p in problems:
                    log.warning("%s: %s", self.describe(), p)

    def _watch(self) -> None:
        while not self._stop.is_set():
            client = pubsub = None
            try:
                client = self._new_client()
                pubsub = client.pubsub()
                pubsub.subscribe(self.channel)
                deadline = time.monotonic() + max(self._socket_timeout, 1.0)
                while not self._stop.is_set():  # subscribed before reading: no change is missed
                    msg = pubsub.get_message(timeout=0.1)
                    if msg is not None and msg.get("type") == "subscribe":
                        break
                    if time.monotonic() > deadline:
                        raise TimeoutError("no SUBSCRIBE confirmation")
                self._load(client)
                next_check = time.monotonic() + self.heartbeat
                while not self._stop.is_set():
                    msg = pubsub.get_message(timeout=max(0.0, min(0.5, next_check - time.monotonic())))
                    if msg is not None and msg.get("type") == "message" and _about_limits(msg.get("data")):
                        self._load(client)
                    if time.monotonic() >= next_check:
                        if client.get(self.rev_key) != self._rev:
                            self._load(client)
                        next_check = time.monotonic() + self.heartbeat
            except Exception as exc:  # noqa: BLE001 - any failure: keep the last definitions, reconnect
                if not self._stop.is_set():
                    self.last_error = self._scrub(f"{type(exc).__name__}: {exc}")
            finally:
                for closable in (pubsub, client):
                    if closable is not None:
                        with contextlib.suppress(Exception):
                            closable.close()
            self._stop.wait(min(self.heartbeat, 0.5))


def _about_limits(data: Any) -> bool:
    """Does a change notification concern limits? (Unreadable ones are assumed to.)"""
    try:
        doc = json.loads(data)
        kind = doc.get("kind") if isinstance(doc, dict) else None
    except (ValueError, TypeError):
        return True
    return not isinstance(kind, str) or kind.lower() == "budgetlimit"
