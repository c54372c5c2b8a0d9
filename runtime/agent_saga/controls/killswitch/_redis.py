"""``RedisSwitchStore``: kill-switch levers in the policy plane, watched by a thread.

See ``agent_saga.controls.killswitch._store`` for the interface and the failure modes,
docs/killswitch.md for the key schema (shared with the operator, docs/policy-plane.md),
and ``agent_saga.controls._policyplane`` for the watching, the atomic read and the
synced marker this store shares with every policy-plane reader.

Invariants:
- The hot path (``view``) reads two attributes and the clock: no I/O, no lock.
- The watcher subscribes to the change channel BEFORE it reads the levers, so a change
  made between the two is never missed; every ``heartbeat`` seconds it proves them
  current anyway (pub/sub delivers at most once, and a reconnect may miss messages),
  which renews the grace window: its own thread re-reads every lever; the agent's
  shared watcher (``_planewatch``) reads ``P:rev`` and re-reads the levers only when it
  moved (every write of the plane moves it), else the levers held are current
  (``_proven``).
- ``redis`` is imported only when a client is made; a password never reaches a
  message, a log line or a WAL record.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import replace
from typing import Any

from ..._repeat import check_retries
from ...clocks import SYSTEM_CLOCK, ControlClock, format_instant
from ...errors import ConfigurationError, StoreUnavailable
from .._policyplane import DEFAULT_PREFIX, PolicyPlaneReader
from ._model import Lever, LeverUnreadable
from ._store import SwitchStoreUnavailable, SwitchView, parse_levers, quarantined

__all__ = ["RedisSwitchStore"]

log = logging.getLogger("agent_saga.controls")


class RedisSwitchStore(PolicyPlaneReader):
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
    ``clock`` is the time seam (grace is measured on its monotonic clock). ``retries``:
    how many times a read whose reply was lost is sent again before it counts as a failed
    read (default 1; 3 on a Redis Cluster, whose client closes the connections in use to
    re-read the topology while slots move). Writes (``engage``, ``lift``) are idempotent (a
    lever already stored as written, or already gone, changes nothing and notifies
    nobody), so a write whose reply was lost is sent again: at most ``write_retries``
    times within ``write_deadline`` seconds (``agent_saga._repeat``'s backoff), so a halt
    gets through a storm of closed connections; ``levers()`` (the CLI's read before a lift)
    is repeated the same way. ``last_repeats`` says why each repeat of the last of these
    requests was needed (empty: it was answered at once); a write still lost after them
    raises ``SwitchStoreUnavailable`` saying it may have landed.
    Needs ``pip install agent-saga[redis]``.
    """

    # KEYS[1] the lever document, KEYS[2] the index, KEYS[3] the change counter,
    # KEYS[4] the synced marker
    # ARGV[1] the lever id, ARGV[2] the document without rev ('{...}'), ARGV[3] its time
    # to live in ms ('' for none), ARGV[4] the change channel, ARGV[5] the marker field,
    # ARGV[6] the write's time (epoch seconds)
    # Document, index entry, counter, marker and notification change together (as the
    # operator's LUA_PUT does); the document's first member is the new rev. Returns the rev,
    # or 0 if the document is already stored as written (a repeat whose first attempt
    # landed): nothing changes, nobody is notified.
    LUA_PUT = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local comma = string.find(cur, ',', 1, true)
  if comma and string.sub(cur, comma + 1) == string.sub(ARGV[2], 2) then
    redis.call('SADD', KEYS[2], ARGV[1])
    return 0
  end
