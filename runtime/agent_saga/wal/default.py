"""The process-wide default WAL used by ``saga_scope()`` when none is passed.

Resolution order: the WAL set with ``set_default_wal``; else a ``FileWAL`` at
``$AGENT_SAGA_WAL_PATH``; else a ``FileWAL`` at ``./agent-saga.wal``. It is created on
first use, once, under a lock, and closed at interpreter exit. A path that cannot be
written (a read-only root filesystem) raises ``ConfigurationError`` naming the settings.

``DEFAULT_WAL`` stands for "whatever the process-wide WAL is when a record is written":
controls built before the WAL is chosen (the policy plane's kill switch and approval
gateway) hold it, so connecting never creates a log file as a side effect.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import AsyncIterator
from typing import Any

from ..errors import ConfigurationError
from ..records import Record
from .base import BaseWAL, WALStats
from .prepared import PreparedPayload

log = logging.getLogger("agent_saga.wal")

ENV_WAL_PATH = "AGENT_SAGA_WAL_PATH"
DEFAULT_WAL_PATH = "agent-saga.wal"

_lock = threading.Lock()
_default: BaseWAL | None = None


def set_default_wal(wal: BaseWAL | None) -> BaseWAL | None:
    """Make ``wal`` the process-wide default; return the previous one (not closed)."""
    global _default
    with _lock:
        prev, _default = _default, wal
    return prev


def get_default_wal() -> BaseWAL:
    """The process-wide WAL, created on first use (see the module doc for the order)."""
    global _default
    with _lock:
        if _default is None or getattr(_default, "closed", False):
            from .file import FileWAL

            path = os.environ.get(ENV_WAL_PATH) or DEFAULT_WAL_PATH
            try:
                _default = FileWAL(path)
            except OSError as exc:
                raise ConfigurationError(
                    f"the process-wide WAL cannot be created at {os.path.abspath(path)} ({exc.strerror or exc}): set "
                    f"{ENV_WAL_PATH} to a file on a writable volume, set AGENT_SAGA_WAL_STREAM to keep it in the "
                    f"policy plane's Redis, or pass wal= to saga_scope()/AgentKit") from None
            log.info("agent-saga default WAL: %s (set %s to choose another)", os.path.abspath(path), ENV_WAL_PATH)
        return _default


def made_default_wal() -> BaseWAL | None:
    """The process-wide WAL if one was set or made, else ``None`` (never makes one)."""
    with _lock:
        return _default


class _DefaultWALRef(BaseWAL):
    """The process-wide WAL, looked up at each call (see the module doc)."""

    durability = "that of the process-wide WAL"

    def append(self, type: str, saga: str, step: str | None = None, payload: dict[str, Any] | None = None) -> int:
        return get_default_wal().append(type, saga, step, payload)

    def append_prepared(self, type: str, saga: str, step: str | None, prepared: PreparedPayload) -> int:
        return get_default_wal().append_prepared(type, saga, step, prepared)

    async def barrier(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        await get_default_wal().barrier(seq, timeout=timeout)

    def barrier_sync(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        get_default_wal().barrier_sync(seq, timeout=timeout)

    def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        return get_default_wal().read_all(page_size=page_size)

    def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        return get_default_wal().read_since(seq, page_size=page_size)

    def stats(self) -> WALStats:
        return get_default_wal().stats()

    def close(self, *, timeout: float = 10.0) -> None:
        """Nothing: the process-wide WAL is closed at interpreter exit, not by a holder."""

    def __repr__(self) -> str:
        return "DEFAULT_WAL"


#: The process-wide WAL as it is when a record is written (module doc).
DEFAULT_WAL: BaseWAL = _DefaultWALRef()
