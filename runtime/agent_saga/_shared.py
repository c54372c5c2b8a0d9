"""The Redis connections of one agent, shared by its controls.

    shared = SharedConnections()
    reader.share_connections(shared)        # the kill switch, SagaPolicy and BudgetLimit readers
    writer.share_connections(shared)        # the heartbeat; the approval store likewise
    ...
    shared.close()                          # after every control using it closed

An agent's Redis-backed controls each used to open their own connections (three readers
with a command and a subscriber connection each, the heartbeat, the approval store: about
ten per agent, ~9 KB of server memory each). ``SharedConnections`` gives them, instead:

- ``client(url, ...)``: one synchronous client per (URL, timeouts), over a bounded pool
  (``POOL_SIZE`` connections; a command waits at most three socket timeouts for one,
  then fails like an unreachable server: the control using it fails closed as before);
- ``subscribe(url, channel, ...)``: one pub/sub connection per URL, read by one thread
  that hands every message to each subscription of its channel.

- ``member(key, make)``: one object per agent the controls share, closed with the
  connections: the policy-plane readers' one watcher (``controls._planewatch``: one
  thread reading the agent's one pub/sub connection itself, one ``P:rev`` backstop per
  tick for every reader of the agent, where each reader had a thread, a subscription
  through ``subscribe`` and a backstop of its own).

The plane wiring (``agent_saga.plane``) makes one per ``PlaneConnection``: one per process
for the process defaults, one per agent for ``open_plane`` (as a pod has its own).

Invariants:
- A subscription is confirmed (the server acknowledged the SUBSCRIBE) before it is
  handed out, and it sees every message published after that: a reader that reads after
  subscribing misses no change.
- A lost pub/sub connection is reported to every subscription (``Lost``): each reader
  treats it as it treated its own connection's loss (fail closed, reconnect, re-read).
- ``close`` closes every connection (and every member); a component never closes a
  shared client itself.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from ._redis import connect

__all__ = ["POOL_SIZE", "Lost", "SharedConnections", "Subscription"]

#: Connections of one shared client's pool (its users wait for one, then fail closed).
POOL_SIZE = 2


class Lost(ConnectionError):
    """The shared pub/sub connection was lost: messages may have been missed."""


class Subscription:
    """One reader's view of a shared subscription: ``get`` the next message."""

    def __init__(self, hub: _Hub, channel: str) -> None:
        self.hub = hub
        self.channel = channel
        self.queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.confirmed = threading.Event()

    def get_message(self, timeout: float) -> dict[str, Any] | None:
        """The next message (a redis-py pub/sub message dict), or None after ``timeout``
        seconds. Raises ``Lost`` if the connection was lost since it was confirmed."""
        try:
            item = self.queue.get(timeout=timeout)
        except queue.Empty:
            return None
        if isinstance(item, Lost):
            raise item
        return item  # type: ignore[no-any-return]


