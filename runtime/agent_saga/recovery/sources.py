"""Where a daemon reads a log and writes its resolution records.

    PathSource(path)   a FileWAL file another process wrote. Read without a lock, page by
                       page from the last offset; written by opening it as a FileWAL once
                       its ``flock`` is free (a lease AND a free flock = the owner is gone)
    WALSource(wal)     any open ``BaseWAL`` (RedisWAL, PostgresWAL, or this process's own
                       FileWAL): read with ``read_since(cursor)``, written with ``append``

Either way the daemon's records continue the log's hash chain (FileWAL: the same chain the
dead process wrote; a fleet log: the daemon's own writer chain), so ``agent-saga inspect``
and ``certify`` see the saga resolved.

Invariants:
- ``read_new`` returns each record once, in log order, with its payload in plaintext; a
  torn final fragment is not a record and does not stop the read; a complete line that
  cannot be decoded raises ``WALCorrupt``, an encrypted payload with no key for it
  ``WALKeyMissing`` (either way the daemon halts: it never acts on an envelope).
- ``PathSource`` holds the file's writer lock only while resolutions are in hand and for
  at most ``writer_wait`` seconds of waiting: a live owner is never displaced, and a
  restarted owner waits at most one resolution for the lock.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator, Collection
from typing import Any

from ..audit.encryption import EncryptedWAL, PayloadEncryptor, decrypt_record
from ..errors import ConfigurationError, WALCorrupt
from ..records import Record, decode_line
from ..wal.base import BaseWAL
from .errors import RecoveryError

__all__ = ["LogSource", "PathSource", "WALSource", "WriterBusy"]


class WriterBusy(RecoveryError):
    """The log's writer lock is held by another live process (its owner or another daemon)."""


class LogSource(abc.ABC):
    """A log a daemon reads and resolves sagas in (see the module doc)."""

    description: str
    #: True if several processes write this log (a RedisWAL/PostgresWAL fleet log).
    fleet: bool = False

    @abc.abstractmethod
    async def read_new(self) -> list[Record]:
        """Records appended since the last call, in log order."""

    @abc.abstractmethod
    def writer(self) -> contextlib.AbstractAsyncContextManager[BaseWAL]:
        """The WAL to append resolution records to, for the duration of the block.
        Raises ``WriterBusy`` if it cannot be had."""

    async def close(self) -> None:
        """Release the log."""
        return None


class WALSource(LogSource):
    """An open ``BaseWAL``; the daemon appends to it directly. Not closed by the daemon.

    Every payload read is checked: an encrypted one halts the daemon (``WALKeyMissing``)
    unless the WAL decrypts it itself (wrap it in ``EncryptedWAL``).
    """

    def __init__(self, wal: BaseWAL) -> None:
        from ..wal.file import FileWAL

        self.wal = wal
        inner = wal.inner if isinstance(wal, EncryptedWAL) else wal
        self.fleet = not isinstance(inner, FileWAL)
        name = getattr(inner, "path", None) or getattr(inner, "name", None) or type(inner).__name__
        self.description = str(name)
        self._cursor = 0

    async def read_new(self) -> list[Record]:
        """The records appended since the last call, in log order."""
        out: list[Record] = []
        async for rec in self.wal.read_since(self._cursor):
            out.append(decrypt_record(rec, None))  # an envelope still here: no key, halt
        if out:
            self._cursor = max(self._cursor, max(BaseWAL.cursor(r) for r in out))
        return out

    @contextlib.asynccontextmanager
    async def writer(self) -> AsyncIterator[BaseWAL]:
        """A writer for the recovery records (held for the block)."""
        yield self.wal


