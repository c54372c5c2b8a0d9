"""The one policy-plane reader: documents of one kind, cached in memory and watched.

The operator projects custom resources into Redis (docs/policy-plane.md); agents read
them through a subclass of ``PolicyPlaneReader``. ``RedisSwitchStore`` (KillSwitch
documents) and ``RedisLimitSource`` (BudgetLimit documents) are two; every reader shares
the key schema, where ``P`` is the prefix (``agentsaga:v1``) and ``slug`` the kind's::

    P:<slug>:index           SET     "<namespace>/<name>" of every document of the kind
    P:<slug>:<ns>/<name>     STRING  the document (JSON, ``{"rev": n, "v": 1, ...}``)
    P:rev                    STRING  change counter (INCR on every write, any kind)
    P:events                 channel change notifications {"kind": ..., "id": ..., "op": ...}
    P:synced                 HASH    the synced marker: one field per writer

What the base does, so a reader only says how to read its documents:
- Subscribe, then load. The watcher subscribes to ``P:events`` and waits for the
  server's confirmation BEFORE it reads, so a change made between the two is never
  missed; it reloads on every notification about its kind (or the marker, or one it
  cannot read), and every ``heartbeat`` seconds runs the rev backstop (re-read when
  ``P:rev`` moved: pub/sub delivers at most once and a reconnect may miss messages).
  The watcher is the agent's ``PlaneWatcher`` (``_planewatch``) when the reader shares
  the agent's connections (``share_connections``: every reader ``agent_saga.plane``
  wires): one thread, one subscription and one ``GET P:rev`` per tick for all of the
  agent's readers, each reloaded only when a notification names its kind or the rev
  moved, the others proved current (``_proven``). A reader with connections of its own
  runs a thread of its own (``_watch``) and calls ``_heartbeat`` every ``heartbeat``.
- One atomic read (``LUA_READ``): the index, the documents of the namespaces obeyed,
  ``P:rev`` and the marker's fields, in one script, so a read never sees half a write.
  A read whose reply was lost (``agent_saga._repeat``: a Cluster client re-reading the
  topology, a closed connection, a timeout) is sent again, at most ``retries`` times
  (default 1; 3 on a Redis Cluster), before it counts as a failed read.
- The synced marker. A field this process has seen that is now missing means the server
  lost its data (FLUSHALL, a restart without persistence): an empty index is then NOT
  read as "nothing configured". ``data_lost`` says so until every field seen is back
  (or the ``AUTHORITY`` field is, for a kind only that writer writes). A reader that has
  never seen a field takes what it finds: an empty plane without a marker is a fresh
  installation.
- Going back in time. ``P:rev`` lower than one this process has adopted means the server
  was restored from an older snapshot: its documents (and its marker) are old. The
  marker's field values present at that read are remembered as stale; a field counts as
  present only once its value differs (its writer wrote it again: the operator after
  re-projecting every resource), so the same rule as for a lost marker applies.
- Failure bookkeeping: ``connected``, ``last_error`` (never with a password), ``reloads``,
  ``writers_seen``; a failed read raises the reader's ``UNAVAILABLE`` error (a
  ``StoreUnavailable``) and calls ``_on_lost``. What the reader then honours and for how
  long (the grace window of the kill switch; the last limits, indefinitely) is its own.

How a new reader plugs in (a SagaPolicy source, say) — subclass, set five class
attributes and implement ``_apply``; ``start``, ``refresh``, ``close``, the watcher, the
marker and the error handling come from the base::

    class RedisSagaPolicySource(PolicyPlaneReader):
        NAME = "RedisSagaPolicySource"   # how messages and status name the reader
        KIND = "SagaPolicy"              # the notifications' "kind" this reader follows
        SLUG = "sagapolicy"              # the key slug: P:sagapolicy:index, P:sagapolicy:<id>
        UNAVAILABLE = SagaPolicyUnavailable   # a StoreUnavailable subclass
        AUTHORITY = "operator"           # the only writer of the kind (None: several)

        def _apply(self, docs):          # [(id, raw JSON)], sorted by id; no I/O, no raise
            ...parse each, keep what can be read, swap the cached state atomically...

    Optional hooks: ``_initial_state()`` (the cache before the first read),
    ``_on_lost(error, first)`` (the read failed), ``_on_data_lost(missing,
    first)`` (the marker went away), ``_on_restored(writers)`` (it is back),
    ``_heartbeat(client)`` (its own thread: what proves the plane is current; the
    default reads ``P:rev`` and calls ``_backstop``), ``_backstop(client, rev)`` (the rev
    just read: reload if it moved, else ``_proven()``) and ``_proven()`` (the server
    answered with the rev of the documents held: a grace window is renewed there).
    ``THREAD_NAME`` names the watcher thread, ``UNREAD`` says in the start-up error what
    the control does until it can read, ``DATA_LOST_SUFFIX`` ends the ``data_lost`` text.
    The hot path of a reader reads its cached state only (one attribute), never Redis.

Invariants:
- Hooks run on the watcher's thread (the reader's own, or the agent's ``PlaneWatcher``,
  shared with the agent's other readers) or the caller of ``refresh``; they must not block.
- ``redis`` is imported only when a client is made (``agent_saga._redis``).
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from typing import Any, ClassVar

from .. import observe as _observe
from .._redis import PLANE_FIX, RedisStore, confirmed_subscription
from .._repeat import OnRepeat
from ..errors import ConfigurationError, StoreUnavailable
from ._planewatch import PlaneWatcher, concerns, notification

__all__ = ["DEFAULT_PREFIX", "PLANE_FIX", "PolicyPlaneReader", "env_prefix"]

log = logging.getLogger("agent_saga.controls")

DEFAULT_PREFIX = "agentsaga:v1"
def env_prefix() -> str:
    """The policy-plane prefix a store opened from a URL uses: ``AGENT_SAGA_KEY_PREFIX``
    (default ``agentsaga``, as the operator's ``--key-prefix``) plus ``:v1``, so the CLI
    and an agent pod configured alike read the same keys."""
    return f"{(os.environ.get('AGENT_SAGA_KEY_PREFIX') or 'agentsaga').strip()}:v1"



#: A ``rev`` no server holds: while the plane has lost its data, every heartbeat re-reads.
_NEVER: Any = object()


def about_kind(kind: str, data: Any) -> bool:
    """Does a change notification concern documents of ``kind`` (or the synced marker)?
    Unreadable ones are assumed to."""
    return concerns(notification(data)[0], kind)


def _rev_number(rev: Any) -> int | None:
    """``P:rev`` as read (bytes, str or nil) as a number; ``None`` when absent or unreadable."""
    try:
        return None if rev is None else int(rev)
    except (TypeError, ValueError):
        return None


class PolicyPlaneReader(RedisStore):
    """Base of the policy-plane readers (see the module doc for how a reader plugs in).
    It stands on ``agent_saga._redis.RedisStore`` (client, scripts, repeats, error
    mapping, cluster guard, close).

    ``url``: the policy plane (``redis://``; a password never reaches a message).
    ``namespaces``: read only documents of these Kubernetes namespaces (default: all).
    ``heartbeat``: seconds between ``_heartbeat`` runs. ``socket_timeout`` /
    ``connect_timeout`` bound one round trip / one connection attempt. ``retries``: how
    many times a read whose reply was lost is sent again (default 1; 3 on a Redis Cluster).
    """

    NAME: ClassVar[str] = "PolicyPlaneReader"
    KIND: ClassVar[str]
    SLUG: ClassVar[str]
    AUTHORITY: ClassVar[str | None] = None
    THREAD_NAME: ClassVar[str] = "agent-saga-policy-plane"
    UNREAD: ClassVar[str] = "the control refuses every call"
    DATA_LOST_SUFFIX: ClassVar[str] = ""

    # KEYS[1] the kind's index   KEYS[2] the change counter   KEYS[3] the synced marker
    # ARGV[1] the documents' key prefix ("P:v1:<slug>:")   ARGV[2] "1": keep only the
    # namespaces ARGV[3..] ("0": every namespace)
    # One atomic read: {rev or nil, marker fields and values (flat, as HGETALL), ids,
    # documents} (an id whose document
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
return {redis.call('GET', KEYS[2]), redis.call('HGETALL', KEYS[3]), ids, docs}
"""

    def __init__(
        self,
        url: str,
        *,
        namespaces: Collection[str] | None = None,
        prefix: str = DEFAULT_PREFIX,
        heartbeat: float = 1.0,
        socket_timeout: float = 1.0,
        connect_timeout: float = 1.0,
        retries: int | None = None,
    ) -> None:
        self._open(url, socket_timeout=socket_timeout, connect_timeout=connect_timeout, retries=retries,
                   prefix=prefix)
        if isinstance(namespaces, str):
            raise ConfigurationError(f"namespaces must be a collection of names, not the string {namespaces!r}")
        if not 0 < heartbeat < math.inf:
            raise ConfigurationError(f"heartbeat must be a positive number of seconds, got {heartbeat!r}")
        self.prefix = prefix
        self.namespaces: frozenset[str] | None = None if namespaces is None else frozenset(namespaces)
        self.heartbeat = float(heartbeat)
        self.index_key = f"{prefix}:{self.SLUG}:index"
        self.rev_key = f"{prefix}:rev"
        self.synced_key = f"{prefix}:synced"
        self.channel = f"{prefix}:events"
        self._start_lock = threading.Lock()
        self._load_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._watcher: Any = None  # the agent's PlaneWatcher (shared connections), once started
        self._rev: Any = _NEVER
        self.connected = False
        self.last_error: str | None = None
        self.reloads = 0
        #: Writer fields of the synced marker seen by this process (never shrinks).
        self.writers_seen: frozenset[str] = frozenset()
        #: Set while the marker is missing after having been seen (data loss).
        self.data_lost: str | None = None
        #: The highest ``P:rev`` adopted (a lower one later: restored from an older snapshot).
        self.top_rev: int | None = None
        #: The marker's values when the plane went back in time (``None``: it has not).
        self._stale_marks: dict[str, str] | None = None
        self._listeners: list[Callable[[], None]] = []
        self._initial_state()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """Call ``listener()`` (on the reading thread; it must not block) after every read
        and every loss: the agent's heartbeat learns at once what this reader applied."""
        self._listeners.append(listener)

    @property
    def applied_rev(self) -> str | None:
        """The ``P:rev`` of the last read adopted (``None``: none yet, or data lost)."""
        rev = self._rev
        if rev is _NEVER or rev is None:
            return None
        return rev.decode() if isinstance(rev, bytes) else str(rev)

    def _changed(self) -> None:
        for listener in tuple(self._listeners):
            try:
                listener()
            except Exception:  # noqa: BLE001 - a listener never breaks the reader
                log.exception("%s: a change listener failed", self.describe())

    @property
    def running(self) -> bool:
        """Started and watched (by its own thread, or by the agent's ``PlaneWatcher``)."""
        return self._thread is not None or self._watcher is not None

    def key(self, doc_id: str) -> str:
        """The key of the document ``doc_id`` (``<namespace>/<name>``)."""
        return f"{self.prefix}:{self.SLUG}:{doc_id}"

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        """Read now (blocking) and start watching (idempotent: a second caller waits for
        the first read instead of seeing no state): with shared connections, the agent's
        ``PlaneWatcher`` (``_planewatch``) watches it, else a thread of its own. A failed
        first read is logged; until a read succeeds the reader's control fails closed."""
        with self._start_lock:
            if self.running:
                return
            self._stop.clear()
            try:
                self.refresh()
            except StoreUnavailable as exc:
                log.error("%s; until it can be read, %s", exc.message, self.UNREAD)
            if self._shared is not None:
                watcher = self._shared.member(("plane-watcher", self.url, self.prefix),
                                              lambda: PlaneWatcher(self.url, self.channel, self.rev_key))
                self._watcher = watcher
                watcher.join(self)
                return
            thread = threading.Thread(target=self._watch, name=self.THREAD_NAME, daemon=True)
            self._thread = thread
            thread.start()

    def refresh(self) -> None:
        """Re-read every document now (blocking). Raises the reader's ``UNAVAILABLE``."""
        self._load(self._main_client())

    def close(self) -> None:
        """Stop the watcher and close the connections."""
        self._stop.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.leave(self)
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 + self._socket_timeout)
        self._thread = None
        super().close()

    def __enter__(self) -> PolicyPlaneReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ I/O
    @contextlib.contextmanager
    def _subscribed(self) -> Iterator[tuple[Any, Callable[..., Any]]]:
        """``(client, get_message)`` once the server confirmed the subscription to the
        events channel, on this reader's own connections (a reader sharing the agent's
        connections is watched by its ``PlaneWatcher`` instead)."""
        timeout = max(self._socket_timeout, 1.0)
        with confirmed_subscription(self._new_client, self.channel, self._stop, timeout) as (client, pubsub):
            yield client, pubsub.get_message

    def _read(self, client: Any, *, retries: int | None = None, deadline: float | None = None,
              on_repeat: OnRepeat | None = None) -> tuple[Any, dict[str, str], list[tuple[str, Any]]]:
        """``(rev, {marker field: value}, [(id, raw document)])`` in one atomic round trip
        (repeated at most ``retries`` times, default the reader's, and not after ``deadline``)."""
        args = [f"{self.prefix}:{self.SLUG}:", "0" if self.namespaces is None else "1",
                *sorted(self.namespaces or ())]
        run = self._script(client, self.LUA_READ)
        rev, fields, ids, raws = self._repeated(
            client, lambda: run(keys=[self.index_key, self.rev_key, self.synced_key], args=args, client=client),
            retries=retries, deadline=deadline, on_repeat=on_repeat)
        flat = [f.decode() if isinstance(f, bytes) else str(f) for f in fields or ()]
        marks = dict(zip(flat[::2], flat[1::2], strict=True))
        docs = sorted(zip((i.decode() if isinstance(i, bytes) else str(i) for i in ids or ()), raws or (),
                          strict=True))
        return rev, marks, docs

    def _repeated(self, client: Any, read: Callable[[], Any], *, retries: int | None = None,
                  deadline: float | None = None, on_repeat: OnRepeat | None = None) -> Any:
        """``read()``, sent again while its reply is lost (a read is always safe to repeat);
        ``ReplyLost`` once ``retries`` (default the reader's) repeats lost theirs too."""
        return self._repeating(client, lambda _repeat: read(), retries=retries, deadline=deadline,
                               on_repeat=on_repeat)

    def _load(self, client: Any) -> None:
        """One read, then adopt it (or note the data loss). Raises ``UNAVAILABLE``.

        Loads run one at a time: a read overtaken by a later one must not look like the
        plane going back in time."""
        with self._load_lock:
            self._load_once(client)

    def _load_once(self, client: Any) -> None:
        try:
            rev, marks, docs = self._read(client)
        except Exception as exc:
            self._lost(exc)
            raise self._unavailable(f"{self.describe()} could not be read", exc) from exc
        number = _rev_number(rev)
        went_back = self._stale_marks is None and number is not None and self.top_rev is not None \
            and number < self.top_rev
        if went_back:
            self._stale_marks = dict(marks)
        # A field still holding the value it had when the plane went back in time is as
        # good as missing: its writer has not vouched for the restored plane yet.
        writers = frozenset(f for f, v in marks.items() if self._stale_marks is None or self._stale_marks.get(f) != v)
        missing = self.writers_seen - writers
        if missing and (self.AUTHORITY is None or self.AUTHORITY not in writers):
            self._marker_lost(missing, went_back=self._stale_marks is not None, rev=number)
            return
        self._apply(docs)
        with self._lock:
            restored, self.data_lost = self.data_lost, None
            self.writers_seen |= writers
            self._rev = rev
            self._stale_marks = None
            if number is not None:  # loads are serial: a lower rev adopted here starts a new timeline
                self.top_rev = number
            self.connected = True
            self.reloads += 1
        if restored is not None:
            self._on_restored(writers)
        self._changed()

    def _marker_lost(self, missing: frozenset[str], *, went_back: bool = False, rev: int | None = None) -> None:
        with self._lock:
            first = self.data_lost is None
            self.connected = True
            self.reloads += 1
            self._rev = _NEVER  # re-read on every heartbeat until the marker is back
            if first and went_back:
                self.data_lost = (f"{self.describe()} went back in time: {self.rev_key} is {rev}, this process "
                                  f"had read {self.top_rev} (restored from an older snapshot); the synced "
                                  f"marker's writer {', '.join(sorted(missing))} has not vouched for it "
                                  f"since{self.DATA_LOST_SUFFIX}")
            elif first:
                self.data_lost = (f"{self.describe()} lost its data: the policy plane's synced marker "
                                  f"({self.synced_key}, writer {', '.join(sorted(missing))}) is gone "
                                  f"(FLUSHALL, or a restart without persistence){self.DATA_LOST_SUFFIX}")
        self._on_data_lost(missing, first)
        self._changed()

    def _lost(self, exc: BaseException) -> None:
        with self._lock:
            first = self.connected or self.last_error is None
            self.connected = False
            self.last_error = self._target.error_text(exc)
        obs = _observe.current
        if obs is not None:
            _observe.safely(obs.plane_unreachable, self.KIND)
        self._on_lost(self.last_error, first)
        self._changed()

    def _watch(self) -> None:
        backoff = min(self.heartbeat, 0.2)
        while not self._stop.is_set():
            try:
                # subscribed (and confirmed) before reading: no change is missed
                with self._subscribed() as (client, get_message):
                    self._load(client)
                    next_beat = time.monotonic() + self.heartbeat
                    while not self._stop.is_set():
                        msg = get_message(timeout=max(0.0, min(0.5, next_beat - time.monotonic())))
                        if msg is not None and msg.get("type") == "message" and about_kind(self.KIND, msg.get("data")):
                            self._load(client)
                            next_beat = time.monotonic() + self.heartbeat
                        elif time.monotonic() >= next_beat:
                            self._heartbeat(client)
                            next_beat = time.monotonic() + self.heartbeat
            except Exception as exc:  # noqa: BLE001 - any failure is a lost plane: reconnect
                if not self._stop.is_set():
                    self._lost(exc)
            self._stop.wait(backoff)

    # ------------------------------------------------------------------ hooks
    def _initial_state(self) -> None:
        """Set up the cached state (nothing read yet: the control fails closed)."""

    def _apply(self, docs: Sequence[tuple[str, Any]]) -> None:
        """Adopt the documents just read (``(id, raw JSON)``, sorted by id)."""
        raise NotImplementedError

    def _heartbeat(self, client: Any) -> None:
        """Every ``heartbeat`` seconds on the reader's own thread: the rev backstop."""
        self._backstop(client, self._repeated(client, lambda: client.get(self.rev_key)))

    def _backstop(self, client: Any, rev: Any) -> None:
        """``P:rev`` was just read as ``rev``: re-read if it moved from the one adopted (or
        the data was lost, or the last read failed), else the documents held are proved
        current (``_proven``)."""
        if self._rev is _NEVER or rev != self._rev or not self.connected:
            self._load(client)
        else:
            self._proven()

    def _proven(self) -> None:
        """The server just answered with the ``P:rev`` of the documents held: they are current."""

    def _passed(self, rev: int) -> bool:
        """A notification said a write of another kind moved ``P:rev`` to ``rev``. Every
        write of the plane moves it by exactly one and notifies its kind with the new rev
        in the same script, so a reader holding ``rev - 1`` holds the documents of ``rev``
        too: it adopts ``rev`` without a read (the rev backstop then finds it current).
        Anything else (a gap: a lost notification or a write without one, no rev held, a
        failed or lost plane, a read under way) leaves it to its read or the backstop.
        True if it adopted ``rev`` (the caller tells the listeners, ``_changed``, once the
        reads of the same burst are done: one heartbeat for the burst)."""
        if not self._load_lock.acquire(blocking=False):
            return False  # a read is under way: it reads the rev itself
        try:
            with self._lock:
                held = self._rev
                if held is _NEVER or not self.connected or self.data_lost is not None \
                        or _rev_number(held) != rev - 1:
                    return False
                self._rev = str(rev).encode() if isinstance(held, bytes) else str(rev)
                self.top_rev = max(self.top_rev or rev, rev)
                return True
        finally:
            self._load_lock.release()

    def _on_lost(self, error: str, first: bool) -> None:
        """A read failed with ``error`` (scrubbed); ``first`` since the last success."""

    def _on_data_lost(self, missing: frozenset[str], first: bool) -> None:
        """The marker fields ``missing`` are gone; ``data_lost`` says so."""

    def _on_restored(self, writers: frozenset[str]) -> None:
        """The marker is back after a data loss (every field seen, or the authority's)."""