class _Hub:
    """One pub/sub connection to one server and the thread reading it."""

    def __init__(self, new_client: Callable[[], Any], socket_timeout: float) -> None:
        self._new_client = new_client
        self._socket_timeout = socket_timeout
        self._lock = threading.Lock()
        self._subs: dict[str, list[Subscription]] = {}
        self._subscribed: set[str] = set()  # confirmed on the current connection
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def add(self, channel: str) -> Subscription:
        sub = Subscription(self, channel)
        with self._lock:
            self._subs.setdefault(channel, []).append(sub)
            if channel in self._subscribed:
                sub.confirmed.set()  # every later message is dispatched to it
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="agent-saga-pubsub", daemon=True)
                self._thread.start()
        return sub

    def remove(self, sub: Subscription) -> None:
        with self._lock:
            subs = self._subs.get(sub.channel, [])
            if sub in subs:
                subs.remove(sub)

    def close(self) -> None:
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5 + self._socket_timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            client = pubsub = None
            try:
                client = self._new_client()
                pubsub = client.pubsub()
                self._serve(pubsub)
            except Exception as exc:  # noqa: BLE001 - every failure is a lost connection
                self._lost(exc)
            finally:
                for closable in (pubsub, client):
                    if closable is not None:
                        with contextlib.suppress(Exception):
                            closable.close()
            self._stop.wait(0.2)  # then reconnect (readers re-subscribe through it)

    def _serve(self, pubsub: Any) -> None:
        requested: set[str] = set()  # on this connection
        while not self._stop.is_set():
            with self._lock:
                wanted = [c for c in self._subs if c not in requested]
            if wanted:
                pubsub.subscribe(*wanted)
                requested.update(wanted)
            msg = pubsub.get_message(timeout=0.05 if len(requested) > len(self._subscribed) else 0.5)
            while msg is not None:
                self._dispatch(msg)
                msg = pubsub.get_message(timeout=0)

    def _dispatch(self, msg: dict[str, Any]) -> None:
        channel = msg.get("channel")
        name = channel.decode() if isinstance(channel, bytes) else str(channel)
        with self._lock:
            if msg.get("type") == "subscribe":
                self._subscribed.add(name)
                for sub in self._subs.get(name, ()):
                    sub.confirmed.set()
                return
            subs = list(self._subs.get(name, ()))
        for sub in subs:
            if sub.confirmed.is_set():
                sub.queue.put(msg)

    def _lost(self, exc: BaseException) -> None:
        with self._lock:
            self._subscribed.clear()
            subs = [s for ss in self._subs.values() for s in ss]
        lost = Lost(f"the shared pub/sub connection was lost ({type(exc).__name__}: {exc})")
        for sub in subs:
            if sub.confirmed.is_set():
                sub.confirmed.clear()
                sub.queue.put(lost)


class SharedConnections:
    """The Redis connections of one agent's controls (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, float, float], Any] = {}
        self._hubs: dict[str, _Hub] = {}
        self._members: dict[tuple[str, ...], Any] = {}
        self.closed = False

    def member(self, key: tuple[str, ...], make: Callable[[], Any]) -> Any:
        """The agent's one ``make()`` for ``key`` (made on first use; closed with the
        connections): the policy-plane watcher its readers share (``controls._planewatch``)."""
        with self._lock:
            member = self._members.get(key)
            if member is None:
                member = self._members[key] = make()
        return member

    def client(self, url: str, *, feature: str, socket_timeout: float, connect_timeout: float) -> Any:
        """The shared synchronous client of ``url`` with these timeouts (made on first use)."""
        key = (url, float(socket_timeout), float(connect_timeout))
        with self._lock:
            client = self._clients.get(key)
            if client is None:
                client = self._clients[key] = connect(url, feature=feature, socket_timeout=socket_timeout,
                                                      connect_timeout=connect_timeout, max_connections=POOL_SIZE)
        return client

    @contextlib.contextmanager
    def subscribe(self, url: str, channel: str, stop: threading.Event, *, feature: str,
                  socket_timeout: float, timeout: float) -> Iterator[Subscription]:
        """A confirmed subscription to ``channel`` on the shared pub/sub connection of
        ``url``; ``TimeoutError`` if it is not confirmed within ``timeout`` seconds."""
        with self._lock:
            hub = self._hubs.get(url)
            if hub is None:
                hub = self._hubs[url] = _Hub(lambda: connect(url, feature=feature, socket_timeout=socket_timeout,
                                                             connect_timeout=socket_timeout), socket_timeout)
        sub = hub.add(channel)
        try:
            deadline = time.monotonic() + timeout
            while not sub.confirmed.wait(0.1):
                if stop.is_set():
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError("no SUBSCRIBE confirmation")
            yield sub
        finally:
            hub.remove(sub)

    def close(self) -> None:
        """Close every connection (the controls using them are closed first)."""
        with self._lock:
            hubs, self._hubs = list(self._hubs.values()), {}
            clients, self._clients = list(self._clients.values()), {}
            members, self._members = list(self._members.values()), {}
            self.closed = True
        for member in members:
            with contextlib.suppress(Exception):
                member.close()
        for hub in hubs:
            hub.close()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
