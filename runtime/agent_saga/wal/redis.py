"""RedisWAL: one hash-chained Redis Stream per writer, globally ordered by ``gseq``.

Keys (``key`` defaults to ``agent-saga:wal``; for Redis Cluster give it a hash tag such as
``{agent-saga}:wal`` so every key below is in one slot)::

    {key}:w:{writer}   STREAM  one entry per record: id "<gseq>-0", field r = the record line
    {key}:gseq         STRING  the global sequence counter (INCRBY once per batch)
    {key}:writers      SET     every writer id that has written
    {key}:quarantine   HASH    writer id -> {"by", "reason", "ts"}: writers an operator
                               quarantined (``agent-saga wal quarantine``); not read
    {key}:quarantine:journal  STREAM  every quarantine and lift: who, why, when

Writer ids (``wal.writers``): ``<namespace>/<pod>[@suffix]`` is an agent identity's
writer, the only streams that identity's Redis ACL user may append to
(``plane._acl.wal_append_rules``); ids without a ``/`` are service writers (recovery).

Invariants:
- The field ``r`` holds exactly the line FileWAL would write (``records.encode_line``),
  so one writer's stream verifies with the same ``chain.verify_records`` as a file. The
  ``gseq`` (the entry id) and the ``writer`` (the stream) are stamped into
  ``Record.extra`` by the reader, never hashed.
- A batch is one Lua script (``APPEND``), run atomically: check the fence, take ``n``
  global sequences with one INCRBY, XADD the ``n`` records. Group commit: one round trip
  per batch; with ``wait_replicas=N``, ``WAIT N timeout`` follows on the same connection
  (the flusher's own: WAIT covers exactly the writes made on it). The scripts go through
  redis-py's ``register_script`` (``agent_saga._redis``), which reloads a script the
  server forgot (NOSCRIPT: it did not run, so re-sending is safe).
- Fence: the script refuses a batch unless the stream still ends at the entry this writer
  last wrote. Two processes using one writer id, or a Redis that lost acknowledged
  entries, fail loudly instead of forking or silently re-growing the chain.
- Reads merge every writer's stream by ``gseq`` up to the counter's value read first.
  Because a batch takes its ``gseq`` and becomes visible in one atomic script, no record
  with a lower ``gseq`` can appear later: ``read_since(gseq)`` is a consistent cursor.
- Fail-stop, like FileWAL: a failed round trip fails the writer; every waiter gets
  ``WALError`` chained to the real ``redis`` error. The failed batch is in doubt (it may
  have landed): open a new RedisWAL with the same ``writer`` to continue from what Redis
  holds. No acknowledged record is dropped; no unacknowledged record is ever reported
  durable. redis-py's own retries are disabled on clients this class creates, so a batch
  is never re-sent behind the writer's back.
- In doubt, settled by reading back: ``settle()`` reads the stream's tail once Redis
  answers again and says whether the failed batch landed, did not land, or cannot be
  told (another process wrote with this writer id; a write still in flight). Only a
  settled writer may be replaced by a new one (``plane`` does so for an agent's WAL).

Durability class: ``barrier`` means Redis acknowledged the batch, which is weaker than
fsync: the entry is in the server's memory, on disk only per its AOF setting
(``appendonly yes`` + ``appendfsync always`` fsyncs before replying; ``everysec`` may
lose about a second), and on replicas only with ``wait_replicas``. See
docs/wal-backends.md before putting money through it.
"""

from __future__ import annotations

import heapq
import json
import logging
from collections import deque
from collections.abc import Iterator
from typing import Any

from .._redis import (
    Target,
    connect,
    dedicated,
    failures,
    import_redis,
    is_cluster,
    one_slot,
    script,
)
from ..chain import seal
from ..errors import ConfigurationError, WALCorrupt, WALError, WALStalled
from ..records import Record, decode_line, encode_line, validate_id
from .base import Backpressure, FaultHook
from .batching import BatchingWAL, Sealed, SealedLines, SharedLogReads, default_writer_id
from .compaction import (
    CompactionAborted,
    CompactionPlan,
    CompactionReport,
    CompactionRequest,
    resolved_sagas,
)
from .writers import check_identity, identity_writer, is_identity_writer, writer_of_identity

