"""The time-travel debugger: a read-only web view of any WAL (``agent-saga ui``).

A standard-library HTTP server and static HTML, JS and CSS shipped in the package: no
build step, no dependency. It shows every run, each step's semantics, arguments, gate
verdict and the compensation that ran, the chain's state, and the state of every saga as
of any record, all computed from the log (nothing is executed). See docs/ui.md.
"""

from .index import LogIndex, SagaEntry
from .server import DebuggerServer, check_bind, start

__all__ = ["DebuggerServer", "LogIndex", "SagaEntry", "check_bind", "start"]
