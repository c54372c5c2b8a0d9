"""RedisLimitStore: limit windows shared by a fleet, and surviving a restart.

The check-and-debit of every limit a call touches is ONE Lua script, so it is atomic
across every process that shares the server: GET-then-SET would let two pods both read
$49k, both decide $1k fits, and both spend. The scripts go through redis-py's
``register_script`` (``agent_saga._redis``): called by SHA (EVALSHA), loaded again by
redis-py when a server that lost its script cache (restart, SCRIPT FLUSH) answers NOSCRIPT.

Key schema (all keys of one namespace share the hash tag ``{<namespace>}``, so a Redis
Cluster keeps them on one shard and the multi-key script stays legal):

    {ns}:limits:totals   HASH  "<limit>:<scope key>" -> the window's total now, and
                               "#<limit>:<scope key>" -> the number of debits in it;
                               "@next" -> when the log's first member leaves (µs)
    {ns}:limits:log      ZSET  per debit and window length, one member
                               "<debit id>" + "\n<amount> <limit>:<scope key>" for each
                               charge, scored by the time (µs, server clock) at which
                               they leave their window
    {ns}:limits:part:<part>:totals, :log   the same, for the debits of one process
                               (``part``: ``<namespace>/<pod>``, as its heartbeat)
    {ns}:limits:parts:<b>  SET the parts in use whose name hashes to bucket ``b`` (CRC-32
                               mod ``PARTS_BUCKETS``; a debit adds its own)
    {ns}:limits:buckets  SET   the buckets ``b`` holding a part
    {ns}:limits:parts    SET   the parts of the previous release's agents (one set):
                               read as well; a debit adds its own part to it while it exists
    {ns}:limits:defs     HASH  limit name -> definition JSON (v = 1)

Parts: a window's total is the sum of every part's. A store with a ``part`` debits into
its own part's keys and reads the others (the shared ``totals`` / ``log`` and every part
in ``parts``) inside the same script, so the check-and-debit stays one atomic step; an
agent's Redis user (``agent-saga acl agent --agent <namespace>/<pod>``) may write only its
own part, so a compromised pod can reset its own contribution, never the fleet's (another
part's entry it could not rewrite counts whatever it does; what it writes into its own is
read as a non-negative amount). A store without a ``part`` debits into the shared keys
(one process, or a fleet sharing one credential). The operator's ``usage`` (``compact``)
deletes parts with nothing left in their windows (pods that went away).

Bounded: the parts are listed in ``PARTS_BUCKETS`` sets, so no set grows past 64 KB
(~70 B a part, ~900 a set) below ~50,000 parts spending at once; a debit reads only the
buckets in use (``{ns}:limits:buckets``, at most ``PARTS_BUCKETS`` small numbers). The
unbucketed ``{ns}:limits:parts`` of the previous release is read too, and a new part is
listed in it while it exists, so an agent of the previous release still sees the parts of
the new ones that spend while it runs (docs/limits.md, "Bounded lists of parts").

Scoring a debit by its expiry rather than its creation lets one log serve windows of
every length: every call trims it with one range query (``score <= now``), and a call
writes one ZADD and one HSET whatever the number of limits and scopes it touches. An idle
scope leaves nothing behind: its total is deleted with its last entry, so a total is
reset exactly (no floating-point residue) when its window empties.

Invariants:
- Time is the Redis server's clock (``TIME`` inside the script): pods with skewed
  clocks cannot widen or narrow a window.
- Keys never expire: a log shrinks as calls (or ``agent-saga status``) trim it. Run
  the server with ``maxmemory-policy noeviction``: an evicted log would forget spend.
- Every failure to reach the server raises ``LimitStoreUnavailable`` naming this store;
  the gate refuses the call. The scripts are idempotent on the debit id, so a debit
  repeated after a lost reply (``agent_saga._repeat``, flagged as a repeat) cannot debit
  twice.
- With ``min_replicas=N`` a debit is authorised only after ``WAIT N`` (sent with the
  script in one pipeline, on the connection that wrote it) says N replicas hold it: a
  failover to one of them cannot forget spend it authorised. Fewer acknowledgements
  refuse the call and leave the debit counted (over-counting is the safe side).
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
import zlib
from collections.abc import AsyncIterator, Sequence
from typing import Any

from ..._redis import AsyncRedisStore, aclose, import_redis, is_cluster, is_timeout
from ..._repeat import ReplyLost, repeat_after
from ...errors import ConfigurationError
from ._model import Charge, DebitResult, LimitSpec, LimitUsage, format_amount
from ._store import LimitStoreUnavailable

__all__ = ["PARTS_BUCKETS", "RedisLimitStore", "parts_bucket"]

#: The parts are listed in this many sets (see the module doc).
PARTS_BUCKETS = 64


def parts_bucket(part: str) -> int:
    """The bucket listing ``part`` (``<namespace>/<pod>``): ``{ns}:limits:parts:<bucket>``."""
    return zlib.crc32(part.encode()) % PARTS_BUCKETS


class RedisLimitStore(AsyncRedisStore):
    """Limit windows in Redis (``pip install agent-saga[redis]``); see the module doc.
    Its clients (one per event loop), scripts and repeats are
    ``agent_saga._redis.AsyncRedisStore``'s.

    ``url`` is a ``redis://`` or ``rediss://`` URL. ``namespace`` separates deployments
    sharing one server. ``socket_timeout`` bounds how long a check may wait for the
    server before the gate refuses the call; ``max_connections`` bounds the connections
    per event loop (on a Redis Cluster: the calls in flight), and a call waits at most
    ``pool_timeout`` for one. ``retries`` is the
    number of times a debit that lost its connection is sent again, flagged as a repeat
    (default 1; on a Redis Cluster 3, because every re-read of the topology while slots
    move closes the connections in use again). ``client``
    injects a ready ``redis.asyncio.Redis`` (used as is, bound to its event loop) instead
    of one created per event loop from ``url``. ``min_replicas`` (with ``wait_timeout_ms``)
    authorises a debit only once that many replicas acknowledged it (see the module doc);
    not available on a Redis Cluster. ``part`` (``<namespace>/<pod>``: what an agent's
    Redis user may write, ``agent-saga acl agent --agent``) debits into this process's own
    part of every window (see the module doc); ``None``, the shared keys. ``compact``
    (the operator's store): ``usage`` deletes the parts with nothing left in their windows.
    """

    # Shared by the scripts below. ARGV[3] of a debit or refund is the call's charges,
    # one line each: "<forced 0|1> <window µs> <amount> <max_total> <field>". The charges
    # of one window length are one log member "<debit id>(\n<amount> <field>)+" scored
    # by the time they leave their window (server time + window), so one log serves
    # windows of every length and trim() is a single range query: it drops the members
    # whose time has come and hands their amounts back to the totals (per window, field
    # "<limit>:<scope key>" holds the total and "#<limit>:<scope key>" the number of
    # entries; both are deleted with the last entry, so a total never keeps a
    # floating-point residue).
    _LUA_COMMON = """
local function parse(id, spec)
  -- charges of equal window share one member: one log entry per window length per call
  local forced, win, amount, maxv, field, slot = {}, {}, {}, {}, {}, {}
  local member, order = {}, {}
  local n = 0
  for f, w, a, m, fld in string.gmatch(spec, '(%d) (%d+) (%S+) (%S+) ([^\\n]+)') do
    n = n + 1
    forced[n], win[n], amount[n], maxv[n], field[n] = f, w, a, m, fld
    local g = slot[w]
    if not g then
      g = #order + 1
      slot[w], order[g], member[g] = g, w, id
    end
    member[g] = member[g] .. '\\n' .. a .. ' ' .. fld
  end
  return n, forced, win, amount, maxv, field, member, order
end

local function take(totals, fld, k, sum)
  local v = redis.call('HMGET', totals, fld, '#' .. fld)
  local c = tonumber(v[2] or '0') - k
  if c <= 0 then
    redis.call('HDEL', totals, fld, '#' .. fld)
  else
    local left = tonumber(v[1] or '0') - sum
    if left < 0 then left = 0 end
    redis.call('HSET', totals, fld, left, '#' .. fld, c)
  end
end

-- a number an untrusted part holds: not a number, negative or NaN counts as 0
local function amt(x)
  x = tonumber(x) or 0
  if x ~= x or x < 0 then return 0 end
  return x
end

-- the other parts: {totals, log, name, the set listing it, its bucket} of the shared keys
-- (unless they are the caller's) and of every part listed (each once) but the caller's:
-- in the buckets in use (``buckets``; bucket b is ``legacy .. ':' .. b``), then in the
-- previous release's one set ``legacy`` (ARGV: me, the parts' key prefix)
local function others(own, buckets, legacy, shared_totals, shared_log, me, pfx)
  local out, seen = {}, {}
  if shared_totals ~= own then out[1] = {shared_totals, shared_log, nil} end
  local function add(set, b)
    for _, p in ipairs(redis.call('SMEMBERS', set)) do
      if p ~= me and not seen[p] then
        seen[p] = true
        out[#out + 1] = {pfx .. p .. ':totals', pfx .. p .. ':log', p, set, b}
      end
    end
  end
  for _, b in ipairs(redis.call('SMEMBERS', buckets)) do
    if string.match(b, '^%d+$') then add(legacy .. ':' .. b, b) end  -- anything else: not a bucket
  end
  add(legacy, nil)
  return out
end

-- what another part holds in the windows of fields (field -> true), read only (its owner
-- trims it): nothing without "@next" (an empty part: a debit always sets it), its totals
-- while nothing in it has expired ("@next" still ahead), else the sum of its log members
-- still in their window. Returns field -> {total, count}.
local function live(totals, log, now, fields)
  local names, q = {}, {'@next'}
  for fld in pairs(fields) do
    names[#names + 1] = fld
    q[#q + 1] = fld
    q[#q + 1] = '#' .. fld
  end
  local got = {}
  local v = redis.call('HMGET', totals, unpack(q))
  if not v[1] then return got end
  if amt(v[1]) > now then
    for i, fld in ipairs(names) do got[fld] = {amt(v[2 * i]), amt(v[2 * i + 1])} end
    return got
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', log, string.format('(%.17g', now), '+inf')) do
    for a, fld in string.gmatch(m, '\\n(%S+) ([^\\n]+)') do
      if fields[fld] then
        local g = got[fld] or {0, 0}
        got[fld] = {g[1] + amt(a), g[2] + 1}
      end
    end
  end
  return got
end

local function trim(totals, log, now)
  local gone = redis.call('ZRANGEBYSCORE', log, '-inf', now)
  if #gone == 0 then return end
  local dn, da = {}, {}
  for _, m in ipairs(gone) do
    for a, fld in string.gmatch(m, '\\n(%S+) ([^\\n]+)') do
      dn[fld] = (dn[fld] or 0) + 1
      da[fld] = (da[fld] or 0) + tonumber(a)
    end
  end
  redis.call('ZREMRANGEBYSCORE', log, '-inf', now)
  for fld, k in pairs(dn) do take(totals, fld, k, da[fld]) end
end

-- trim, then note when the log's first member will leave (field "@next" of the totals):
-- until then a debit has nothing to trim and skips the range query.
local function trim_all(totals, log, now)
  trim(totals, log, now)
  local first = redis.call('ZRANGE', log, 0, 0, 'WITHSCORES')
  if #first > 0 then
    redis.call('HSET', totals, '@next', first[2])
  else
    redis.call('HDEL', totals, '@next')
  end
end
"""

    # KEYS[1]  the caller's totals: HASH, "<limit>:<scope key>" -> total, "#<limit>:..." -> entries
    # KEYS[2]  the caller's debit log: ZSET, members (see above) scored by their expiry (µs)
    # KEYS[3]  the caller's parts bucket, KEYS[4] / KEYS[5] the shared totals / log,
    # KEYS[6]  the buckets in use, KEYS[7] the previous release's parts set
    # ARGV[1]  the debit id (unique per gate decision)
    # ARGV[2]  "1" when this call repeats one whose reply was lost (check the id first)
    # ARGV[3]  the charges (see above)
    # ARGV[4]  the caller's part ('' : the shared keys), ARGV[5] the parts' key prefix,
    # ARGV[6]  the caller's bucket
    # Returns 1 (debited), 2 (an earlier attempt already debited it), or the string
    # "used_1,...,used_n|over,..." when nothing was debited (used: each window's total
    # over every part, %.17g; over: 0-based indices of the charges that did not fit).
    # All-or-nothing: trimming the caller's part is housekeeping and happens either way;
    # debits only if every charge fits in its window's total over every part.
    LUA_DEBIT = _LUA_COMMON + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local totals, log = KEYS[1], KEYS[2]
local n, forced, win, amount, maxv, field, member, order = parse(ARGV[1], ARGV[3])
if ARGV[2] == '1' and redis.call('ZSCORE', log, member[1]) then return 2 end
local q = {'@next'}
for i = 1, n do
  q[2 * i] = field[i]
  q[2 * i + 1] = '#' .. field[i]
end
local vals = redis.call('HMGET', totals, unpack(q))
local nxt = tonumber(vals[1] or '0')
if now >= nxt then
  trim_all(totals, log, now)
  vals = redis.call('HMGET', totals, unpack(q))
  nxt = tonumber(vals[1] or '0')
  if nxt == 0 then nxt = math.huge end
end
local empty = nxt == math.huge  -- this part held nothing: (re)enter it in the index
local cnt, tots, over, rest = {}, {}, {}, {}
local parts = others(totals, KEYS[6], KEYS[7], KEYS[4], KEYS[5], ARGV[4], ARGV[5])
if #parts > 0 then
  local fields = {}
  for i = 1, n do fields[field[i]] = true end
  for _, p in ipairs(parts) do
    for fld, g in pairs(live(p[1], p[2], now, fields)) do rest[fld] = (rest[fld] or 0) + g[1] end
  end
end
for i = 1, n do
  tots[i], cnt[i] = tonumber(vals[2 * i] or '0'), tonumber(vals[2 * i + 1] or '0')
  if forced[i] ~= '1' and tots[i] + (rest[field[i]] or 0) + tonumber(amount[i]) > tonumber(maxv[i]) then
    over[#over + 1] = i - 1
  end
end
if #over > 0 then
  local used = {}
  for i = 1, n do used[i] = string.format('%.17g', tots[i] + (rest[field[i]] or 0)) end
  return table.concat(used, ',') .. '|' .. table.concat(over, ',')
end
local z, hs = {}, {}
for g = 1, #order do
  local expiry = now + tonumber(order[g])
  z[2 * g - 1] = expiry
  z[2 * g] = member[g]
  if expiry < nxt then nxt = expiry end
end
for i = 1, n do
  hs[4 * i - 3] = field[i]
  hs[4 * i - 2] = tots[i] + tonumber(amount[i])  -- a number: Redis writes it exactly
  hs[4 * i - 1] = '#' .. field[i]
  hs[4 * i] = cnt[i] + 1
end
hs[4 * n + 1] = '@next'
hs[4 * n + 2] = nxt
redis.call('ZADD', log, unpack(z))
redis.call('HSET', totals, unpack(hs))
if ARGV[4] ~= '' then
  if empty then
    redis.call('SADD', KEYS[3], ARGV[4])
    redis.call('SADD', KEYS[6], ARGV[6])
  end
  if redis.call('EXISTS', KEYS[7]) == 1 then redis.call('SADD', KEYS[7], ARGV[4]) end
end
return 1
"""

    # KEYS     as LUA_DEBIT
    # ARGV[1]  the debit id to hand back; ARGV[3] its charges, exactly as debited
    # Removes exactly the members that debit wrote and takes their amounts off the
    # totals; a second refund (or a refund of a debit that never happened) finds none.
    LUA_REFUND = _LUA_COMMON + """
local totals, log = KEYS[1], KEYS[2]
local n, forced, win, amount, maxv, field, member, order = parse(ARGV[1], ARGV[3])
local removed = {}
for g = 1, #order do removed[order[g]] = redis.call('ZREM', log, member[g]) == 1 end
for i = 1, n do
  if removed[win[i]] then take(totals, field[i], 1, tonumber(amount[i])) end
end
return 1
"""

    # KEYS     as LUA_DEBIT; ARGV[1] "1": compact (delete the parts with nothing left in
    # their windows, and their index entries: the operator's credential), ARGV[2] / [3]
    # as ARGV[4] / [5] of LUA_DEBIT
    # Trims the caller's log exactly as LUA_DEBIT does, then returns the windows summed over
    # every part, flat as HGETALL: "<limit>:<scope key>", total, "#<limit>:...", count.
    LUA_USAGE = _LUA_COMMON + """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
trim_all(KEYS[1], KEYS[2], now)
local sum, cnt, names = {}, {}, {}
local function add(fld, total, count)
  if sum[fld] == nil then
    names[#names + 1] = fld
    sum[fld], cnt[fld] = 0, 0
  end
  sum[fld], cnt[fld] = sum[fld] + total, cnt[fld] + count
end
local mine = redis.call('HGETALL', KEYS[1])
for i = 1, #mine, 2 do
  local f = mine[i]
  local c = string.sub(f, 1, 1)
  if c ~= '#' and c ~= '@' then add(f, tonumber(mine[i + 1]) or 0, 0) end
  if c == '#' then add(string.sub(f, 2), 0, tonumber(mine[i + 1]) or 0) end
end
for _, p in ipairs(others(KEYS[1], KEYS[6], KEYS[7], KEYS[4], KEYS[5], ARGV[2], ARGV[3])) do
  local fields = {}
  for _, f in ipairs(redis.call('HKEYS', p[1])) do
    local c = string.sub(f, 1, 1)
    if c ~= '#' and c ~= '@' then fields[f] = true end
  end
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', p[2], string.format('(%.17g', now), '+inf')) do
    for _, fld in string.gmatch(m, '\\n(%S+) ([^\\n]+)') do fields[fld] = true end
  end
  local got = live(p[1], p[2], now, fields)
  local any = false
  for fld, g in pairs(got) do
    if g[2] > 0 or g[1] > 0 then
      any = true
      add(fld, g[1], g[2])
    end
  end
  if ARGV[1] == '1' and p[3] and not any and redis.call('ZCOUNT', p[2], string.format('(%.17g', now), '+inf') == 0 then
    redis.call('DEL', p[1], p[2])
    redis.call('SREM', p[4], p[3])
    redis.call('SREM', KEYS[7], p[3])
    if p[5] and redis.call('SCARD', p[4]) == 0 then redis.call('SREM', KEYS[6], p[5]) end
  end
end
local out = {}
for _, fld in ipairs(names) do
  if sum[fld] > 0 or cnt[fld] > 0 then
    out[#out + 1] = fld
    out[#out + 1] = string.format('%.17g', sum[fld])
    out[#out + 1] = '#' .. fld
    out[#out + 1] = tostring(cnt[fld])
  end
end
return out
"""

    FEATURE = "RedisLimitStore"
    IMPORT_EARLY = False  # redis is imported with the first client, on the first call
    SCRIPTS = {"debit": LUA_DEBIT, "refund": LUA_REFUND, "usage": LUA_USAGE}

    def __init__(
        self,
        url: str | None = None,
        *,
        namespace: str = "agent-saga",
        socket_timeout: float = 2.0,
        connect_timeout: float = 1.0,
        retries: int | None = None,
        max_connections: int = 64,
        pool_timeout: float = 5.0,
        client: Any = None,
        min_replicas: int = 0,
        wait_timeout_ms: int = 500,
        part: str | None = None,
        compact: bool = False,
    ) -> None:
        if client is None and not url:
            raise ConfigurationError(
                "RedisLimitStore needs a URL (RedisLimitStore('redis://host:6379/0')) or a "
                "redis.asyncio client (client=...)"
            )
        self._open(url if url else client, socket_timeout=socket_timeout, retries=retries, client=client,
                   connect_timeout=connect_timeout, max_connections=max_connections, pool_timeout=pool_timeout)
        if min_replicas < 0 or wait_timeout_ms < 1:
            raise ConfigurationError(f"min_replicas must be >= 0 and wait_timeout_ms >= 1, got {min_replicas} "
                                     f"and {wait_timeout_ms}")
        self.min_replicas = min_replicas
        self._wait_ms = wait_timeout_ms
        if not namespace or any(c in namespace for c in "{}\n"):
            raise ConfigurationError(f"namespace {namespace!r} must be non-empty without braces or newlines")
        self.url = url or self._target.where
        self._name = f"RedisLimitStore({_safe_url(self.url)})"
        self.namespace = namespace
        self._prefix = "{" + namespace + "}:limits:"
        self._max_connections = max_connections
        self._pool_timeout = pool_timeout
        self._heads: dict[tuple[float, float], tuple[int, str]] = {}
        if part is not None and (not part or any(c in part for c in "{}*?[]:\n\r\t ")):
            raise ConfigurationError(f"part {part!r} must be non-empty without braces, glob characters, colons or "
                                     f"spaces: give <namespace>/<pod>, as the agent's Redis user (agent-saga acl "
                                     f"agent --agent)")
        self.part = part
        self._compact = "1" if compact else "0"
        own = self._prefix if part is None else f"{self._prefix}part:{part}:"
        #: The keys of every script: this process's totals and log, the parts index, the
        #: shared totals and log (the first two are the shared ones without a part).
        bucket = parts_bucket(part or "")
        self._keys = (own + "totals", own + "log", f"{self._prefix}parts:{bucket}", self._prefix + "totals",
                      self._prefix + "log", self._prefix + "buckets", self._prefix + "parts")
        self._part_args = (part or "", self._prefix + "part:")
        self._bucket = str(bucket)
        self._queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore] = (
            weakref.WeakKeyDictionary())

    # ------------------------------------------------------------------ naming
    def describe(self) -> str:
        """``RedisLimitStore(<url without password>)``."""
        return self._name

    def __repr__(self) -> str:
        return f"RedisLimitStore({_safe_url(self.url)!r}, namespace={self.namespace!r})"


    @property
    def defs_key(self) -> str:
        """The hash of limit definitions (``{ns}:limits:defs``)."""
        return self._prefix + "defs"

    # ------------------------------------------------------------------ public API
    def _charges_arg(self, charges: Sequence[Charge], force: frozenset[int]) -> str:
        """The charges, one line each (see ``_LUA_COMMON``)."""
        heads = self._heads
        lines = []
        for i, c in enumerate(charges):
            head = heads.get((c.window, c.max_total))
            if head is None:
                head = heads[(c.window, c.max_total)] = (int(c.window * 1_000_000), format_amount(c.max_total))
            lines.append(f"{'1' if i in force else '0'} {head[0]} {format_amount(c.amount)} {head[1]} {c.limit}:{c.key}")
        return "\n".join(lines)

    async def debit(
        self, charges: Sequence[Charge], debit_id: str, force: frozenset[int] = frozenset()
    ) -> DebitResult:
        """Check and debit every charge, or none, in one script (see ``LimitStore.debit``)."""
        if not charges:
            return DebitResult(True, ())
        spec = self._charges_arg(charges, force)
        reply = await self._call("debit", "debit", self._keys, (debit_id, "0", spec, *self._part_args,
                                 self._bucket), retry_args=(debit_id, "1", spec, *self._part_args, self._bucket))
        if reply == 1 or reply == 2:
            return DebitResult(True, (), (), reply == 2)
        used, over = reply.decode().split("|")
        return DebitResult(False, tuple(float(u) for u in used.split(",")), tuple(int(i) for i in over.split(",")))

    async def refund(self, charges: Sequence[Charge], debit_id: str) -> None:
        """Hand back what the debit ``debit_id`` made (once; one script)."""
        if not charges:
            return
        args = (debit_id, "0", self._charges_arg(charges, frozenset()))
        await self._call("refund", "refund", self._keys[:2], args, retry_args=args)

    async def declare(self, specs: Sequence[LimitSpec]) -> None:
        """Record the limits' definitions for ``usage`` and ``agent-saga status``."""
        if not specs:
            return
        mapping = {s.name: s.to_json() for s in specs}
        await self._io("declare", lambda c: c.hset(self.defs_key, mapping=mapping))

    async def definitions(self) -> list[LimitSpec]:
        """The limits declared in this namespace by any process (for ``agent-saga status``)."""
        import json

        raw = await self._io("read definitions", lambda c: c.hgetall(self.defs_key))
        out = []
        for _, doc in sorted(raw.items()):
            try:
                out.append(LimitSpec.from_doc(json.loads(doc)))
            except (ValueError, KeyError, TypeError):
                continue  # a definition written by a newer version: not ours to show
        return out

    async def usage(self, specs: Sequence[LimitSpec] | None = None) -> list[LimitUsage]:
        """Every non-empty window of ``specs`` (default: every declared limit), trimmed now."""
        wanted = await self.definitions() if specs is None else list(specs)
        if not wanted:
            return []
        args = (self._compact, *self._part_args)
        flat = await self._call("usage", "usage", self._keys, args, retry_args=args)  # trim + read: repeatable
        pairs = {flat[i].decode(): flat[i + 1].decode() for i in range(0, len(flat), 2)}
        rows: dict[str, list[tuple[str, int, float]]] = {}
        for fld, total in pairs.items():
            if fld.startswith(("#", "@")):
                continue
            name, _, scope = fld.partition(":")
            rows.setdefault(name, []).append((scope, int(pairs.get("#" + fld, "0")), float(total)))
        out: list[LimitUsage] = []
        for s in wanted:
            for scope, count, total in sorted(rows.get(s.name, ())):
                out.append(LimitUsage(s.name, s.kind, scope, total, s.max_total, s.window, count, None))
        return out

    async def ping(self) -> None:
        """Raise ``LimitStoreUnavailable`` unless the server answers."""
        await self._io("ping", lambda c: c.ping())

    async def aclose(self) -> None:
        """Close the connections this store opened on the running event loop."""
        loop = asyncio.get_running_loop()
        held = self._clients.pop(loop, None)
        self._queues.pop(loop, None)
        if held is not None:
            await aclose(held[0])

    # ------------------------------------------------------------------ I/O
    # A loop's client has a bounded pool that queues a burst instead of refusing it ("Too
    # many connections"); waiting longer than pool_timeout refuses the call. The client
    # itself never retries: _call does, flagging the repeat.
    def _made(self, loop: asyncio.AbstractEventLoop, client: Any) -> None:
        if is_cluster(client):
            # A cluster client's node pools do not queue (connect_async): the same
            # bound, as a queue in front of the client.
            self._queues[loop] = asyncio.Semaphore(self._max_connections)

    @contextlib.asynccontextmanager
    async def _queued(self) -> AsyncIterator[None]:
        """Wait (at most ``pool_timeout``) for one of the ``max_connections`` calls a
        cluster client may have in flight on this loop; a one-server pool queues itself."""
        queue = self._queues.get(asyncio.get_running_loop())
        if queue is None:
            yield
            return
        if queue.locked():  # wait in line (a free slot is taken at once, without a timer)
            try:
                await asyncio.wait_for(queue.acquire(), self._pool_timeout)
            except TimeoutError:
                errors = import_redis("RedisLimitStore").exceptions
                raise errors.ConnectionError("No connection available.") from None
        else:
            await queue.acquire()
        try:
            yield
        finally:
            queue.release()

    async def _call(
        self,
        what: str,
        name: str,
        keys: Sequence[str],
        args: Sequence[str],
        retry_args: Sequence[str] | None = None,
    ) -> Any:
        """Run the script ``name`` of ``SCRIPTS`` (EVALSHA; redis-py reloads it on NOSCRIPT).

        A lost reply (``agent_saga._repeat``) is repeated with ``retry_args`` (the debit
        script then checks whether an earlier attempt already landed), up to ``retries``
        times: by default once, and three times on a Redis Cluster, where each of the
        client's topology re-reads during a reshard closes every connection in use (so two
        losses in a row are expected under load, not a sign the store is gone). The client
        itself never retries: only this method knows that a repeat must be flagged as one.
        A call without ``retry_args`` is sent once.
        """
        client, run = self._bound(name)

        try:  # the first attempt, inline: the repeats below are the rare path
            async with self._queued():
                if self.min_replicas and name != "usage":
                    return await self._replicated(client, run, keys, args)
                return await run(keys=keys, args=args, client=client)
        except (LimitStoreUnavailable, ConfigurationError):
            raise
        except Exception as exc:
            if retry_args is None:
                raise self._unavailable(what, exc) from exc
            first = exc

        async def again(_repeat: bool) -> Any:
            async with self._queued():
                if self.min_replicas and name != "usage":
                    return await self._replicated(client, run, keys, retry_args)
                return await run(keys=keys, args=retry_args, client=client)

        try:
            return await repeat_after(first, again, retries=self._retries, client=client)
        except ReplyLost as lost:
            raise self._unavailable(what, lost.error) from lost.error
        except (LimitStoreUnavailable, ConfigurationError):
            raise
        except Exception as exc:
            raise self._unavailable(what, exc) from exc

    async def _replicated(self, client: Any, run: Any, keys: Sequence[str], args: Sequence[str]) -> Any:
        """The script and ``WAIT min_replicas`` in one pipeline (one connection, one round
        trip); fewer acknowledgements raise ``LimitStoreUnavailable`` (the call is refused,
        the write stays counted)."""
        if is_cluster(client):
            raise ConfigurationError("RedisLimitStore min_replicas is not available on a Redis Cluster: "
                                     "use Sentinel (redis+sentinel://) or min_replicas=0")
        pipe = client.pipeline(transaction=False)
        await run(keys=keys, args=args, client=pipe)
        pipe.execute_command("WAIT", self.min_replicas, self._wait_ms)
        reply, acks = await pipe.execute()
        if int(acks) < self.min_replicas:
            raise LimitStoreUnavailable(
                f"limit store {self.describe()}: only {acks} of {self.min_replicas} replicas acknowledged the "
                f"write within {self._wait_ms} ms; the call is refused (the write stays counted)",
                store=self.describe(), outcome_unknown=True)
        return reply

    async def _io(self, what: str, op: Any) -> Any:
        """``op(client)``: a read, or a write that is the same however often it lands
        (``declare``'s HSET), so it is repeated while its reply is lost."""
        client = self._client()
        try:
            return await self._repeating(client, lambda _repeat: op(client))
        except ReplyLost as lost:
            raise self._unavailable(what, lost.error) from lost.error
        except Exception as exc:
            raise self._unavailable(what, exc) from exc

    def _unavailable(self, what: str, exc: BaseException) -> LimitStoreUnavailable:
        errors = import_redis("RedisLimitStore").exceptions
        unknown = is_timeout(exc)
        if isinstance(exc, errors.ConnectionError | OSError) and not unknown:
            state = "is unreachable"
        elif isinstance(exc, AttributeError):
            state = "lost its connection (the client closed it to re-read the cluster's topology)"
        elif unknown:
            state = "did not answer in time"
        else:
            state = "failed"
        return self._target.unavailable(LimitStoreUnavailable, f"limit store {self.describe()} {state} during {what}",
                                        exc, store=self.describe(), outcome_unknown=unknown)


def _safe_url(url: str) -> str:
    """The URL without a password, for messages and status (``redis://***@host``)."""
    if "@" not in url or "://" not in url:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.rsplit("@", 1)
    user = creds.split(":", 1)[0]
    return f"{scheme}://{user + ':***@' if user else '***@'}{host}"