log = logging.getLogger("agent_saga.wal")

DEFAULT_KEY = "agent-saga:wal"


def _gseq_of(entry_id: bytes | str) -> int:
    s = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(s.split("-", 1)[0])


class RedisLog:
    """The read side of a Redis WAL (synchronous; used by RedisWAL and the CLI).

    ``where`` is the password-free name of the server used in locations and messages.
    """

    def __init__(self, client: Any, key: str, where: str) -> None:
        self.client = client
        self.key = key
        self.where = where
        self.gseq_key = f"{key}:gseq"
        self.writers_key = f"{key}:writers"
        self.quarantine_key = f"{key}:quarantine"

    def stream(self, writer: str) -> str:
        """The stream key of ``writer``."""
        return f"{self.key}:w:{writer}"

    def writers(self) -> list[str]:
        """Every writer id that has written to this log, sorted."""
        return sorted(w.decode() if isinstance(w, bytes) else w for w in self.client.smembers(self.writers_key))

    def high_water(self) -> int:
        """The global sequence counter's value (every ``gseq`` at most this)."""
        v = self.client.get(self.gseq_key)
        return int(v) if v is not None else 0

    def _decode(self, writer: str, entry: Any) -> tuple[str, Record | WALCorrupt]:
        entry_id, fields = entry
        eid = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
        location = f"{self.where} stream {self.stream(writer)} entry {eid}"
        line = fields.get(b"r", fields.get("r"))
        if line is None:
            return location, WALCorrupt(f"{location}: entry has no record field 'r'", location=location)
        try:
            rec = decode_line(line, location)
        except WALCorrupt as exc:
            return location, exc
        rec.extra["gseq"] = _gseq_of(eid)
        rec.extra["writer"] = writer
        return location, rec

    def tail(self, writer: str) -> tuple[str, tuple[str, Record | WALCorrupt] | None]:
        """``(last entry id or "0-0", decoded last entry or None)`` of ``writer``'s stream."""
        last = self.client.xrevrange(self.stream(writer), "+", "-", count=1)
        if not last:
            return "0-0", None
        eid = last[0][0]
        return (eid.decode() if isinstance(eid, bytes) else eid), self._decode(writer, last[0])

    def entries(self, writer: str, page_size: int = 1000) -> Iterator[tuple[str, str, Record | WALCorrupt]]:
        """``(entry id, location, record-or-error)`` of one writer's chain, in order."""
        stream = self.stream(writer)
        start = "-"
        while True:
            page = self.client.xrange(stream, start, "+", count=page_size)
            for entry in page:
                eid = entry[0].decode() if isinstance(entry[0], bytes) else entry[0]
                location, item = self._decode(writer, entry)
                yield eid, location, item
            if len(page) < page_size:
                return
            last = page[-1][0]
            start = "(" + (last.decode() if isinstance(last, bytes) else last)

    def chain(self, writer: str, page_size: int = 1000) -> Iterator[tuple[str, Record | WALCorrupt]]:
        """``(location, record-or-error)`` of one writer's chain: what ``verify_records`` takes."""
        for _eid, location, item in self.entries(writer, page_size):
            yield location, item

    def records_at(self, places: list[tuple[str, int]]) -> list[tuple[str, Record | WALCorrupt | None]]:
        """``(location, record-or-error, or None if gone)`` of each ``(writer, gseq)``, read
        in one round trip (a claimed saga's few records, read again before acting)."""
        pipe = self.client.pipeline(transaction=False)
        self.queue_records_at(pipe, places)
        return self.decode_records_at(places, pipe.execute())

    def queue_records_at(self, pipe: Any, places: list[tuple[str, int]]) -> None:
        """Queue the reads of ``records_at(places)`` on ``pipe`` (one reply each)."""
        for w, g in places:
            pipe.xrange(self.stream(w), f"{g}-0", f"{g}-0", count=1)

    def decode_records_at(
        self, places: list[tuple[str, int]], pages: list[Any]
    ) -> list[tuple[str, Record | WALCorrupt | None]]:
        """The replies of ``queue_records_at``, decoded as ``records_at`` returns them."""
        out: list[tuple[str, Record | WALCorrupt | None]] = []
        for (w, g), page in zip(places, pages, strict=True):
            if page:
                out.append(self._decode(w, page[0]))
            else:
                out.append((f"{self.where} stream {self.stream(w)} entry {g}-0", None))
        return out

    def quarantined(self) -> dict[str, dict[str, Any]]:
        """The quarantined writers of this log: writer id -> ``{by, reason, ts}``."""
        return _quarantine_of(self.client.hgetall(self.quarantine_key))

    def quarantine(self, writer: str, *, by: str, reason: str, ts: float, lift: bool = False) -> None:
        """Quarantine ``writer`` (an agent identity writer), or ``lift`` its quarantine;
        either is journaled in ``<key>:quarantine:journal`` in the same transaction."""
        entry = {"v": 1, "writer": writer, "by": by, "reason": reason, "ts": ts,
                 "action": "lift" if lift else "quarantine"}
        pipe = self.client.pipeline(transaction=True)
        if lift:
            pipe.hdel(self.quarantine_key, writer)
        else:
            pipe.hset(self.quarantine_key, writer, json.dumps({k: entry[k] for k in ("by", "reason", "ts")}))
        pipe.xadd(f"{self.quarantine_key}:journal", {"e": json.dumps(entry, sort_keys=True)})
        pipe.execute()

    def pages_since(
        self,
        cursor: int,
        page_size: int = 1000,
        *,
        broken: dict[str, WALCorrupt] | None = None,
        skip: frozenset[str] = frozenset(),
        quarantined: dict[str, dict[str, Any]] | None = None,
    ) -> Iterator[list[Record]]:
        """Every writer's records with ``gseq > cursor``, merged in ``gseq`` order, in pages.

        Stops at the counter's value read first (see the module doc: a consistent cursor).
        Raises ``WALCorrupt`` on an entry that cannot be read, unless ``broken`` is given:
        then the writer whose entry it is goes into ``broken`` and nothing more of it is
        read (the others are). Writers in ``skip`` are not read; with ``quarantined``
        given, it receives the log's quarantined identity writers, which are not read
        either (read in the same round trip as the counter).
        """
        # The counter and the writer set in one round trip (a read costs one per refresh).
        pipe = self.client.pipeline(transaction=False)
        pipe.get(self.gseq_key)
        pipe.smembers(self.writers_key)
        if quarantined is not None:
            pipe.hgetall(self.quarantine_key)
        top, members, *held = pipe.execute()
        if quarantined is not None:
            quarantined.update(_quarantine_of(held[0]))
            skip = skip | quarantined.keys()
        hwm = int(top) if top is not None else 0
        if hwm <= cursor:
            return
        writers = sorted(w for w in (m.decode() if isinstance(m, bytes) else m for m in members) if w not in skip)
        bufs: dict[str, deque[Record]] = {w: deque() for w in writers}
        pos = dict.fromkeys(writers, cursor)
        live = set(writers)
        heap: list[tuple[int, str]] = []

        def refill(ws: list[str]) -> None:
            pipe = self.client.pipeline(transaction=False)
            for w in ws:
                pipe.xrange(self.stream(w), f"({pos[w]}-0", f"{hwm}-0", count=page_size)
            for w, page in zip(ws, pipe.execute(), strict=True):
                buf = bufs[w]
                for entry in page:
                    eid, fields = entry
                    line = fields.get(b"r")
                    if line is not None and eid.__class__ is bytes:
                        # The common entry: its location is built only if it cannot be read.
                        try:
                            rec = decode_line(line, "")
                        except WALCorrupt:
                            pass
                        else:
                            extra = rec.extra
                            extra["gseq"] = int(eid.split(b"-", 1)[0])
                            extra["writer"] = w
                            buf.append(rec)
                            continue
                    _loc, item = self._decode(w, entry)
                    if isinstance(item, WALCorrupt):
                        if broken is None:
                            raise item
                        broken[w] = item  # this writer is read no further; the others are
                        break
                    buf.append(item)
                if page:
                    pos[w] = _gseq_of(page[-1][0])
                if len(page) < page_size or (broken is not None and w in broken):
                    live.discard(w)
                if bufs[w]:
                    heapq.heappush(heap, (bufs[w][0].extra["gseq"], w))

        if writers:
            refill(writers)
        out: list[Record] = []
        while heap:
            _, w = heapq.heappop(heap)
            out.append(bufs[w].popleft())
            if bufs[w]:
                heapq.heappush(heap, (bufs[w][0].extra["gseq"], w))
            elif w in live:
                refill([w])
            if len(out) >= page_size:
                yield out
                out = []
        if out:
            yield out


