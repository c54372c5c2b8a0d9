"""Write-ahead log backends behind one interface (``BaseWAL``).

FileWAL is the zero-dependency default. Fleet backends (Redis, PostgreSQL) live in their
own modules and import their client libraries only when used.
"""

from .base import Backpressure, BaseWAL, WALStats
from .default import get_default_wal, set_default_wal
from .file import FileWAL

__all__ = ["Backpressure", "BaseWAL", "FileWAL", "WALStats", "get_default_wal", "set_default_wal"]