class PathSource(LogSource):
    """A FileWAL file written by another process (see the module doc).

    Args:
        path: the log file.
        writer_wait: how long to wait for the file's writer lock before giving up on a
            resolution (``WriterBusy``), in seconds.
        encryptor: the key(s) of an encrypted log (``agent_saga.audit.encryption``):
            records are decrypted as they are read and the daemon's own records encrypted.
            Without one, the first encrypted record halts the daemon (``WALKeyMissing``).
        wal_options: keyword arguments for the ``FileWAL`` the daemon opens to write.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        writer_wait: float = 2.0,
        encryptor: PayloadEncryptor | None = None,
        **wal_options: Any,
    ) -> None:
        self.path = os.fspath(path)
        self.encryptor = encryptor
        self.description = self.path
        self.writer_wait = writer_wait
        self._wal_options = wal_options
        self._offset = 0
        self._line = 0
        self._ino: int | None = None
        self._last_seq = 0
        self._open_lock = asyncio.Lock()
        self._wal: BaseWAL | None = None
        self._refs = 0

    def _read_new_sync(self) -> list[Record]:
        try:
            f = open(self.path, "rb")
        except FileNotFoundError as exc:
            raise ConfigurationError(f"WAL file {self.path!r} does not exist; check --wal-path") from exc
        out: list[Record] = []
        with f:
            st = os.fstat(f.fileno())
            if self._ino is not None and (st.st_ino != self._ino or st.st_size < self._offset):
                # Compaction swapped the file in (sequences are kept): read it again and
                # skip what was already read.
                self._offset, self._line = 0, 0
            self._ino = st.st_ino
            f.seek(self._offset)
            for line in f:
                if not line.endswith(b"\n"):
                    break  # a torn final fragment: never acknowledged, not a record
                self._line += 1
                self._offset += len(line)
                location = f"{self.path} line {self._line}"
                if not line.strip():
                    raise WALCorrupt(f"{location}: empty line inside the log", location=location)
                rec = decode_line(line, location)
                if rec.seq <= self._last_seq:
                    continue
                self._last_seq = rec.seq
                out.append(decrypt_record(rec, self.encryptor))
        return out

    async def read_new(self) -> list[Record]:
        """The records appended since the last call, in log order."""
        return await asyncio.to_thread(self._read_new_sync)

    def _lock_free(self) -> bool:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        finally:
            os.close(fd)  # releases our probe lock, if taken
        return True

    def _open_wal(self) -> BaseWAL:
        from ..wal.file import FileWAL

        wal = FileWAL(self.path, **self._wal_options)
        return wal if self.encryptor is None else EncryptedWAL(wal, self.encryptor)

    async def _acquire(self) -> BaseWAL:
        async with self._open_lock:
            if self._wal is None:
                deadline = time.monotonic() + self.writer_wait
                while True:
                    if self._lock_free():
                        try:
                            self._wal = await asyncio.to_thread(self._open_wal)
                            break
                        except ConfigurationError:
                            pass  # taken between the probe and the open
                    if time.monotonic() >= deadline:
                        raise WriterBusy(
                            f"WAL {self.path!r} is held by another live process (its owner, or "
                            f"another daemon) for more than {self.writer_wait}s; its sagas are "
                            f"left for a later sweep. A live owner is never displaced: run "
                            f"RecoveryDaemon(wal=...) inside that process to recover its "
                            f"earlier incarnation's sagas"
                        )
                    await asyncio.sleep(0.01)
            self._refs += 1
            return self._wal

    async def _release(self) -> None:
        async with self._open_lock:
            self._refs -= 1
            if self._refs == 0 and self._wal is not None:
                wal, self._wal = self._wal, None
                await asyncio.to_thread(wal.close)

    @contextlib.asynccontextmanager
    async def writer(self) -> AsyncIterator[BaseWAL]:
        """This daemon's writer on the fleet log."""
        wal = await self._acquire()
        try:
            yield wal
        finally:
            await self._release()

    async def close(self) -> None:
        """Close the writer and the reader."""
        async with self._open_lock:
            if self._wal is not None:
                wal, self._wal, self._refs = self._wal, None, 0
                await asyncio.to_thread(wal.close)


def keep_set(resolved: dict[str, int], now: float, grace_seconds: float, extra: Collection[str]) -> set[str]:
    """Resolved sagas to keep through a compaction: terminal within ``grace_seconds`` of
    ``now`` (epoch seconds), plus ``extra`` (e.g. sagas with open escalations)."""
    cutoff_us = (now - grace_seconds) * 1e6
    keep = {s for s, ts in resolved.items() if ts >= cutoff_us}
    keep.update(s for s in extra if s in resolved)
    return keep
