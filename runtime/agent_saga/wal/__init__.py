"""Write-ahead log backends behind one interface (``BaseWAL``).

FileWAL is the zero-dependency default. Fleet backends (Redis, PostgreSQL) live in their
own modules and import their client libraries only when used.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .base import Backpressure, BaseWAL, WALStats, WrappedWAL
    from .compaction import CompactionAborted, CompactionReport
    from .default import get_default_wal, set_default_wal
    from .file import FileWAL, read_log
    from .pgsink import PostgresAsyncSink
    from .postgres import PostgresWAL
    from .prepared import PreparedPayload
    from .readers import LogReader, open_reader
    from .redis import RedisWAL
    from .sink import AsyncSink, SinkWAL
    from .targets import open_wal

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    ".base": ("Backpressure", "BaseWAL", "WALStats", "WrappedWAL"),
    ".compaction": ("CompactionAborted", "CompactionReport"),
    ".default": ("get_default_wal", "set_default_wal"),
    ".file": ("FileWAL", "read_log"),
    ".pgsink": ("PostgresAsyncSink",),
    ".postgres": ("PostgresWAL",),
    ".prepared": ("PreparedPayload",),
    ".readers": ("LogReader", "open_reader"),
    ".redis": ("RedisWAL",),
    ".sink": ("AsyncSink", "SinkWAL"),
    ".targets": ("open_wal",),
}

__all__ = [
    "AsyncSink",
    "Backpressure",
    "BaseWAL",
    "CompactionAborted",
    "CompactionReport",
    "FileWAL",
    "LogReader",
    "PostgresAsyncSink",
    "PostgresWAL",
    "PreparedPayload",
    "RedisWAL",
    "WALStats",
    "WrappedWAL",
    "get_default_wal",
    "open_reader",
    "open_wal",
    "read_log",
    "SinkWAL",
    "set_default_wal",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
