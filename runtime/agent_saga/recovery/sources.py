"""Where a daemon reads a log and writes its resolution records.

The parts: ``logsource`` (``LogSource``: verified pages, whole re-reads, re-reads by
place), ``walsource`` (``WALSource``), ``pathsource`` (``PathSource``); re-exported here.

    PathSource(path)   a FileWAL file another process wrote. Read without a lock, page by
                       page from the last offset; written by opening it as a FileWAL once
                       its ``flock`` is free (a lease AND a free flock = the owner is gone)
    WALSource(wal)     any open ``BaseWAL`` (RedisWAL, PostgresWAL, or this process's own
                       FileWAL): read with ``read_since(cursor)``, written with ``append``

Either way the daemon's records continue the log's hash chain (FileWAL: the same chain the
dead process wrote; a fleet log: the daemon's own writer chain), so ``agent-saga inspect``
and ``certify`` see the saga resolved.

Invariants:
- ``read_pages`` hands out each record once, in log order, ``page_size`` at a time,
  verified (``recovery.verified``: digest, chain, sequence, attestations) and then
  decrypted: a read holds one page of decoded records, never the whole log. A record that
  fails, a line that cannot be decoded, or an encrypted payload with no key for it raises
  (the daemon halts: it never acts on what it has not verified, nor on an envelope). A
  torn final fragment is not a record and does not stop the read. What only the whole
  read shows (below) is checked after its last page; nothing read is acted on before.
- When records left the log since the last read (a compaction), ``read_pages`` reads the
  whole log again and says so (a ``LogRead.from_start`` page): the caller starts over
  from it. A whole read that was interrupted is read whole again the next time.
- ``reread`` (where ``rereads``: a RedisWAL) reads a claimed saga's records again by
  their places and checks each is the record verified there (digest, header, and the
  hash the chain verification saw): a changed one halts; a missing one is not acted on,
  and the next read is a whole one (where an unexplained gap halts). The records of the
  sagas a read is asked for (``read_pages(wanted=...)``: the daemon's claimed ones) are
  read with that read's confirmation, in its last request and after every page was
  verified; ``reread`` uses them only for the very places it is asked (a saga that gained
  records in that read is read again whole), only from a read that ended well, and each
  once (``forget`` drops what a claim did not use).
- A fleet log that can confirm a read (``RedisWAL.confirm_read``) is asked to after every
  read, before anything read is handed on: with ``wait_replicas`` the records read must
  be on the replicas (else ``LocationUnavailable``: not acted on, read again next time),
  and the newest record read must still be there (else records were lost from the end,
  a failover or a restore: the log is read again whole, and the anchors halt).
- A fleet log's writer that failed is opened again (``reopen``); the failed one is closed
  once no read still uses it (closing its client would cut a read's connection).
- ``PathSource`` holds the file's writer lock only while resolutions are in hand and for
  at most ``writer_wait`` seconds of waiting: a live owner is never displaced, and a
  restarted owner waits at most one resolution for the lock.
- A log file that cannot be opened, and a log that cannot be written, raise
  ``LocationUnavailable`` naming the path (not a halt: the next sweep tries again).
"""

from __future__ import annotations

from collections.abc import Collection

from .logsource import LogRead, LogSource, WriterBusy
from .pathsource import PathSource
from .walsource import WALSource

__all__ = ["LogRead", "LogSource", "PathSource", "WALSource", "WriterBusy", "keep_set"]


def keep_set(resolved: dict[str, int], now: float, grace_seconds: float, extra: Collection[str]) -> set[str]:
    """Resolved sagas to keep through a compaction: terminal within ``grace_seconds`` of
    ``now`` (epoch seconds), plus ``extra`` (e.g. sagas with open escalations)."""
    cutoff_us = (now - grace_seconds) * 1e6
    keep = {s for s, ts in resolved.items() if ts >= cutoff_us}
    keep.update(s for s in extra if s in resolved)
    return keep
