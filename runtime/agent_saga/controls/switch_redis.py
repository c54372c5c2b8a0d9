"""``RedisSwitchStore``: kill-switch levers in the policy plane, watched by a thread.

See ``agent_saga.controls.switch_stores`` for the interface and the failure modes, and
docs/killswitch.md for the key schema (shared with the operator, docs/policy-plane.md).

Invariants:
- The hot path (``view``) reads two attributes and the clock: no I/O, no lock.
- The watcher subscribes to the change channel BEFORE it reads the levers, so a change
  made between the two is never missed; it re-reads every ``heartbeat`` seconds anyway
  (pub/sub delivers at most once, and a reconnect may miss messages).
- ``redis`` is imported only when a client is made; a password never reaches a
  message, a log line or a WAL record.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import threading
import time
from collections.abc import Collection
from dataclasses import replace
from typing import Any

from ..errors import ConfigurationError
from .clocks import SYSTEM_CLOCK, ControlClock, format_instant
from .levers import Lever, LeverUnreadable
from .subscriptions import confirmed_subscription
from .switch_stores import (
    DEFAULT_PREFIX,
    SwitchStoreUnavailable,
    SwitchView,
    _err,
    _parse_levers,
    _quarantined,
)

__all__ = ["RedisSwitchStore"]

log = logging.getLogger("agent_saga.controls")


class RedisSwitchStore:
    """Levers in the policy plane (Redis), watched by a background thread.

    Keys (``prefix`` default ``agentsaga:v1``, ``{agentsaga}:v1`` on a Redis Cluster;
    docs/policy-plane.md, written the same way by the operator):

        {prefix}:killswitch:{namespace}/{name}   STRING  the lever document (JSON)
        {prefix}:killswitch:index                SET     the ids of stored levers
        {prefix}:rev                             STRING  change counter (INCR per change)
        {prefix}:events                          channel change notifications (JSON)
        {prefix}:synced                          HASH    the "synced" marker: one field per
                                                         writer ("store", "operator")

    The marker says "the policy plane holds authoritative state" (docs/killswitch.md,
    "Data loss"). Writes through this store set its ``store`` field in the same script
    as the document; the operator sets ``operator`` after a full projection. A writer
    field this process has seen that disappears means the server lost its data (FLUSHALL,
    a restart without persistence): the empty index is then NOT read as "no levers" —
    the last known levers are honoured for ``grace`` exactly as if Redis were
    unreachable, then everything is refused, until the field is back. A store that has
    never seen a marker (a fresh installation) takes what it finds, markers or not.

    ``grace`` (required: the trade-off is yours) is how long the last known levers are
    honoured once Redis cannot be reached; ``0`` fails closed as soon as the loss is
    seen. ``heartbeat``: seconds between re-reads (each proves the server answers; a
    silent loss is noticed after three missed ones). ``socket_timeout`` bounds one
    round trip. ``namespaces``: obey only levers of these Kubernetes namespaces (and
    those engaged with the CLI, namespace ``cli``); default: every namespace.
    ``clock`` is the time seam (grace is measured on its monotonic clock).
    Needs ``pip install agent-saga[redis]``.
    """

    # KEYS[1] the lever document, KEYS[2] the index, KEYS[3] the change counter,
    # KEYS[4] the synced marker
    # ARGV[1] the lever id, ARGV[2] the document without rev ('{...}'), ARGV[3] its time
    # to live in ms ('' for none), ARGV[4] the change channel, ARGV[5] the marker field,
    # ARGV[6] the write's time (epoch seconds)
    # Document, index entry, counter, marker and notification change together (as the
    # operator's LUA_PUT does); the document's first member is the new rev. Returns the rev.
    LUA_PUT = """
local rev = redis.call('INCR', KEYS[3])
local doc = '{"rev":' .. rev .. ',' .. string.sub(ARGV[2], 2)
if ARGV[3] == '' then
  redis.call('SET', KEYS[1], doc)
else
  redis.call('SET', KEYS[1], doc, 'PX', ARGV[3])
end
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[5], '{"v":1,"writer":"' .. ARGV[5] .. '","rev":' .. rev .. ',"ts":' .. ARGV[6] .. '}')
redis.call('PUBLISH', ARGV[4], '{"rev":' .. rev .. ',"v":1,"kind":"KillSwitch","id":"' .. ARGV[1] .. '","op":"put"}')
return rev
"""

    # KEYS as LUA_PUT; ARGV[1] the lever id, ARGV[2] the change channel, ARGV[3] the
    # marker field, ARGV[4] the write's time. Returns the document that was removed
    # (false if there was none).
    LUA_DELETE = """
