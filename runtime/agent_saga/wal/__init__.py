"""Write-ahead log backends behind one interface (``BaseWAL``).

FileWAL is the zero-dependency default. Fleet backends (Redis, PostgreSQL) live in their
own modules and import their client libraries only when used.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from .base import Backpressure as Backpressure
    from .base import BaseWAL as BaseWAL
    from .base import WALStats as WALStats
    from .base import WrappedWAL as WrappedWAL
    from .compaction import CompactionAborted as CompactionAborted
    from .compaction import CompactionReport as CompactionReport
    from .default import get_default_wal as get_default_wal
    from .default import set_default_wal as set_default_wal
    from .file import FileWAL as FileWAL
    from .file import iter_file_records as iter_file_records
    from .file import read_log as read_log
    from .pgsink import PostgresAsyncSink as PostgresAsyncSink
    from .postgres import PostgresWAL as PostgresWAL
    from .prepared import PreparedPayload as PreparedPayload
    from .readers import LogReader as LogReader
    from .readers import open_reader as open_reader
    from .redis import RedisWAL as RedisWAL
    from .sink import AsyncSink as AsyncSink
    from .sink import SinkWAL as SinkWAL
    from .targets import open_wal as open_wal
    from .urls import redact as redact

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".base": ("Backpressure", "BaseWAL", "WALStats", "WrappedWAL"),
    ".compaction": ("CompactionAborted", "CompactionReport"),
    ".default": ("get_default_wal", "set_default_wal"),
    ".file": ("FileWAL", "iter_file_records", "read_log"),
    ".pgsink": ("PostgresAsyncSink",),
    ".postgres": ("PostgresWAL",),
    ".prepared": ("PreparedPayload",),
    ".readers": ("LogReader", "open_reader"),
    ".redis": ("RedisWAL",),
    ".sink": ("AsyncSink", "SinkWAL"),
    ".targets": ("open_wal",),
    ".urls": ("redact",),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
