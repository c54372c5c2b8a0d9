"""The time-travel debugger: a read-only web view of any WAL (``agent-saga ui``).

A standard-library HTTP server and static HTML, JS and CSS shipped in the package: no
build step, no dependency. It shows every run, each step's semantics, arguments, gate
verdict and the compensation that ran, the chain's state, and the state of every saga as
of any record, all computed from the log (nothing is executed). See docs/ui.md.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .index import LogIndex, SagaEntry
    from .server import DebuggerServer, check_bind, start

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    ".index": ("LogIndex", "SagaEntry"),
    ".server": ("DebuggerServer", "check_bind", "start"),
}

__all__ = ["DebuggerServer", "LogIndex", "SagaEntry", "check_bind", "start"]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