local cur = redis.call('GET', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
local rev = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[4], ARGV[3], '{"v":1,"writer":"' .. ARGV[3] .. '","rev":' .. rev .. ',"ts":' .. ARGV[4] .. '}')
redis.call('PUBLISH', ARGV[2], '{"rev":' .. rev .. ',"v":1,"kind":"KillSwitch","id":"' .. ARGV[1] .. '","op":"delete"}')
return cur
"""
    _SHA_PUT = hashlib.sha1(LUA_PUT.encode()).hexdigest()
    _SHA_DELETE = hashlib.sha1(LUA_DELETE.encode()).hexdigest()
    #: The marker field this store's writes (the CLI, ``KillSwitch.halt``...) set.
    WRITER = "store"

    def __init__(
        self,
        url: str,
        *,
        grace: float,
        heartbeat: float = 0.5,
        prefix: str = DEFAULT_PREFIX,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
        namespaces: Collection[str] | None = None,
        clock: ControlClock | None = None,
    ) -> None:
        if not isinstance(url, str) or not url:
            raise ConfigurationError("RedisSwitchStore needs a redis:// URL")
        if isinstance(namespaces, str):
            raise ConfigurationError(f"namespaces must be a collection of names, not the string {namespaces!r}")
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace < math.inf:
            raise ConfigurationError(
                f"grace must be a number of seconds >= 0 (0: fail closed at once), got {grace!r}"
            )
        if not 0 < heartbeat < math.inf:
            raise ConfigurationError(f"heartbeat must be a positive number of seconds, got {heartbeat!r}")
        self.url = url
        self.grace = float(grace)
        self.heartbeat = float(heartbeat)
        self.prefix = prefix
        self.index_key = f"{prefix}:killswitch:index"
        self.rev_key = f"{prefix}:rev"
        self.synced_key = f"{prefix}:synced"
        self.channel = f"{prefix}:events"
        self.namespaces = None if namespaces is None else frozenset(namespaces) | {"cli"}
        self._socket_timeout = socket_timeout
        self._connect_timeout = connect_timeout
        self._clock = clock or SYSTEM_CLOCK
        from ..wal.urls import Scrubber, secrets_in

        self._scrub = Scrubber(secrets_in(url))
        self._lock = threading.Lock()
        self._start_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._client: Any = None
        self._version = 0
        self._view = SwitchView(0, usable=False, problem=f"{self.describe()} has not been read yet")
        self._valid_until = -math.inf
        self._stale: tuple[float, SwitchView, SwitchView] | None = None
        self.connected = False
        self.last_error: str | None = None
        self.reloads = 0
        #: Writer fields of the synced marker seen by this process (never shrinks).
        self.writers_seen: frozenset[str] = frozenset()
        #: Set while the marker is missing after having been seen (data loss).
        self.data_lost: str | None = None

    def key(self, lever_id: str) -> str:
        return f"{self.prefix}:killswitch:{lever_id}"

    def describe(self) -> str:
        from ..wal.urls import redact

        return f"RedisSwitchStore({redact(self.url)})"

    def __repr__(self) -> str:
        return f"{self.describe()[:-1]}, grace={self.grace:g})"

    # ------------------------------------------------------------------ hot path
    def view(self) -> SwitchView:
        if self._clock.monotonic() < self._valid_until:
            return self._view
        return self._expired_view()

    def _expired_view(self) -> SwitchView:
        base, until = self._view, self._valid_until
        stale = self._stale
        if stale is not None and stale[0] == until and stale[1] is base:
            return stale[2]
        if until == -math.inf:
            problem = base.problem or f"{self.describe()} has never been read"
            why = f"{problem}; with no known state, the kill switch refuses everything"
        elif self.data_lost is not None:
            why = (f"{self.data_lost}, and the grace window of {self.grace:g}s has passed: the kill "
                   f"switch fails closed and refuses everything until the policy plane is re-projected "
                   f"(the operator's resync, or a write through RedisSwitchStore restores the marker)")
        else:
            why = (f"{self.describe()} is unreachable ({self.last_error or 'no answer'}) and the "
                   f"grace window of {self.grace:g}s has passed: the kill switch fails closed and "
                   f"refuses everything until the store answers again")
        with self._lock:
            self._version += 1
            view = SwitchView(self._version, base.levers, base.unreadable, False, why)
        self._stale = (until, base, view)
        return view

    def is_quarantined(self, saga_id: str) -> bool:
        self.start()
        return _quarantined(self.view(), saga_id, self._clock.time())

    # ------------------------------------------------------------------ watching
    def start(self) -> None:
        """Read the levers now (blocking) and start the watcher thread (idempotent: a
        second caller waits for the first read instead of seeing no state)."""
        with self._start_lock:
            if self._thread is not None:
                return
            self._stop.clear()
            thread = threading.Thread(target=self._watch, name="agent-saga-killswitch", daemon=True)
            try:
                self.refresh()
            except SwitchStoreUnavailable as exc:
                log.error("%s; until it can be read, the kill switch refuses everything", exc.message)
            self._thread = thread
            thread.start()

    def refresh(self) -> None:
        """Re-read every lever now (blocking). Raises ``SwitchStoreUnavailable``."""
        self._load(self._main_client())

    def close(self) -> None:
        self._stop.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 + self._socket_timeout)
        self._thread = None
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()

    def __enter__(self) -> RedisSwitchStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _new_client(self) -> Any:
        try:
            import redis
            from redis.backoff import NoBackoff
            from redis.retry import Retry
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise ConfigurationError(
                "RedisSwitchStore needs the redis package: pip install agent-saga[redis]"
            ) from exc
        return redis.Redis.from_url(
            self.url,
            socket_timeout=self._socket_timeout,
            socket_connect_timeout=self._connect_timeout,
            retry=Retry(NoBackoff(), 0),  # the watcher reconnects itself, and says so
        )

    def _main_client(self) -> Any:
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._new_client()
        return self._client

    def _read(self, client: Any) -> tuple[list[tuple[str, Any]], frozenset[str]]:
        """``(id, raw document)`` of every stored lever this store obeys, and the writer
        fields of the synced marker (two round trips; index and marker read atomically)."""
        pipe = client.pipeline(transaction=True)
        pipe.smembers(self.index_key)
        pipe.hkeys(self.synced_key)
        members, fields = pipe.execute()
        writers = frozenset(f.decode() if isinstance(f, bytes) else str(f) for f in fields)
        ids = sorted(i.decode() if isinstance(i, bytes) else str(i) for i in members)
        if self.namespaces is not None:
            ids = [i for i in ids if i.partition("/")[0] in self.namespaces]
        raws = client.mget([self.key(i) for i in ids]) if ids else []
        # missing: deleted meanwhile
        return [(i, r) for i, r in zip(ids, raws, strict=True) if r is not None], writers

    def _load(self, client: Any) -> None:
        try:
            docs, writers = self._read(client)
        except Exception as exc:
            self._lost(exc)
            raise SwitchStoreUnavailable(f"{self.describe()} could not be read ({_err(exc, self._scrub)})",
                                         store=self.describe()) from exc
        missing = self.writers_seen - writers
        if missing:
            self._marker_lost(missing)
            return
        levers, bad = _parse_levers(iter(docs))
        now = self._clock.monotonic()
        with self._lock:
            restored, self.data_lost = self.data_lost, None
            self.writers_seen |= writers
            v = self._view
            if not (v.usable and v.degraded is None and (levers, bad) == (v.levers, v.unreadable)):
                self._version += 1
                self._view = SwitchView(self._version, levers, bad)
            self._valid_until = now + 3 * self.heartbeat + self.grace
            self.connected = True
            self.reloads += 1
        if restored is not None:
            log.warning("%s: the policy plane's synced marker is back (%s): the levers in Redis are "
                        "authoritative again", self.describe(), ", ".join(sorted(writers)))

    def _marker_lost(self, missing: frozenset[str]) -> None:
        """The server answers but the synced marker this process saw is gone: it lost its
        data. Honour the last known levers for ``grace`` (as if unreachable), then refuse."""
        now = self._clock.monotonic()
        with self._lock:
            first = self.data_lost is None
            self.connected = True
            self.reloads += 1
            if not first:
                return
            self.data_lost = (f"{self.describe()} lost its data: the policy plane's synced marker "
                              f"({self.synced_key}, writer {', '.join(sorted(missing))}) is gone "
                              f"(FLUSHALL, or a restart without persistence)")
            self._valid_until = min(self._valid_until, now + self.grace)
            v = self._view
            if v.usable and self._valid_until > -math.inf:
                self._version += 1
                until = format_instant(self._clock.time() + max(0.0, self._valid_until - now))
                self._view = replace(
                    v, version=self._version,
                    degraded=f"{self.data_lost}: honouring the last known levers until {until} "
                             f"(grace {self.grace:g}s), then refusing everything until it is re-projected",
                )
        log.warning("%s: the policy plane lost its data (synced marker %s gone, writer %s); an empty "
                    "index is not read as 'no levers': the last known levers are honoured for %gs, then "
                    "every call is refused until the plane is re-projected",
                    self.describe(), self.synced_key, ", ".join(sorted(missing)), self.grace)

    def _lost(self, exc: BaseException) -> None:
        """The store stopped answering: honour the last known levers for ``grace``."""
        now = self._clock.monotonic()
        with self._lock:
            first = self.connected or self.last_error is None
            self.connected = False
            self.last_error = _err(exc, self._scrub)
            self._valid_until = min(self._valid_until, now + self.grace)
            v = self._view
            if v.usable and v.degraded is None and self._valid_until > -math.inf:
                self._version += 1
                until = format_instant(self._clock.time() + max(0.0, self._valid_until - now))
                self._view = replace(
                    v, version=self._version,
                    degraded=f"{self.describe()} is unreachable ({self.last_error}): honouring the last "
                             f"known levers until {until} (grace {self.grace:g}s), then refusing everything",
                )
        if first:
            log.warning("%s lost (%s): the last known levers are honoured for %gs, then every call is refused",
                        self.describe(), _err(exc, self._scrub), self.grace)

    def _watch(self) -> None:
        backoff = min(self.heartbeat, 0.2)
        while not self._stop.is_set():
            try:
                # subscribed (and confirmed) before reading: no change is missed
                with confirmed_subscription(
                    self._new_client, self.channel, self._stop, max(self._socket_timeout, 1.0)
                ) as (client, pubsub):
                    self._load(client)
                    next_read = time.monotonic() + self.heartbeat
                    while not self._stop.is_set():
                        msg = pubsub.get_message(timeout=max(0.0, next_read - time.monotonic()))
                        if (msg is not None and msg.get("type") == "message" and _about_switch(msg.get("data"))) \
                                or time.monotonic() >= next_read:
                            self._load(client)
                            next_read = time.monotonic() + self.heartbeat
            except Exception as exc:  # noqa: BLE001 - any failure is a lost store
                if not self._stop.is_set():
                    self._lost(exc)
            self._stop.wait(backoff)

    # ------------------------------------------------------------------ writing / reading
    def levers(self) -> list[Lever]:
        try:
            docs, _ = self._read(self._main_client())
        except Exception as exc:
            raise SwitchStoreUnavailable(f"{self.describe()} could not be read ({_err(exc, self._scrub)})",
                                         store=self.describe()) from exc
        levers, bad = _parse_levers(iter(docs))
        if bad:
            raise SwitchStoreUnavailable(
                f"{self.describe()}: unreadable lever(s): " + "; ".join(m for _, m in bad), store=self.describe()
            )
        return list(levers)

    def _script(self, sha: str, script: str, keys: tuple[str, ...], args: tuple[str, ...]) -> Any:
        import redis.exceptions as rex

        client = self._main_client()
        try:
            return client.evalsha(sha, len(keys), *keys, *args)
        except rex.NoScriptError:
            client.script_load(script)
            return client.evalsha(sha, len(keys), *keys, *args)

    def engage(self, lever: Lever) -> None:
        doc = json.dumps(lever.to_doc(), separators=(",", ":"))
        ttl = ""
        if lever.expires_at is not None:
            # Redis forgets the document a minute after it lapses; readers stop honouring it
            # at expiresAt whatever Redis does.
            ttl = str(max(1, int((lever.expires_at - self._clock.time() + 60.0) * 1000)))
        keys = (self.key(lever.id), self.index_key, self.rev_key, self.synced_key)
        try:
            self._script(self._SHA_PUT, self.LUA_PUT, keys,
                         (lever.id, doc, ttl, self.channel, self.WRITER, self._stamp()))
        except Exception as exc:
            raise SwitchStoreUnavailable(f"{self.describe()}: the lever {lever.id} could not be stored "
                                         f"({_err(exc, self._scrub)})", store=self.describe()) from exc
        self._after_write()

    def lift(self, lever_id: str) -> Lever | None:
        keys = (self.key(lever_id), self.index_key, self.rev_key, self.synced_key)
        try:
            raw = self._script(self._SHA_DELETE, self.LUA_DELETE, keys,
                               (lever_id, self.channel, self.WRITER, self._stamp()))
        except Exception as exc:
            raise SwitchStoreUnavailable(f"{self.describe()}: the lever {lever_id} could not be lifted "
                                         f"({_err(exc, self._scrub)})", store=self.describe()) from exc
        self._after_write()
        if raw is None:
            return None
        try:
            return Lever.from_doc(lever_id, json.loads(raw))
        except (ValueError, LeverUnreadable):
            return None

    def _stamp(self) -> str:
        return f"{self._clock.time():.3f}"

    def _after_write(self) -> None:
        if self._thread is not None:  # this process sees its own change on its next call
            with contextlib.suppress(SwitchStoreUnavailable):
                self.refresh()


def _about_switch(data: Any) -> bool:
    """Does a change notification concern kill switches (or the synced marker)? (Unreadable
    ones are assumed to.)"""
    try:
        doc = json.loads(data)
        kind = doc.get("kind") if isinstance(doc, dict) else None
    except (ValueError, TypeError):
        return True
    return not isinstance(kind, str) or kind.replace("-", "").replace("_", "").lower() in ("killswitch", "policyplane")
