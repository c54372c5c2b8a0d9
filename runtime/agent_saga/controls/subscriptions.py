"""A Redis pub/sub subscription that is confirmed before anything is read.

The policy-plane readers (the kill switch, the limit source) subscribe to change
notifications and only then read the state, so a change published after the read cannot
be missed: that ordering needs the server's SUBSCRIBE confirmation, not just the command.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any


@contextlib.contextmanager
def confirmed_subscription(
    new_client: Callable[[], Any], channel: str, stop: threading.Event, timeout: float
) -> Iterator[tuple[Any, Any]]:
    """Yield ``(client, pubsub)`` once Redis confirmed the SUBSCRIBE to ``channel``.

    Raises ``TimeoutError`` if no confirmation arrives within ``timeout`` seconds; both the
    client and the pubsub are closed when the block exits, however it exits.
    """
    client = pubsub = None
    try:
        client = new_client()
        pubsub = client.pubsub()
        pubsub.subscribe(channel)
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            msg = pubsub.get_message(timeout=0.1)
            if msg is not None and msg.get("type") == "subscribe":
                break
            if time.monotonic() > deadline:
                raise TimeoutError("no SUBSCRIBE confirmation")
        yield client, pubsub
    finally:
        for closable in (pubsub, client):
            if closable is not None:
                with contextlib.suppress(Exception):
                    closable.close()
