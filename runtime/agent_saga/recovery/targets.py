"""Open what a command line names: a log to recover, a ledger and claims to share.

    --wal-path ./agent-saga.wal                       a FileWAL file (PathSource)
    --wal-url  redis://host:6379/0?key=agent-saga:wal  a RedisWAL fleet log (this daemon
                                                       writes its own chain in it)
    --wal-url  postgresql://u@host/db?table=saga_wal   a PostgresWAL fleet log
    --redis-url redis://host:6379/0                    RedisLedger + RedisClaimLock

The WAL is opened by ``agent_saga.wal.open_wal`` (``open_fleet_wal`` is that function);
claims by ``open_claim_lock``: both are ``Backends`` registries (``agent_saga._backends``).
No message built here carries a password (``agent_saga.wal.urls``).
"""

from __future__ import annotations

import os

from .._backends import REDIS_SCHEMES, Address, Backends, split_query
from ..wal.targets import open_wal as open_fleet_wal
from .claims import ClaimLock, FileClaimLock

__all__ = ["CLAIM_LOCKS", "default_file_paths", "open_claim_lock", "open_fleet_wal", "split_query"]

#: Where claims live, by scheme.
CLAIM_LOCKS: Backends[ClaimLock] = Backends("claim store")


@CLAIM_LOCKS.register("file")
def _file_claims(address: Address, *, namespace: str | None = None, owner: str | None = None) -> ClaimLock:
    return FileClaimLock(address.path, owner=owner)


@CLAIM_LOCKS.register(*REDIS_SCHEMES)
def _redis_claims(address: Address, *, namespace: str | None = None, owner: str | None = None) -> ClaimLock:
    from .redis import DEFAULT_NAMESPACE, RedisClaimLock

    return RedisClaimLock(address.url, namespace=namespace or DEFAULT_NAMESPACE, owner=owner)


def open_claim_lock(target: str, *, namespace: str | None = None, owner: str | None = None) -> ClaimLock:
    """Where claims live: a directory or ``file://`` (``FileClaimLock``: daemons on one
    host) or ``redis://`` (``RedisClaimLock``: a fleet; ``namespace`` and ``owner`` as
    there). Raises ``ConfigurationError`` for an unknown scheme."""
    return CLAIM_LOCKS.open(target, namespace=namespace, owner=owner)


def default_file_paths(wal_path: str) -> tuple[str, str]:
    """The default ledger file and claims directory of a file log."""
    p = os.fspath(wal_path)
    return f"{p}.recovery.jsonl", f"{p}.recovery-claims"
