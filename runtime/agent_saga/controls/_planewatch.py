"""``PlaneWatcher``: one thread per agent watching the policy plane for all its readers.

    shared = SharedConnections()
    for reader in (switch_store, policy, limit_source):
        reader.share_connections(shared)
        reader.start()          # joins the agent's watcher instead of starting a thread

An agent's policy-plane readers (``_policyplane.PolicyPlaneReader``: the kill switch,
SagaPolicy, BudgetLimit and ModelRoute readers) each used to run a watcher thread of
their own: its own subscription, its own ``GET P:rev`` backstop every heartbeat, a
wake-up every 0.5 s. Readers that share an agent's connections (``share_connections``)
share one ``PlaneWatcher`` instead (one per ``SharedConnections`` and plane: URL and
prefix), made on the first reader's ``start`` and kept by the ``SharedConnections``:

- one subscription to ``P:events``, on the agent's one pub/sub connection, which the
  watcher's thread reads itself (no thread handing messages over), confirmed before any
  reader is loaded through it: a change made between the two is never missed;
- a notification reloads only the readers whose kind it names (or every reader, for the
  synced marker or a notification it cannot read); the notifications that arrived
  together are read first, so a burst costs each reader one load;
- the others are moved to the notification's rev without a read (``_passed``) when they
  hold the rev just before it: every write of the plane moves ``P:rev`` by exactly one
  and notifies its kind with the new rev in the same script, so a change of one kind
  costs each agent one read, not a read of every reader at the next tick (the rev
  backstop would otherwise find the rev moved and re-read them all). On one subscription
  the notifications' revs only grow; one that does not (the server lost its data or was
  restored from a snapshot, and counts again) reloads every reader, as an unreadable one
  does, so an old rev's documents are never carried into a new count;
- one ``GET P:rev`` every tick (the smallest ``heartbeat`` of its readers) for every
  reader: one whose adopted rev differs (or that has lost its data) is reloaded, the
  others are proved current (``_proven``: the server answered and nothing changed since
  the read they hold; the kill switch and the SagaPolicy reader renew their grace
  window there, as a full re-read did). The notifications waiting when the server
  answers are taken first (a write notifies in the script that moves the rev): a change
  the backstop sees before its notification was read still costs each reader at most
  its own read;
- between those it sleeps in one blocking read of the subscription's socket, until the
  next tick or retry (a message ends it at once): no polling. A reader joining is read
  through the subscription at the latest at the next tick (its ``start`` read it already);
  the last one leaving stops the thread at once (its blocking read is interrupted: the
  subscription's socket is shut down), whatever the tick.

Failures, as each reader's own thread handled them:
- the subscription's connection fails or the rev backstop fails: every reader is
  failed closed (``_lost``: what it then honours and for how long is its own), then the
  watcher re-subscribes and reloads them all;
- one reader's load fails (its own ``_load`` already failed it closed): that reader alone
  is read again after a short back-off, the others run on.

Invariants:
- Loads of one reader run one at a time (its ``_load`` lock); ``refresh`` from another
  thread stays safe.
- ``leave`` returns only once the watcher no longer uses the reader (unless called from
  the watcher's own thread, from a listener): a closed reader is never loaded again.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .._redis import confirmed_subscription, connect
from ..errors import StoreUnavailable

if TYPE_CHECKING:
    from ._policyplane import PolicyPlaneReader

__all__ = ["PlaneWatcher", "concerns", "notification"]

log = logging.getLogger("agent_saga.controls")

#: After a failed load or a lost subscription: seconds before the next attempt.
BACKOFF = 0.2
#: The longest blocking read of the subscription (a tick is shorter: the readers' heartbeat).
MAX_WAIT = 60.0


def notification(data: Any) -> tuple[str | None, int | None]:
    """``(kind, rev)`` of a change notification: the kind it names, normalised
    (``"policyplane"``: the synced marker; ``None`` when it cannot be read: every reader is
    then concerned), and the ``P:rev`` its write moved the plane to (``None``: it carries
    none, or it cannot be read)."""
    try:
        doc = json.loads(data)
    except (ValueError, TypeError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    found, rev = doc.get("kind"), doc.get("rev")
    return (norm_kind(found) if isinstance(found, str) else None,
            rev if isinstance(rev, int) and not isinstance(rev, bool) else None)


def norm_kind(kind: str) -> str:
    return kind.replace("-", "").replace("_", "").lower()


def concerns(kind: str | None, reader_kind: str) -> bool:
    """Does a notification naming ``kind`` (``notification``) concern readers of ``reader_kind``?"""
    return kind is None or kind in (norm_kind(reader_kind), "policyplane")


class PlaneWatcher:
    """The policy-plane watcher of one agent (see the module doc), kept by the agent's
    ``SharedConnections``; ``url``, ``channel`` and ``rev_key`` name the plane."""

    def __init__(self, url: str, channel: str, rev_key: str) -> None:
        self.url = url
        self.channel = channel
        self.rev_key = rev_key
        self._lock = threading.Lock()
        self._busy = threading.Lock()  # held while the thread uses its readers
        self._readers: list[PolicyPlaneReader] = []
        self._joined: list[PolicyPlaneReader] = []  # to load on the current subscription
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last: int | None = None  # the last notification's rev on the current subscription
        self._pubsub: Any = None  # the subscription the thread is reading (``_interrupt``)
        #: Backstop reads of ``P:rev`` made (one per tick for every reader).
        self.backstops = 0

    @property
    def readers(self) -> tuple[PolicyPlaneReader, ...]:
        with self._lock:
            return tuple(self._readers)

    def join(self, reader: PolicyPlaneReader) -> None:
        """Watch ``reader`` from now on: it is loaded once the subscription is confirmed."""
        with self._lock:
            if reader in self._readers:
                return
            self._readers.append(reader)
            self._joined.append(reader)
            if self._thread is None:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._run, args=(self._stop,), name="agent-saga-plane",
                                                daemon=True)
                self._thread.start()

    def leave(self, reader: PolicyPlaneReader) -> None:
        """Stop watching ``reader`` (the last one stops the thread)."""
        with self._lock:
            if reader in self._readers:
                self._readers.remove(reader)
            last = not self._readers
            thread = self._thread
            if last:
                self._thread = None
                self._stop.set()
        if thread is None or thread is threading.current_thread():
            return
        if last:
            self._interrupt()
            thread.join(timeout=5 + reader._socket_timeout)
        else:
            with self._busy:  # the pass using it (if any) is over
                pass

    def close(self) -> None:
        """Stop the thread (``SharedConnections.close``: its readers closed first)."""
        with self._lock:
            readers = list(self._readers)
        for reader in readers:
            self.leave(reader)

    def _interrupt(self) -> None:
        """End the thread's blocking read of the subscription now (the last reader left):
        its socket is shut down, so a long tick (``AGENT_SAGA_PLANE_CHECK_INTERVAL``) does
        not keep a closed agent's thread and connection until the wait ends."""
        sock = getattr(getattr(self._pubsub, "connection", None), "_sock", None)
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    # ------------------------------------------------------------------ the thread
    def _run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            readers = self.readers
            if not readers:
                return
            first = readers[0]
            try:
                # the agent's one pub/sub connection, read by this thread (no hand-over thread)
                timeout = first._socket_timeout
                with confirmed_subscription(
                        functools.partial(connect, self.url, feature=first.NAME, socket_timeout=timeout,
                                          connect_timeout=timeout),
                        self.channel, stop, max(timeout, 1.0)) as (_client, pubsub):
                    with self._lock:  # subscribed (and confirmed): every reader is loaded through it
                        self._joined = list(self._readers)
                    self._pubsub = pubsub
                    if stop.is_set():  # the last reader left before the subscription was published
                        return
                    try:
                        self._serve(pubsub.get_message, stop)
                    finally:
                        self._pubsub = None
            except Exception as exc:  # noqa: BLE001 - a lost subscription or backstop: every reader re-reads
                if not stop.is_set():
                    with self._busy:
                        for reader in self.readers:
                            reader._lost(exc)
            stop.wait(BACKOFF)

    def _serve(self, get_message: Any, stop: threading.Event) -> None:
        due: dict[PolicyPlaneReader, float] = {}  # loads owed (notified, joined, failed: retry at)
        moved: set[PolicyPlaneReader] = set()  # moved to a notification's rev without a read
        self._last = None  # the rev of the last notification on this subscription
        next_beat = time.monotonic() + min((r.heartbeat for r in self.readers), default=BACKOFF)
        while not stop.is_set():
            with self._busy:  # a reader that left before this pass is not in it
                readers = self.readers
                now = time.monotonic()
                with self._lock:
                    joined, self._joined = self._joined, []
                for reader in joined:
                    due[reader] = now
                for reader in [r for r, at in due.items() if at <= now]:
                    del due[reader]
                    if reader in readers:
                        self._load(reader, due)
                if now >= next_beat and readers:
                    # the notifications already sent when the server answered the backstop
                    # are read before it judges a reader behind (no read where one suffices)
                    self._backstop(readers, due, functools.partial(self._take, get_message, 0.0, readers, due,
                                                                   moved))
                    next_beat = time.monotonic() + min(r.heartbeat for r in readers)
                for reader in moved:  # after the burst's reads: the heartbeat sees them all at once
                    if reader in readers:
                        reader._changed()
                moved.clear()
            wait = min([next_beat, *due.values()]) - time.monotonic()
            # one blocking read of the socket until the next tick or retry: a message ends it
            self._take(get_message, max(0.0, min(wait, MAX_WAIT)), readers, due, moved)

    def _take(self, get_message: Any, timeout: float, readers: tuple[PolicyPlaneReader, ...],
              due: dict[PolicyPlaneReader, float], moved: set[PolicyPlaneReader]) -> None:
        """Wait up to ``timeout`` seconds for a notification, then take it and every one
        waiting after it: owe a load to the readers they concern, move the others to their
        rev where nothing was missed (``_passed``)."""
        msg = get_message(timeout=timeout)
        while msg is not None:
            if msg.get("type") == "message":
                kind, rev = notification(msg.get("data"))
                if rev is not None:
                    back, self._last = self._last is not None and rev <= self._last, rev
                    if back:  # the plane counts again (FLUSHALL, a restore): read every reader
                        kind = rev = None
                now = time.monotonic()
                for reader in readers:
                    if concerns(kind, reader.KIND):
                        due[reader] = min(due.get(reader, now), now)
                    elif rev is not None and reader not in due and reader._passed(rev):
                        moved.add(reader)  # another kind's change: current at rev, no read
            msg = get_message(timeout=0)

    def _load(self, reader: PolicyPlaneReader, due: dict[PolicyPlaneReader, float]) -> None:
        try:
            reader._load(reader._main_client())
        except StoreUnavailable:  # failed closed by its own _load: read it again soon
            due[reader] = time.monotonic() + BACKOFF

    def _backstop(self, readers: tuple[PolicyPlaneReader, ...], due: dict[PolicyPlaneReader, float],
                  pending: Callable[[], None]) -> None:
        """One ``GET P:rev`` for every reader: reload the ones behind, prove the others
        current. A failed read is a lost plane (raised: every reader fails closed).
        ``pending()`` takes the notifications waiting once the server answered: a write
        notifies in the same script that moves ``P:rev``, so one the answer shows was
        already sent (a reader it names is loaded for it; one it does not, moved)."""
        first = readers[0]
        client = first._main_client()
        rev = first._repeated(client, lambda: client.get(self.rev_key))
        self.backstops += 1
        pending()
        for reader in readers:
            if reader in due:
                continue  # a load is owed anyway
            try:
                reader._backstop(reader._main_client(), rev)
            except StoreUnavailable:
                due[reader] = time.monotonic() + BACKOFF
