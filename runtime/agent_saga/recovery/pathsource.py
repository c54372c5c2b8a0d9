"""``PathSource``: recovery over a FileWAL file another process wrote.

Read without a lock, page by page from the last offset; written by opening it as a
FileWAL once its ``flock`` is free (a lease AND a free flock = the owner is gone). The
invariants are in ``recovery.sources``.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import time
from collections.abc import AsyncIterator
from typing import Any

from ..audit.encryption import EncryptedWAL, PayloadEncryptor
from ..errors import ConfigurationError, WALCorrupt
from ..records import decode_line
from ..wal.base import BaseWAL
from .errors import RecoveryHalted, location_error
from .logsource import LogSource, WriterBusy
from .verified import Item, Rescan, VerifiedReads

__all__ = ["PathSource"]

_READ_ONLY_LOG_FIX = (
    "Recovery writes its resolution records into the log itself (they continue its hash "
    "chain), so the log must be writable where recovery runs; a read-only copy can only be "
    "planned over (--dry-run), inspected and verified"
)



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
        super().__init__()
        self.path = os.fspath(path)
        self.encryptor = encryptor
        self.description = self.path
        self.writer_wait = writer_wait
        self._wal_options = wal_options
        self._reads = VerifiedReads(self.path)
        self._offset = 0
        self._line = 0
        self._ino: int | None = None
        self._open_lock = asyncio.Lock()
        self._wal: BaseWAL | None = None
        self._refs = 0

    def _open_log(self) -> Any:
        try:
            return open(self.path, "rb")
        except FileNotFoundError as exc:
            if self._reads.started or self._offset:
                raise RecoveryHalted(
                    f"WAL file {self.path!r} is gone (deleted or moved) after recovery read it; "
                    f"recovery stopped without acting. Find out what happened to the log",
                    location=self.path,
                ) from exc
            raise location_error(
                exc, self.path, "the log", "Check the path (the log appears with the agent's first saga)", verb="read"
            ) from exc
        except OSError as exc:
            raise location_error(exc, self.path, "the log", "Make the file readable by this process", verb="read") from exc

    def _open_at(self, from_start: bool) -> Any:
        f = self._open_log()
        try:
            st = os.fstat(f.fileno())
            if not from_start and self._ino is not None and (st.st_ino != self._ino or st.st_size < self._offset):
                raise Rescan(self.path)  # compaction swapped the file in (or it was cut): read it all
            self._ino = st.st_ino
            f.seek(self._offset)
        except BaseException:
            f.close()
            raise
        return f

    def _next_page(self, f: Any) -> list[Item]:
        """Up to ``page_size`` lines from ``f``; the read position moves past them."""
        out: list[Item] = []
        offset, number = self._offset, self._line
        for line in f:
            if not line.endswith(b"\n"):
                break  # a torn final fragment: never acknowledged, not a record
            number += 1
            offset += len(line)
            location = f"{self.path} line {number}"
            if not line.strip():
                out.append((location, WALCorrupt(f"{location}: empty line inside the log", location=location)))
            else:
                try:
                    out.append((location, decode_line(line, location)))
                except WALCorrupt as exc:
                    out.append((location, exc))
            if len(out) >= self.page_size:
                break
        self._offset, self._line = offset, number
        return out

    async def _fetch_pages(self, from_start: bool) -> AsyncIterator[list[Item]]:
        f = await asyncio.to_thread(self._open_at, from_start)
        try:
            while True:
                page = await asyncio.to_thread(self._next_page, f)
                if not page:
                    return
                yield page
        finally:
            f.close()

    def _rewind(self) -> None:
        self._offset, self._line, self._ino = 0, 0, None

    def _position(self) -> Any:
        return self._offset, self._line, self._ino

    def _set_position(self, position: Any) -> None:
        self._offset, self._line, self._ino = position

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

        try:
            wal = FileWAL(self.path, **self._wal_options)
        except OSError as exc:
            raise location_error(exc, self.path, "the log", _READ_ONLY_LOG_FIX) from exc
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
