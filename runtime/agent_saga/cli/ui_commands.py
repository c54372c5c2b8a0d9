"""``agent-saga ui``: the time-travel debugger (``agent_saga.ui``), served until Ctrl-C."""

from __future__ import annotations

from typing import Any

from ..ui.command import add_arguments, cmd_ui


def register(sub: Any) -> None:
    """Add ``ui`` to the command line."""
    p = sub.add_parser("ui", help="serve the read-only time-travel debugger for a log")
    add_arguments(p)
    p.set_defaults(handler=cmd_ui)