class RedisWAL(SharedLogReads, BatchingWAL):
    """A hash-chained log in a Redis Stream per writer; ``barrier`` means Redis acknowledged.

    Args:
        target: a ``redis://`` / ``rediss://`` / ``unix://`` / ``redis+sentinel://`` /
            ``redis+cluster://`` URL (may carry a password, which never appears in a
            record, log line or message), or a synchronous ``redis.Redis`` (or
            ``RedisCluster``) client (its retry policy is yours; the fence still refuses
            a duplicated batch).
        key: the key prefix of this log (see the module doc).
        writer: this writer's id (default ``default_writer_id()``, unique per process).
            Reopening a writer id continues its sequence and chain from Redis.
        identity: the agent identity ``<namespace>/<pod>`` this process writes as: the
            writer id is then ``<identity>@<pid>-<random>`` (or ``writer``, which must be
            ``identity`` or ``identity@SUFFIX``), the only streams that identity's ACL
            user may append to, and the sagas it starts are bound to it
            (``wal.writers``). Writer ids without a ``/`` are service writers (recovery).
        wait_replicas: with N > 0 every batch is followed by ``WAIT N wait_timeout_ms`` in
            the same round trip; fewer acknowledgements fail the writer with
            ``WALStalled`` (the batch is on the primary, not on N replicas). Behind
            Sentinel this is what makes an acknowledged record survive a failover
            (docs/ha-redis.md). Not available on a Redis Cluster (``ConfigurationError``).
        socket_timeout: bound on one round trip, in seconds (then the writer fails).
        max_pending, backpressure, stall_timeout, fault_hook: as for FileWAL.
        max_batch: records per round trip at most.

    Raises ``ConfigurationError`` on bad arguments or a missing ``redis`` package,
    ``WALError`` if Redis cannot be reached, ``WALCorrupt`` if the writer's last entry
    cannot be read.
    """

    backend = "redis"
    _writes_lines = True

    # KEYS[1] this writer's stream, KEYS[2] the gseq counter, KEYS[3] the writer registry
    # ARGV[1] writer id, ARGV[2] the stream's last entry id as this writer knows it
    # ("0-0" for a new stream), ARGV[3] the batch's record lines in seq order, joined by
    # newlines (a line holds none: one argument for the client to pack, not one a line).
    # Returns the gseq of the batch's last record; entry ids are "<gseq>-0".
    APPEND = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local last_id = '0-0'