end
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
    # (false if there was none: then nothing changes and nobody is notified).
    LUA_DELETE = """
local cur = redis.call('GET', KEYS[1])
redis.call('SREM', KEYS[2], ARGV[1])
if not cur then return false end
redis.call('DEL', KEYS[1])
local rev = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[4], ARGV[3], '{"v":1,"writer":"' .. ARGV[3] .. '","rev":' .. rev .. ',"ts":' .. ARGV[4] .. '}')
redis.call('PUBLISH', ARGV[2], '{"rev":' .. rev .. ',"v":1,"kind":"KillSwitch","id":"' .. ARGV[1] .. '","op":"delete"}')
return cur
"""
    #: The marker field this store's writes (the CLI, ``KillSwitch.halt``...) set.
    WRITER = "store"
    NAME = "RedisSwitchStore"
    KIND = "KillSwitch"
    SLUG = "killswitch"
    UNAVAILABLE = SwitchStoreUnavailable
    THREAD_NAME = "agent-saga-killswitch"
    UNREAD = "the kill switch refuses everything"

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
        retries: int | None = None,
        write_retries: int = 5,
        write_deadline: float = 10.0,
    ) -> None:
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace < math.inf:
            raise ConfigurationError(
                f"grace must be a number of seconds >= 0 (0: fail closed at once), got {grace!r}"
            )
        super().__init__(url, namespaces=namespaces, prefix=prefix, heartbeat=heartbeat,
                         socket_timeout=socket_timeout, connect_timeout=connect_timeout, retries=retries)
        if self.namespaces is not None:
            self.namespaces |= {"cli"}
        self.grace = float(grace)
        check_retries(write_retries)
        if isinstance(write_deadline, bool) or not isinstance(write_deadline, int | float) or not (
                0 < write_deadline < math.inf):
            raise ConfigurationError(f"write_deadline must be a positive number of seconds, got {write_deadline!r}")
        self.write_retries = write_retries
        self.write_deadline = float(write_deadline)
        #: Why each repeat of the last ``levers``, ``engage`` or ``lift`` was sent (empty: none).
        self.last_repeats: tuple[str, ...] = ()
        self._clock = clock or SYSTEM_CLOCK
        self._version = 0
        self._view = SwitchView(0, usable=False, problem=f"{self.describe()} has not been read yet")
        self._valid_until = -math.inf
        self._stale: tuple[float, SwitchView, SwitchView] | None = None

    def __repr__(self) -> str:
        return f"{self.describe()[:-1]}, grace={self.grace:g})"

    # ------------------------------------------------------------------ hot path
    def view(self) -> SwitchView:
        """The levers last read, from memory; unusable once the grace window has passed."""
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
        """True if ``saga_id`` is quarantined (or the store cannot tell)."""
        self.start()
        return quarantined(self.view(), saga_id, self._clock.time())

    # ------------------------------------------------------------------ reader hooks
    def _apply(self, docs: Sequence[tuple[str, Any]]) -> None:
        levers, bad = parse_levers(iter(docs))
        now = self._clock.monotonic()
        with self._lock:
            v = self._view
            if not (v.usable and v.degraded is None and (levers, bad) == (v.levers, v.unreadable)):
                self._version += 1
                self._view = SwitchView(self._version, levers, bad)
            self._valid_until = now + 3 * self.heartbeat + self.grace

    def _heartbeat(self, client: Any) -> None:
        self._load(client)  # every read proves the server answers: it renews the grace window

    def _proven(self) -> None:
        """The agent's watcher read the ``P:rev`` of the levers held: the server answers and
        they are current, so the grace window is renewed as by a read."""
        with self._lock:
            self._valid_until = self._clock.monotonic() + 3 * self.heartbeat + self.grace

    def _on_restored(self, writers: frozenset[str]) -> None:
        log.warning("%s: the policy plane's synced marker is back (%s): the levers in Redis are "
                    "authoritative again", self.describe(), ", ".join(sorted(writers)))

    def _on_data_lost(self, missing: frozenset[str], first: bool) -> None:
        """Honour the last known levers for ``grace`` (as if unreachable), then refuse."""
        if not first:
            return
        self._degrade(lambda until: f"{self.data_lost}: honouring the last known levers until {until} (grace "
                                    f"{self.grace:g}s), then refusing everything until it is re-projected",
                      once=False)
        log.warning("%s; an empty or old index is not read as the levers in force: the last known levers are "
                    "honoured for %gs, then every call is refused until the plane is re-projected",
                    self.data_lost, self.grace)

    def _on_lost(self, error: str, first: bool) -> None:
        """The store stopped answering: honour the last known levers for ``grace``."""
        self._degrade(lambda until: f"{self.describe()} is unreachable ({error}): honouring the last known "
                                    f"levers until {until} (grace {self.grace:g}s), then refusing everything",
                      once=True)
        if first:
            log.warning("%s lost (%s): the last known levers are honoured for %gs, then every call is refused",
                        self.describe(), error, self.grace)

    def _degrade(self, why: Callable[[str], str], *, once: bool) -> None:
        """Honour the last known levers for ``grace`` from now (never longer than already
        allowed), saying ``why(until)`` (the instant they stop being honoured). ``once``:
        only if the view is not degraded already."""
        now = self._clock.monotonic()
        with self._lock:
            self._valid_until = min(self._valid_until, now + self.grace)
            v = self._view
            if v.usable and not (once and v.degraded is not None) and self._valid_until > -math.inf:
                self._version += 1
                until = format_instant(self._clock.time() + max(0.0, self._valid_until - now))
                self._view = replace(v, version=self._version, degraded=why(until))

    # ------------------------------------------------------------------ writing / reading
    def levers(self) -> list[Lever]:
        """A fresh read of every stored lever (repeated like a write: the CLI reads before it
        lifts); raises ``SwitchStoreUnavailable``."""
        repeats: list[str] = []
        self.last_repeats = ()
        try:
            _, _, docs = self._read(self._main_client(), retries=self.write_retries,
                                    deadline=time.monotonic() + self.write_deadline,
                                    on_repeat=self._noting(repeats, "a read of the levers"))
        except Exception as exc:
            raise self._unavailable(f"{self.describe()} could not be read", exc) from exc
        levers, bad = parse_levers(iter(docs))
        if bad:
            raise SwitchStoreUnavailable(
                f"{self.describe()}: unreadable lever(s): " + "; ".join(m for _, m in bad), store=self.describe()
            )
        return list(levers)

    def _write(self, lua: str, keys: tuple[str, ...], args: tuple[str, ...]) -> Any:
        """Run the write script ``lua``, repeated while its reply is lost (it is idempotent),
        at most ``write_retries`` times within ``write_deadline`` seconds."""
        client = self._main_client()
        run = self._script(client, lua)
        repeats: list[str] = []
        self.last_repeats = ()
        try:
            return self._repeating(client, lambda _repeat: run(keys=keys, args=args, client=client),
                                   retries=self.write_retries, deadline=time.monotonic() + self.write_deadline,
                                   on_repeat=self._noting(repeats, "a write"))
        finally:
            self.last_repeats = tuple(repeats)

    def _noting(self, repeats: list[str], what: str) -> Callable[[int, str], None]:
        """An ``on_repeat`` that notes why in ``repeats`` (and ``last_repeats``) and logs it."""
        def again(attempt: int, why: str) -> None:
            repeats.append(why)
            self.last_repeats = tuple(repeats)
            log.warning("%s: %s lost its reply (%s); sending it again (repeat %d of at most %d)",
                        self.describe(), what, why, attempt, self.write_retries)
        return again

    def _write_failed(self, message: str, exc: BaseException) -> StoreUnavailable:
        """A write's refusal; after lost replies it says the write may have landed."""
        return self._unavailable(message, exc, during="a write", after=(
            f"{message}: it may have been written; read the levers (agent-saga status), or run it again "
            f"(a write already stored changes nothing)"))

    def engage(self, lever: Lever) -> None:
        """Store ``lever`` with its index entry, rev, marker and notification (one script)."""
        doc = json.dumps(lever.to_doc(), separators=(",", ":"))
        ttl = ""
        if lever.expires_at is not None:
            # Redis forgets the document a minute after it lapses; readers stop honouring it
            # at expiresAt whatever Redis does.
            ttl = str(max(1, int((lever.expires_at - self._clock.time() + 60.0) * 1000)))
        keys = (self.key(lever.id), self.index_key, self.rev_key, self.synced_key)
        try:
            self._write(self.LUA_PUT, keys, (lever.id, doc, ttl, self.channel, self.WRITER, self._stamp()))
        except Exception as exc:
            raise self._write_failed(f"{self.describe()}: the lever {lever.id} could not be stored", exc) from exc
        self._after_write()

    def lift(self, lever_id: str) -> Lever | None:
        """Remove the lever ``lever_id`` (one script); return it (``None`` if it was not engaged)."""
        keys = (self.key(lever_id), self.index_key, self.rev_key, self.synced_key)
        try:
            raw = self._write(self.LUA_DELETE, keys, (lever_id, self.channel, self.WRITER, self._stamp()))
        except Exception as exc:
            raise self._write_failed(f"{self.describe()}: the lever {lever_id} could not be lifted", exc) from exc
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
        if self.running:  # this process sees its own change on its next call
            with contextlib.suppress(SwitchStoreUnavailable):
                self.refresh()
