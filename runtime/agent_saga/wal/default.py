"""The process-wide default WAL used by ``saga_scope()`` when none is passed.

Resolution order: the WAL set with ``set_default_wal``; else a ``FileWAL`` at
``$AGENT_SAGA_WAL_PATH``; else a ``FileWAL`` at ``./agent-saga.wal``. It is created on
first use, once, under a lock, and closed at interpreter exit.
"""

from __future__ import annotations

import logging
import os
import threading

from .base import BaseWAL

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
            _default = FileWAL(path)
            log.info("agent-saga default WAL: %s (set %s to choose another)", os.path.abspath(path), ENV_WAL_PATH)
        return _default
