"""Claims: at most one daemon works on a saga at a time.

A daemon claims a saga (after its owner's lease expired) before writing anything for it,
renews the claim while it works and releases it when done. A claim is itself a lease: a
daemon killed mid-saga loses it when its TTL runs out (or, for a file lock, when the
process dies) and another daemon finishes the saga.

    FileClaimLock(directory)   flock per saga: the default; daemons on one host
    RedisClaimLock(url)        SET NX PX + compare-the-token Lua: a fleet
                               (``agent_saga.recovery.redis``)

Invariants:
- ``acquire`` never waits: it returns a ``Claim`` or ``None`` (someone else holds it).
  A claims directory that cannot be written raises ``LocationUnavailable`` naming it
  (it is created on the first claim, not when the lock is made).
- ``renew`` and ``release`` act only on the caller's own claim (compare the token, then
  act), so a daemon whose claim expired can never extend or free its successor's.
- A claim is necessary, not sufficient: after claiming, the daemon re-reads what was
  written since its scan and the ledger before acting, because the previous holder may
  have finished the saga just before its claim ran out.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from .._identity import process_identity
from .errors import location_error

__all__ = ["Claim", "ClaimLock", "FileClaimLock"]


@dataclass(frozen=True, slots=True)
class Claim:
    """A held claim on ``name``: ``token`` identifies this holder; ``ttl`` is in seconds."""

    name: str
    token: str
    ttl: float


@runtime_checkable
class ClaimLock(Protocol):
    """The lock interface recovery takes (``lock=`` of ``RecoveryDaemon``)."""

    description: str
    #: True if holders on other hosts are excluded too (a fleet needs it).
    shared: bool

    async def acquire(self, name: str, ttl: float) -> Claim | None:
        """Claim ``name`` for ``ttl`` seconds; ``None`` if another holder has it.
        Raises ``ClaimStoreUnavailable`` if the store cannot be reached."""
        ...

    async def renew(self, claim: Claim) -> bool:
        """Extend ``claim`` by its ttl; False if it is no longer ours (expired, taken)."""
        ...

    async def release(self, claim: Claim) -> None:
        """Give ``claim`` up if it is still ours (idempotent)."""
        ...

    async def close(self) -> None:
        """Release every claim held and close connections."""


def new_token(owner: str) -> str:
    """A claim token unique to this acquisition: ``<owner>:<random>``."""
    return f"{owner}:{secrets.token_hex(8)}"


class FileClaimLock:
    """Claims as ``flock``'ed files in ``directory`` (one host; the default).

    A lock dies with its process, so ``ttl`` is not needed for liveness; a claim held by a
    live daemon is never taken over, however long it takes.
    """

    shared = False

    def __init__(self, directory: str | os.PathLike[str], *, owner: str | None = None) -> None:
        self.directory = os.fspath(directory)
        self.description = f"flock files in {self.directory}"
        self.owner = owner or f"pid{process_identity().pid}"
        self._held: dict[str, tuple[int, str]] = {}  # name -> (fd, token)
        self._lock = threading.Lock()

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, hashlib.sha256(name.encode()).hexdigest()[:32] + ".claim")

    async def acquire(self, name: str, ttl: float) -> Claim | None:
        """Take the claim ``name`` for ``ttl`` seconds, or ``None`` if another holds it."""
        try:
            return self._acquire(name, ttl)
        except OSError as exc:
            raise location_error(
                exc, self.directory, "its claims directory",
                "Give recovery a writable claims directory: FileClaimLock(dir) / --claims DIR "
                "on a writable disk, or claims shared through Redis (RedisClaimLock / --redis-url)",
            ) from exc

    def _acquire(self, name: str, ttl: float) -> Claim | None:
        path = self._path(name)
        with self._lock:
            if name in self._held:
                return None  # one holder per process too
            os.makedirs(self.directory, mode=0o700, exist_ok=True)
            for _ in range(10):
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    return None
                try:
                    same = os.stat(path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    token = new_token(self.owner)
                    os.ftruncate(fd, 0)
                    os.pwrite(fd, f"{token} {time.time():.3f}\n".encode(), 0)
                    self._held[name] = (fd, token)
                    return Claim(name, token, ttl)
                os.close(fd)  # a releaser unlinked it between our open and flock: retry
            return None

    async def renew(self, claim: Claim) -> bool:
        """Extend ``claim``; False if it is no longer ours."""
        with self._lock:
            held = self._held.get(claim.name)
            return held is not None and held[1] == claim.token

    async def release(self, claim: Claim) -> None:
        """Give ``claim`` up (only if it is still ours)."""
        with self._lock:
            held = self._held.get(claim.name)
            if held is None or held[1] != claim.token:
                return
            del self._held[claim.name]
            fd = held[0]
            # Unlink while still holding the lock, so the next claimant makes a fresh file
            # (and one that opened the old file notices the inode change and retries).
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._path(claim.name))
            os.close(fd)

    async def close(self) -> None:
        """Release every claim held."""
        with self._lock:
            held, self._held = self._held, {}
        for _name, (fd, _token) in held.items():
            os.close(fd)

    def __repr__(self) -> str:
        return f"<FileClaimLock {self.directory}>"