if last[1] then last_id = last[1][1] end
if last_id ~= ARGV[2] then
  return redis.error_reply('FENCED ' .. last_id)
end
local data = ARGV[3]
local lines = {}
local pos = 1
while true do
  local e = string.find(data, '\\n', pos, true)
  if not e then
    lines[#lines + 1] = string.sub(data, pos)
    break
  end
  lines[#lines + 1] = string.sub(data, pos, e - 1)
  pos = e + 1
end
local n = #lines
local top = redis.call('INCRBY', KEYS[2], n)
for i = 1, n do
  redis.call('XADD', KEYS[1], string.format('%d-0', top - n + i), 'r', lines[i])
end
redis.call('SADD', KEYS[3], ARGV[1])
return top
"""

    # KEYS as APPEND. ARGV[1] writer id, ARGV[2] expected last entry id, ARGV[3] MINID
    # below which every entry goes ('' for none), ARGV[4] the attestation line,
    # ARGV[5..] further entry ids to delete. Atomic: the removal and the attestation land
    # together or not at all. Returns the attestation's gseq.
    COMPACT = """
local last = redis.call('XREVRANGE', KEYS[1], '+', '-', 'COUNT', 1)
local last_id = '0-0'
if last[1] then last_id = last[1][1] end
if last_id ~= ARGV[2] then
  return redis.error_reply('FENCED ' .. last_id)
end
if ARGV[3] ~= '' then redis.call('XTRIM', KEYS[1], 'MINID', ARGV[3]) end
local ids = {}
for i = 5, #ARGV do
  ids[#ids + 1] = ARGV[i]
  if #ids == 500 then
    redis.call('XDEL', KEYS[1], unpack(ids))
    ids = {}
  end
end
if #ids > 0 then redis.call('XDEL', KEYS[1], unpack(ids)) end
local g = redis.call('INCRBY', KEYS[2], 1)
redis.call('XADD', KEYS[1], string.format('%d-0', g), 'r', ARGV[4])
redis.call('SADD', KEYS[3], ARGV[1])
return g
"""

    def __init__(
        self,
        target: str | Any,
        *,
        key: str = DEFAULT_KEY,
        writer: str | None = None,
        identity: str | None = None,
        wait_replicas: int = 0,
        wait_timeout_ms: int = 1000,
        socket_timeout: float = 10.0,
        max_pending: int = 100_000,
        backpressure: Backpressure = Backpressure.RAISE,
        stall_timeout: float = 30.0,
        max_batch: int = 1000,
        fault_hook: FaultHook | None = None,
    ) -> None:
        redis = import_redis("RedisWAL")
        if wait_replicas < 0:
            raise ConfigurationError(f"wait_replicas must be >= 0, got {wait_replicas}")
        if wait_timeout_ms < 1:
            # WAIT with 0 blocks forever: every fence must be bounded.
            raise ConfigurationError(f"wait_timeout_ms must be >= 1, got {wait_timeout_ms}")
        if not key or any(c in key for c in " \n\r"):
            raise ConfigurationError(f"key {key!r} must be a non-empty Redis key without spaces")
        self.writer = _writer_id(writer, identity)
        self.key = key
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        client, target_of, self._owns_client = _make_client(redis, target, socket_timeout)
        if wait_replicas and is_cluster(client):
            if self._owns_client:
                client.close()
            raise ConfigurationError(
                "wait_replicas is not available on a Redis Cluster: WAIT must run on the connection "
                "that wrote, and a cluster client spreads commands over nodes; use Sentinel "
                "(redis+sentinel://) for replica-confirmed WAL writes, or wait_replicas=0")
        where, scrub = target_of.where, target_of.scrub
        self._redis_errors: tuple[type[BaseException], ...] = failures(redis)
        self._read_errors: tuple[type[BaseException], ...] = (WALCorrupt, *self._redis_errors)
        self._probe_errors: tuple[type[BaseException], ...] = (*self._redis_errors, AttributeError)
        self._client = client
        self._log = RedisLog(client, key, where)
        self._stream = self._log.stream(self.writer)
        self._keys = [self._stream, self._log.gseq_key, self._log.writers_key]
        if is_cluster(client):
            try:
                one_slot(self._keys, f"RedisWAL key {key!r}")
            except ConfigurationError:
                if self._owns_client:
                    client.close()
                raise
        super().__init__(
            name=f"{where} stream {self._stream}",
            scrub=scrub,
            max_pending=max_pending,
            backpressure=backpressure,
            stall_timeout=stall_timeout,
            max_batch=max_batch,
            fault_hook=fault_hook,
        )
        self._flush_client: Any = None
        # The batch the flusher is writing: (entry id before it, its last seq and hash).
        # Left set when the write fails: that batch is in doubt until ``settle``.
        self._in_doubt: tuple[str, int, str] | None = None
        self._writing = False
        try:
            last_id, tail = self._log.tail(self.writer)
            self.durability = self._probe_durability()
            # The flusher's own connection, held for the writer's life: no pool round trip
            # per batch, nothing else interleaves commands on it, and WAIT covers its writes.
            self._flush_client = dedicated(client)
            self._scripts = {"APPEND": script(self._flush_client, self.APPEND),
                             "COMPACT": script(self._flush_client, self.COMPACT)}
        except self._redis_errors as exc:
            self._close_client()
            raise WALError(
                f"cannot open RedisWAL: Redis at {where} failed: {scrub(f'{type(exc).__name__}: {exc}')}"
            ) from exc
        self._last_id = last_id
        self._start_from(tail)

    # ------------------------------------------------------------------ I/O

    def _probe_durability(self) -> str:
        base = (
            "redis: barrier returns after Redis acknowledged the batch (weaker than fsync: "
            "in the server's memory, on disk only per its AOF setting)"
        )
        try:
            cfg = self._client.config_get("append*")
            ao = _text(cfg.get(b"appendonly", cfg.get("appendonly", "?")))
            af = _text(cfg.get(b"appendfsync", cfg.get("appendfsync", "?")))
            server = f"appendonly={ao} appendfsync={af}"
        except self._probe_errors:  # AttributeError: a cluster may answer per node
            ao, server = "?", "AOF setting unknown (CONFIG GET refused)"
        if self.wait_replicas:
            base += f", and after {self.wait_replicas} replica(s) acknowledged it (WAIT)"
        elif ao == "no":
            log.warning(
                "RedisWAL %s: the server has appendonly=no and wait_replicas=0, so a Redis "
                "restart loses acknowledged records; turn on AOF (appendfsync always) or WAIT",
                self.name,
            )
        return f"{base} [{server}]"

    def _call(self, name: str, args: list[Any]) -> Any:
        """Run the script ``name`` on the flusher's connection, then WAIT when configured."""
        redis = import_redis("RedisWAL")
        flusher = self._flush_client
        try:
            try:
                out = self._scripts[name](keys=self._keys, args=args, client=flusher)
            except redis.exceptions.ResponseError as exc:
                if str(exc).startswith("FENCED"):
                    raise WALError(
                        f"WAL {self.name}: the stream ends at entry {str(exc).split()[-1]}, not "
                        f"{self._last_id} as this writer last wrote: another process writes with "
                        f"writer id {self.writer!r}, or Redis lost acknowledged entries (a "
                        f"restart without AOF). Nothing was written; open a new RedisWAL to "
                        f"continue from what Redis holds"
                    ) from exc
                raise
            acks = flusher.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms) \
                if self.wait_replicas else None
        except (WALError, redis.exceptions.ResponseError):
            raise  # an error reply: the connection is in step
        except BaseException:
            conn = getattr(flusher, "connection", None)
            if conn is not None:  # a reply may be pending on it: never reuse it in that state
                conn.disconnect()
            raise
        if acks is not None and int(acks) < self.wait_replicas:
            raise WALStalled(
                f"WAL {self.name}: only {acks} of {self.wait_replicas} replicas acknowledged "
                f"within {self.wait_timeout_ms} ms; the batch is on the primary but not "
                f"replicated as required"
            )
        return out

    def confirm_read(self, last: tuple[str, int] | None) -> bool:
        """Confirm a read before anyone acts on it: is ``last`` (the ``(writer, gseq)`` of
        the newest record read) still in the log, and, with ``wait_replicas=N``, is
        everything read on N replicas? One round trip.

        A reader can see a batch the primary holds before its replicas do (its writer is
        still waiting for ``WAIT``); a failover then loses it and the new primary hands
        its ``gseq`` to other records, which a reader whose cursor passed it would never
        see. With ``wait_replicas=N`` this writes nothing new (``INCRBY gseq 0``) and
        ``WAIT N``s on that connection: the replication stream is ordered, so every record
        read before the call is on N replicas once it returns; fewer acknowledgements
        raise ``WALStalled`` (nothing read may be acted on yet). ``False``: the record is
        gone, records were lost from the log's end (read it again whole). Raises
        one of ``failures(redis)`` if Redis cannot be reached."""
        return self.confirm_read_at(last, [])[0]

    def confirm_read_at(
        self, last: tuple[str, int] | None, places: list[tuple[str, int]]
    ) -> tuple[bool, list[tuple[str, Record | WALCorrupt | None]]]:
        """``confirm_read(last)`` and ``RedisLog.records_at(places)`` in the same round
        trip: a reader that must read some records again right after a read (a recovery
        daemon's claimed sagas) pays one request for both. The records are read after
        ``WAIT`` returned (the pipeline runs in order)."""
        if not (self.wait_replicas or last is not None or places):
            return True, []
        pipe = self._client.pipeline(transaction=False)
        if self.wait_replicas:
            pipe.incrby(self._log.gseq_key, 0)
            pipe.execute_command("WAIT", self.wait_replicas, self.wait_timeout_ms)
        if last is not None:
            pipe.xrange(self._log.stream(last[0]), f"{last[1]}-0", f"{last[1]}-0", count=1)
        self._log.queue_records_at(pipe, places)
        out = pipe.execute()
        if self.wait_replicas and int(out[1]) < self.wait_replicas:
            raise WALStalled(
                f"WAL {self.name}: what was read is on {out[1]} of {self.wait_replicas} replicas "
                f"after {self.wait_timeout_ms} ms; a failover could still lose it, so it is not "
                f"acted on yet")
        n = 2 * bool(self.wait_replicas) + (last is not None)
        kept = last is None or bool(out[n - 1])
        return kept, self._log.decode_records_at(places, out[n:])

    def _write_batch(self, sealed: Sealed) -> None:
        if sealed.__class__ is SealedLines:  # the lines built as the batch was sealed
            data = "\n".join(sealed.lines).encode()
        else:
            data = b"".join([encode_line(rec, canonical) for rec, canonical in sealed])[:-1]
        last = sealed[-1][0]
        top = self._doubtful("APPEND", [self.writer, self._last_id, data], last.seq, last.hash)
        self._last_id = f"{int(top)}-0"

    def _doubtful(self, name: str, args: list[Any], seq: int, hash_: str) -> Any:
        """``_call`` for a write whose last record is ``(seq, hash_)``: in doubt until it returns."""
        self._in_doubt, self._writing = (self._last_id, seq, hash_), True
        try:
            out = self._call(name, args)
        finally:
            self._writing = False
        self._in_doubt = None
        return out

    def settle(self) -> str | None:
        """After the writer failed, read the stream's tail back and say whether every
        record's outcome is known: ``None`` when it is (nothing was in doubt, the batch in
        doubt landed whole, or it did not land), else why not. Redis losing entries it had
        acknowledged (a restart without AOF) is known too, and logged as an error: the
        stream ends before this writer's last write, so nothing after it is in the log.

        Raises ``WALError`` when Redis cannot be read (not back yet)."""
        if self._writing:
            return "a write is still in flight (the writer stalled in it): its outcome is not known yet"
        doubt = self._in_doubt
        if doubt is None:
            return None
        before, seq, hash_ = doubt
        try:
            last_id, tail = self._log.tail(self.writer)
        except self._redis_errors as exc:
            raise WALError(f"WAL {self.name}: cannot read the stream back: "
                           f"{self._scrub(f'{type(exc).__name__}: {exc}')}") from exc
        if last_id == before:
            return None  # the batch did not land
        item = None if tail is None else tail[1]
        if isinstance(item, Record) and item.seq == seq and item.hash == hash_:
            return None  # it landed whole (a batch is one script: all or nothing)
        if tail is None or _gseq_of(last_id) < _gseq_of(before):
            log.error("WAL %s: Redis lost entries it had acknowledged (the stream ends at %s, this writer last "
                      "wrote %s): a restart without AOF; the records after it are not in the log", self.name,
                      last_id, before)
            return None
        return (f"the stream ends at entry {last_id}, which this writer did not write (it last wrote {before}, "
                f"then seq {seq}): another process writes with writer id {self.writer!r}")

    def _compact_now(self, req: CompactionRequest, prev: str) -> tuple[CompactionReport, str]:
        try:
            resolved: set[str] = set()
            for w in self._log.writers():
                resolved |= resolved_sagas(_records(self._log.chain(w)))
            plan = CompactionPlan(resolved, req.keep_sagas)
            minid = ""
            dels: list[str] = []
            prefix = True
            for eid, _loc, item in self._log.entries(self.writer):
                if isinstance(item, WALCorrupt):
                    raise item
                if plan.offer(item):
                    if prefix:
                        minid, prefix = eid, False
                elif not prefix:
                    dels.append(eid)
            if prefix and plan.removed:
                minid = f"{_gseq_of(self._last_id) + 1}-0"  # every entry goes
            rec = plan.attestation(req.seq)
            canonical = seal(rec, prev)
            line = encode_line(rec, canonical)[:-1]
        except self._read_errors as exc:
            raise CompactionAborted(
                f"compaction of {self.name} read failed, nothing was changed: "
                f"{self._scrub(f'{type(exc).__name__}: {exc}')}"
            ) from exc
        if not plan.removed:
            minid = ""
        g = self._doubtful("COMPACT", [self.writer, self._last_id, minid, line, *dels], rec.seq, rec.hash)
        self._last_id = f"{int(g)}-0"
        return plan.report(req.seq), rec.hash

    def _close_client(self) -> None:
        flusher = getattr(self, "_flush_client", None)
        if flusher is not None and flusher is not self._client:
            self._flush_client = None
            try:
                flusher.close()  # hands its connection back to the pool
            except Exception:  # noqa: BLE001 - releasing a broken connection
                pass
        if self._owns_client:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - closing a broken connection
                pass

    def _release(self) -> None:
        self._close_client()



def _writer_id(writer: str | None, identity: str | None) -> str:
    """The writer id: ``writer``, else ``identity``'s own (``NS/POD@<pid>-<random>``), else
    a service writer's default. With both, ``writer`` must be ``identity``'s."""
    if identity is None:
        return validate_id(writer if writer is not None else default_writer_id(), "writer")
    if writer is None:
        return identity_writer(identity)
    check_identity(identity, "identity")
    if not writer_of_identity(writer, identity):
        raise ConfigurationError(
            f"writer {writer!r} is not a writer of identity {identity!r}: give {identity!r} or "
            f"'{identity}@SUFFIX' (the streams its Redis ACL user may append to), or leave writer out")
    return validate_id(writer, "writer")


def _records(items: Iterator[tuple[str, Record | WALCorrupt]]) -> Iterator[Record]:
    for _loc, item in items:
        if isinstance(item, WALCorrupt):
            raise item
        yield item


def _quarantine_of(raw: dict[Any, Any]) -> dict[str, dict[str, Any]]:
    """The quarantine hash as ``writer -> {by, reason, ts}``: identity writers only (a
    service writer's records may close other agents' sagas, so it is never skipped)."""
    out: dict[str, dict[str, Any]] = {}
    for k, v in (raw or {}).items():
        w = _text(k)
        if not is_identity_writer(w):
            continue
        try:
            info = json.loads(_text(v))
        except ValueError:
            info = None
        out[w] = info if isinstance(info, dict) else {"reason": _text(v)}
    return out


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _make_client(redis: Any, target: Any, socket_timeout: float) -> tuple[Any, Target, bool]:
    """``(client, its password-free target, owned)`` for a URL or a client."""
    if isinstance(target, str):
        return connect(target, feature="RedisWAL", socket_timeout=socket_timeout), Target.of(target), True
    import redis.asyncio.cluster

    if isinstance(target, redis.asyncio.Redis | redis.asyncio.cluster.RedisCluster):
        raise ConfigurationError(
            "RedisWAL takes a URL or a synchronous redis.Redis client: its private flusher "
            "thread cannot share an asyncio client bound to your event loop"
        )
    if not isinstance(target, redis.Redis) and not is_cluster(target):
        raise ConfigurationError(
            f"RedisWAL takes a redis:// URL or a redis.Redis client, not {type(target).__name__}"
        )
    return target, Target.of(target), False
