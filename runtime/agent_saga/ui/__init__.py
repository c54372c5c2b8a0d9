"""The time-travel debugger: a read-only web view of any WAL (``agent-saga ui``).

A standard-library HTTP server and static HTML, JS and CSS shipped in the package: no
build step, no dependency. It shows every run, each step's semantics, arguments, gate
verdict and the compensation that ran, the chain's state, and the state of every saga as
of any record, all computed from the log (nothing is executed). See docs/ui.md.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .index import LogIndex as LogIndex
    from .index import SagaEntry as SagaEntry
    from .server import DebuggerServer as DebuggerServer
    from .server import check_bind as check_bind
    from .server import start as start

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".index": ("LogIndex", "SagaEntry"),
    ".server": ("DebuggerServer", "check_bind", "start"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
