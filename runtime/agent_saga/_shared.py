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
- ``member(key, make)``: one object per agent the controls share, closed with the
  connections: the policy-plane readers' one watcher (``controls._planewatch``), which
  holds the agent's one pub/sub connection and reads it on its own thread: one
  subscription and one ``P:rev`` backstop per tick for every reader of the agent, where
  each reader had a thread, a subscription and a backstop of its own.

The plane wiring (``agent_saga.plane``) makes one per ``PlaneConnection``: one per process
for the process defaults, one per agent for ``open_plane`` (as a pod has its own).

Invariants:
- The watcher's subscription is confirmed (the server acknowledged the SUBSCRIBE) before
  it reads any reader through it, and a lost pub/sub connection fails every reader of the
  agent closed before all re-read (``controls._planewatch``).
- ``close`` closes every connection (and every member); a component never closes a
  shared client itself.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from ._redis import connect

__all__ = ["POOL_SIZE", "SharedConnections"]

#: Connections of one shared client's pool (its users wait for one, then fail closed).
POOL_SIZE = 2


class SharedConnections:
    """The Redis connections of one agent's controls (see the module doc)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, float, float], Any] = {}
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

    def close(self) -> None:
        """Close every connection (the controls using them are closed first)."""
        with self._lock:
            clients, self._clients = list(self._clients.values()), {}
            members, self._members = list(self._members.values()), {}
            self.closed = True
        for member in members:
            with contextlib.suppress(Exception):
                member.close()
        for client in clients:
            with contextlib.suppress(Exception):
                client.close()
