"""The event loop ``agent-saga mcp --listen`` runs on: uvloop's when it is installed (the
``fast`` extra, ``pip install 'agent-saga[fast]'``; the sidecar image has it), else
asyncio's own.

uvloop is never required: it is imported here, when the HTTP proxy's loop is made, and
nowhere at import time. ``$AGENT_SAGA_MCP_LOOP`` picks: ``auto`` (the default: uvloop if it
imports, asyncio otherwise, said at debug level) or ``asyncio`` (never uvloop, e.g. to
rule it out). The proxy's startup line names the loop it runs (``loop_name``).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from ..errors import ConfigurationError

__all__ = ["loop_factory", "loop_name"]

log = logging.getLogger("agent_saga.mcp")

CHOICES = ("auto", "asyncio")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the proxy's event loop (``asyncio.Runner(loop_factory=...)``)."""
    choice = os.environ.get("AGENT_SAGA_MCP_LOOP", "auto").strip().lower() or "auto"
    if choice not in CHOICES:
        raise ConfigurationError(f"AGENT_SAGA_MCP_LOOP={choice!r}: use auto (uvloop when installed, else asyncio) or "
                                 "asyncio (never uvloop)")
    if choice == "auto":
        try:
            import uvloop
        except ImportError as exc:  # the fast extra is not installed: asyncio's loop does the same, slower
            log.debug("agent-saga mcp: uvloop not available (%s): running asyncio's event loop "
                      "(pip install 'agent-saga[fast]' for uvloop's)", exc)
        else:
            return uvloop.new_event_loop
    return asyncio.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop 0.23.0`` or ``asyncio``: what ``loop`` is."""
    module = type(loop).__module__
    if module.split(".", 1)[0] == "uvloop":
        import uvloop  # already imported: it made this loop

        return f"uvloop {getattr(uvloop, '__version__', '')}".strip()
    return "asyncio"
