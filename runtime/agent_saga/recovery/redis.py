"""Recovery state a fleet shares through Redis: claims (``RedisClaimLock``) and the ledger
(``RedisLedger``). ``pip install 'agent-saga[redis]'``; the client is imported on first use.

Keys (``ns`` defaults to ``agent-saga``; the hash tag keeps them on one Cluster slot)::

    {ns}:recovery:claim:<saga>           STRING  the holder's token, PX = the claim's ttl
    {ns}:recovery:members                ZSET    daemon id -> ms (server clock) its entry
                                                 expires (``recovery.shards``)
    {ns}:recovery:done                   HASH    recovery token -> JSON entry (the index
                                                 "already compensated?" is answered from)
    {ns}:recovery:attempts               HASH    recovery token -> handler calls started
    {ns}:recovery:escalations            HASH    escalation id -> JSON Escalation
    {ns}:recovery:escalations:resolved   HASH    escalation id -> JSON {by, note, ts}
    {ns}:recovery:journal                STREAM  every entry, for audit (MAXLEN ~ bound)
    {ns}:recovery:once:<write id>        STRING  the answers of a turn's ledger writes, PX =
                                                 marker_ttl: what its repeat answers instead
                                                 of writing

Invariants:
- A claim is ``SET NX PX``; renewal and release are Lua scripts that compare the token
  before acting, so a daemon whose claim expired can neither extend nor free its
  successor's. The claims, releases and journal writes a daemon's workers make in one
  event-loop turn go to Redis together (``recovery.batch``: one script over the claim
  keys, all in the namespace's slot, and one script for the ledger's reads and writes,
  ``RedisLedger.APPLY``, each op under ``pcall`` so that an error is its op's alone);
  each caller still gets its own answer, after Redis gave it. With the claims in the
  ledger's server and namespace, a resolved saga's journal entry and its claim's
  release are one op of that script (``record_release``): the claim is released only
  once the entry is written, and nothing runs between the two. Scripts are class
  constants run through redis-py's ``register_script`` (``agent_saga._redis``):
  EVALSHA, reloaded by redis-py on NOSCRIPT (the server lost its script cache; the
  script did not run).
- "Already compensated?" is one HMGET over the tokens of a saga: O(steps), never a scan.
  Nothing here expires or is trimmed except the audit stream: the done index must outlive
  any compaction of the WAL.
- A request whose reply was lost (``agent_saga._repeat``: a Cluster client re-reading
  the topology, a closed connection, a timeout) is sent again, at most ``retries`` times
  (default 1; 3 on a Redis Cluster), and every request here is safe to repeat: a claim's
  token is unique to its call, so a repeat that finds it knows the claim is its own;
  renewals and releases compare the token; a run of ``APPLY`` that holds writes (done,
  attempt, escalation, journal entry, journal entry and release) carries a write id and
  leaves a marker under it holding their answers, so its repeat answers those and writes
  (journals, counts) nothing twice, and a release repeated still frees only a claim
  holding its token; reads change nothing.
- Every failure to reach the server raises ``ClaimStoreUnavailable`` naming the server
  without its password and saying what is true for that request (``_AFTER``): a claim
  or a read that fails claimed or acted on nothing; a write the daemon makes after it
  acted (a compensation's done entry, a saga's closing entry, a release) says what ran
  and was not recorded, and what the next sweep does about it (a done entry not written:
  the compensation is called again, with the same idempotency key).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Collection
from typing import Any, NamedTuple

from .._redis import AsyncRedisStore
from ..errors import ConfigurationError
from .batch import TurnBatch
from .claims import Claim, new_token
from .errors import ClaimStoreUnavailable
from .ledger import Escalation, LedgerEntry, LedgerKind

__all__ = ["RedisClaimLock", "RedisLedger"]

DEFAULT_NAMESPACE = "agent-saga"
_OPS = {"done": "d", "attempt": "a", "escalate": "e"}  # RedisLedger.APPLY's op codes


class _After(NamedTuple):
    """What is true once a request failed, and what happens next: ``refused`` when the
    server refused it or could not be reached, ``lost`` when every attempt lost its reply
    (it may have run, once: every request here is safe to repeat)."""

    refused: str
    lost: str


_READ = "nothing was written or acted on"
_RESOLVED = "the saga is resolved (its terminal record is in the log) and nothing of it runs again"
_RELEASER = "the daemon releases the claim on its own, or it expires with its ttl"
_RENEWAL = ("the saga in hand goes on while the last renewal lasts (the next is tried a third of the ttl "
            "later) and stops before its next call or record once none was confirmed within 90% of the ttl")
_TAKE_ALL = ("until a renewal succeeds it takes every orphan, not only its share (claims still keep two "
             "daemons off one saga); the next renewal tries again")
_SHARE = "it stays until it expires; this daemon's share of the orphans moves to the others then"
_AGAIN = "the next sweep calls it again, with the same idempotency key (the recovery token)"
_QUEUE = "the next sweep queues it from the log (by the same id: never twice)"

#: Per request: what its ``ClaimStoreUnavailable`` says was and was not done, and what next.
_AFTER: dict[str, _After] = {
    "claim": _After(
        "nothing was claimed or acted on, the next sweep retries",
        "nothing was claimed or acted on (a claim an earlier attempt may have taken is never used and expires "
        "with its ttl), the next sweep retries"),
    "renew": _After(f"the claim was not extended: {_RENEWAL}",
                    f"the claim may or may not have been extended: {_RENEWAL}"),
    "release": _After(
        "the claim is still held and expires with its ttl: what was done under it stands, and a saga left "
        "unresolved is taken again once the claim has expired",
        "the claim may have been released, or else it expires with its ttl: what was done under it stands, "
        "and a saga left unresolved is taken again once the claim is gone"),
    "members": _After(f"this daemon's membership was not renewed: {_TAKE_ALL}",
                      f"this daemon's membership may or may not have been renewed: {_TAKE_ALL}"),
    "leave": _After(f"this daemon's membership entry was not removed: {_SHARE}",
                    f"this daemon's membership entry may have been removed; if not, {_SHARE}"),
    "read": _After(_READ, _READ),
    "done index": _After(
        f"{_READ} (no compensation is called without this answer), the next sweep reads it again",
        f"{_READ} (no compensation is called without this answer), the next sweep reads it again"),
    "attempt": _After(
        "the compensation was not called (its start is in the log): the next sweep resumes the saga and "
        "calls it, with the same idempotency key (the recovery token)",
        "the compensation was not called (its start is in the log; the attempt may have been counted, once): "
        "the next sweep resumes the saga and calls it, with the same idempotency key (the recovery token)"),
    "done": _After(
        f"the compensation ran, but its done entry was not written: {_AGAIN}, unless the done index has the "
        f"entry",
        f"the compensation ran; its done entry may have been written (once) or not: if not, {_AGAIN}"),
    "failed": _After(
        "the compensation was called and did not succeed (its failure is in the log), but its failed entry "
        "was not written: the next sweep calls nothing again and escalates the step to a human",
        "the compensation was called and did not succeed (its failure is in the log); its failed entry may "
        "have been written (once) or not: the next sweep calls nothing again and escalates the step to a human"),
    "saga": _After(f"{_RESOLVED}; its journal entry was not written, the audit stream lacks it",
                   f"{_RESOLVED}; its journal entry may have been written (once) or not"),
    "saga and release": _After(
        f"{_RESOLVED}; its journal entry was not written, or was and its claim is still held: {_RELEASER}",
        f"{_RESOLVED}; its journal entry may have been written (once) and its claim released, or neither: "
        f"{_RELEASER}"),
    "escalate": _After(f"the escalation was not queued for a human: {_QUEUE}",
                       f"the escalation may have been queued (once) or not: {_QUEUE}"),
    "resolve": _After(
        "the escalation was not resolved: resolve it again",
        "the escalation may or may not have been resolved: list the escalations (a resolved one is no longer "
        "open), or resolve it again"),
}


class _RedisBase(AsyncRedisStore):
    """The recovery stores on ``agent_saga._redis.AsyncRedisStore`` (a client per event
    loop, scripts by SHA, repeats, errors without secrets), in ``{namespace}:recovery``."""

    FEATURE = "recovery over Redis"

    def __init__(self, target: str | Any, namespace: str, socket_timeout: float, retries: int | None = None) -> None:
        self._open(target, socket_timeout=socket_timeout, retries=retries)
        if not namespace or any(c in namespace for c in " \n\r{}"):
            raise ConfigurationError(f"namespace {namespace!r} must be non-empty, without spaces or braces")
        self._ns = f"{{{namespace}}}:recovery"

    def _unavailable(self, exc: BaseException, doing: str, request: str) -> ClaimStoreUnavailable:
        """The error of ``doing`` failing with ``exc``; ``request`` names its ``_AFTER``:
        what is true then, refused or with every reply lost."""
        after, store = _AFTER[request], f"Redis at {self.where}"
        return self._target.refusal(
            ClaimStoreUnavailable, store, exc, during=doing, lost=after.lost, cause=False,
            refused=f"{store} failed while {doing}: {self._target.error_text(exc)}; {after.refused}")

    async def _eval(self, name: str, keys: list[str], args: list[Any]) -> Any:
        """Run the script ``name`` (redis-py's EVALSHA, reloaded on NOSCRIPT), repeated
        while its reply is lost (``_repeat``): every script here is safe to repeat."""
        client, run = self._bound(name)
        return await self._repeating(client, lambda _repeat: run(keys=keys, args=args, client=client))

    async def _read(self, op: Any) -> Any:
        """``await op(client)`` for a read (or an idempotent command), repeated while its
        reply is lost."""
        client = self._client()
        return await self._repeating(client, lambda _repeat: op(client))


class RedisClaimLock(_RedisBase):
    """Claims in Redis shared by every replica (see the module doc).

    ``target``: a ``redis://`` URL (its password never appears in a message) or a
    ``redis.asyncio.Redis`` client. ``owner`` prefixes the tokens (default: a random id).
    ``retries``: how many times a request whose reply was lost is sent again (default 1;
    3 on a Redis Cluster); every request here is safe to repeat (see the module doc).
    """

    shared = True

    # KEYS[1] the claim key. ARGV[1] our token, ARGV[2] the ttl in ms.
    # Extends the claim only if it is still ours; returns 1 if extended, 0 if not ours.
    RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

    # KEYS[1] the claim key. ARGV[1] our token.
    # Deletes the claim only if it is still ours; returns 1 if deleted, 0 if not ours.
    RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

    # KEYS[i] a claim key. ARGV[2i-1] its new token, ARGV[2i] its ttl in ms.
    # SET NX PX each; returns 1 for each claim taken, 0 for each held by another. A key
    # that already holds the token is ours (tokens are unique per acquisition: an earlier
    # attempt of this very call whose reply was lost took it): 1, its ttl restarted.
    ACQUIRE_MANY = """
local out = {}
for i = 1, #KEYS do
  if redis.call('SET', KEYS[i], ARGV[2 * i - 1], 'NX', 'PX', ARGV[2 * i]) then
    out[i] = 1
  elseif redis.call('GET', KEYS[i]) == ARGV[2 * i - 1] then
    redis.call('PEXPIRE', KEYS[i], ARGV[2 * i])
    out[i] = 1
  else
    out[i] = 0
  end
end
return out
"""

    # KEYS[i] a claim key. ARGV[i] our token. RELEASE for each (only the ones still ours);
    # returns how many were deleted.
    RELEASE_MANY = """
local n = 0
for i = 1, #KEYS do
  if redis.call('GET', KEYS[i]) == ARGV[i] then
    n = n + redis.call('DEL', KEYS[i])
  end
end
return n
"""

    # KEYS[1] the members set. ARGV[1] this member, ARGV[2] its entry's ttl in ms.
    # Drops expired members (by the server's clock: one clock for the whole fleet), renews
    # this one, returns the live members.
    MEMBERS = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
return redis.call('ZRANGE', KEYS[1], 0, -1)
"""

    SCRIPTS = {"RENEW": RENEW, "RELEASE": RELEASE, "ACQUIRE_MANY": ACQUIRE_MANY, "RELEASE_MANY": RELEASE_MANY,
               "MEMBERS": MEMBERS}

    def __init__(
        self,
        target: str | Any,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        owner: str | None = None,
        socket_timeout: float = 5.0,
        retries: int | None = None,
    ) -> None:
        super().__init__(target, namespace, socket_timeout, retries)
        self.owner = owner or new_token("daemon").split(":", 1)[1]
        self.description = f"{self.where} claims {self._ns}:claim:*"
        self._acquires: TurnBatch[tuple[str, str, int]] = TurnBatch(self._acquire_many)
        self._releases: TurnBatch[Claim] = TurnBatch(self._release_many)

    def key(self, name: str) -> str:
        """The Redis key of the claim ``name``."""
        return f"{self._ns}:claim:{name}"

    async def acquire(self, name: str, ttl: float) -> Claim | None:
        """Take the claim ``name`` (SET NX PX), or ``None`` if another holds it."""
        if ttl <= 0:
            raise ConfigurationError(f"a claim ttl must be > 0 seconds, got {ttl}")
        token = new_token(self.owner)
        try:
            ok = await self._acquires.submit((self.key(name), token, max(1, int(ttl * 1000))))
        except self._failures as exc:
            raise self._unavailable(exc, f"claiming {name}", "claim") from exc
        return Claim(name, token, ttl) if ok else None

    async def _acquire_many(self, items: list[tuple[str, str, int]]) -> list[bool]:
        args: list[Any] = []
        for _key, token, ttl_ms in items:
            args += [token, ttl_ms]
        out = await self._eval("ACQUIRE_MANY", [key for key, _, _ in items], args)
        return [bool(int(x)) for x in out]

    async def renew(self, claim: Claim) -> bool:
        """Extend ``claim`` if its token is still ours."""
        try:
            out = await self._eval("RENEW", [self.key(claim.name)], [claim.token, max(1, int(claim.ttl * 1000))])
        except self._failures as exc:
            raise self._unavailable(exc, f"renewing the claim on {claim.name}", "renew") from exc
        return bool(out)

    async def release(self, claim: Claim) -> None:
        """Delete ``claim`` if its token is still ours."""
        try:
            await self._releases.submit(claim)
        except self._failures as exc:
            raise self._unavailable(exc, f"releasing the claim on {claim.name}", "release") from exc

    async def _release_many(self, claims: list[Claim]) -> list[None]:
        await self._eval("RELEASE_MANY", [self.key(c.name) for c in claims], [c.token for c in claims])
        return [None] * len(claims)

    async def members(self, member: str, ttl: float) -> list[str]:
        """Keep ``member`` in the fleet's membership for ``ttl`` more seconds; the live
        members (``recovery.shards``). Raises ``ClaimStoreUnavailable``."""
        try:
            out = await self._eval("MEMBERS", [f"{self._ns}:members"], [member, max(1, int(ttl * 1000))])
        except self._failures as exc:
            raise self._unavailable(exc, "renewing the recovery membership", "members") from exc
        return sorted(m.decode() if isinstance(m, bytes) else str(m) for m in out)

    async def leave(self, member: str) -> None:
        """Take ``member`` out of the membership now: its shard moves to the others at once."""
        try:
            await self._read(lambda c: c.zrem(f"{self._ns}:members", member))  # ZREM: idempotent
        except self._failures as exc:
            raise self._unavailable(exc, "leaving the recovery membership", "leave") from exc

    def __repr__(self) -> str:
        return f"<RedisClaimLock {self.description}>"


class RedisLedger(_RedisBase):
    """The recovery ledger in Redis, shared by every replica (see the module doc).

    ``journal_maxlen`` bounds the audit stream (approximately); the done index and the
    escalation queue are never trimmed. ``retries``: how many times a request whose reply
    was lost is sent again (default 1; 3 on a Redis Cluster): each request carrying writes
    (one event-loop turn's) has a write id the server remembers for ``marker_ttl`` seconds
    (a key of about 100 bytes plus a few per write; at least as long as the repeats can
    take), so a repeat finds it written and writes nothing twice (see the module doc).
    """

    shared = True

    # KEYS[1] the escalations HASH, KEYS[2] the resolved HASH. ARGV[1] the id, ARGV[2] the
    # resolution JSON. Closes an escalation that exists and is open; returns 1, else 0.
    # A resolution already holding this very JSON (it carries its time: an earlier attempt
    # of this call whose reply was lost wrote it) answers 1 again.
    RESOLVE = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('HSETNX', KEYS[2], ARGV[1], ARGV[2]) == 1 then return 1 end
if redis.call('HGET', KEYS[2], ARGV[1]) == ARGV[2] then return 1 end
return 0
"""

    # KEYS[1] the done HASH, KEYS[2] the attempts HASH, KEYS[3] the escalations HASH,
    # KEYS[4] the journal STREAM, KEYS[5] the turn's write marker ("{ns}:recovery:once:<write
    # id>", when the turn holds writes), KEYS[6..] the claim keys "r" ops name: declared, so
    # a cluster routes and migrates them with the rest. ARGV[1] the journal's approximate
    # bound, ARGV[2] the marker's ttl in ms, ARGV[3] '1' if KEYS[5] is a marker, then the
    # ops of one turn, each a code and its arguments:
    #   h n t1..tn     HMGET done t1..tn (1,000 at a time)             -> the values
    #   d t doc        HSET done t doc; journal doc                    -> HSET's reply
    #   a t doc        HINCRBY attempts t 1; journal doc               -> the count
    #   e id doc       HSETNX escalations id doc; journal doc          -> 1 if new
    #   j doc          journal doc                                     -> the entry id
    #   r k tok doc    journal doc; then, only if that was written, DEL KEYS[k] if it holds
    #                  tok (a claim released with its saga's entry)    -> 1 if deleted
    # Every command runs under pcall: an op's answer is its first error, else its first
    # reply, and an error is that op's alone (as in a pipeline without MULTI). One reply
    # per op, in order. A turn whose writes wrote anything leaves its marker holding their
    # answers; run again with the marker there (an earlier attempt of this very request
    # ran, its reply was lost), the script writes and journals nothing, answers each write
    # as it was answered then and reads afresh; an "r" that did not delete then compares
    # and deletes again (only a claim still holding tok, which it can never hold again).
    APPLY = """
local out = {}
local bound, ttl = ARGV[1], ARGV[2]
local function failed(r) return type(r) == 'table' and r.err ~= nil end
local function journal(doc) return redis.pcall('XADD', KEYS[4], 'MAXLEN', '~', bound, '*', 'e', doc) end
local function first(a, b) if failed(a) then return a end if failed(b) then return b end return a end
local function release(key, tok)
  local held = redis.pcall('GET', key)
  if failed(held) then return held elseif held == tok then return redis.pcall('DEL', key) end
  return 0
end
local kept, answers, wrote = nil, {}, false
if ARGV[3] == '1' then
  local prev = redis.pcall('GET', KEYS[5])
  if failed(prev) then return prev end
  if prev then kept = cjson.decode(prev) end
end
local i, n = 4, 0
while i <= #ARGV do
  local op = ARGV[i]
  n = n + 1
  local was = kept and kept[tostring(n)]
  if op == 'h' then
    -- In slices: unpack() of more values than Lua's C stack holds (~8,000) is an error
    -- of the whole script, which would fail every op of the turn, turn after turn.
    local k = tonumber(ARGV[i + 1])
    local vals, at, last = {}, i + 2, i + 1 + k
    while at <= last do
      local upto = math.min(at + 999, last)
      local r = redis.pcall('HMGET', KEYS[1], unpack(ARGV, at, upto))
      if failed(r) then vals = r break end
      for j = 1, #r do vals[#vals + 1] = r[j] end
      at = upto + 1
    end
    out[n] = vals
    i = i + 2 + k
  elseif op == 'r' then
    local key, tok = KEYS[tonumber(ARGV[i + 1])], ARGV[i + 2]
    if kept then
      out[n] = was == 1 and 1 or release(key, tok)
    else
      local j = journal(ARGV[i + 3])
      if failed(j) then out[n] = j else out[n] = release(key, tok) wrote = true end
    end
    i = i + 4
  elseif kept then
    out[n] = was
    i = i + (op == 'j' and 2 or 3)
  elseif op == 'j' then
    out[n] = journal(ARGV[i + 1])
    wrote = wrote or not failed(out[n])
    i = i + 2
  else
    local w
    if op == 'd' then w = redis.pcall('HSET', KEYS[1], ARGV[i + 1], ARGV[i + 2])
    elseif op == 'a' then w = redis.pcall('HINCRBY', KEYS[2], ARGV[i + 1], 1)
    elseif op == 'e' then w = redis.pcall('HSETNX', KEYS[3], ARGV[i + 1], ARGV[i + 2])
    else return redis.error_reply('unknown ledger op ' .. tostring(op)) end
    local j = journal(ARGV[i + 2])
    out[n] = first(w, j)
    wrote = wrote or not (failed(w) and failed(j))
    i = i + 3
  end
  if op ~= 'h' then answers[tostring(n)] = out[n] end
end
if wrote then
  local s = redis.pcall('SET', KEYS[5], cjson.encode(answers), 'PX', ttl)
  if failed(s) then
    for k, _ in pairs(answers) do out[tonumber(k)] = first(out[tonumber(k)], s) end
  end
end
return out
"""

    SCRIPTS = {"RESOLVE": RESOLVE, "APPLY": APPLY}

    def __init__(
        self,
        target: str | Any,
        *,
        namespace: str = DEFAULT_NAMESPACE,
        socket_timeout: float = 5.0,
        journal_maxlen: int = 1_000_000,
        retries: int | None = None,
        marker_ttl: float = 120.0,
    ) -> None:
        super().__init__(target, namespace, socket_timeout, retries)
        # A write's last repeat is sent at most (repeats + 1) round trips of up to the socket
        # timeout (and a cluster's half-second TRYAGAIN) after its first attempt.
        longest = ((3 if retries is None else retries) + 1) * (socket_timeout + 1.0)
        if isinstance(marker_ttl, bool) or not isinstance(marker_ttl, int | float) or marker_ttl < longest:
            raise ConfigurationError(
                f"marker_ttl must be a number of seconds >= {longest:g} (the longest a write's repeats can take "
                f"with socket_timeout={socket_timeout:g}), got {marker_ttl!r}: it is how long the server "
                f"remembers a write so that its repeat finds it; raise it, or lower socket_timeout")
        self._marker_ms = int(marker_ttl * 1000)
        self._once = f"{self._ns}:once:"
        self.description = f"{self.where} ledger {self._ns}:*"
        self._done = f"{self._ns}:done"
        self._attempts = f"{self._ns}:attempts"
        self._esc = f"{self._ns}:escalations"
        self._resolved = f"{self._ns}:escalations:resolved"
        self._journal = f"{self._ns}:journal"
        self._maxlen = journal_maxlen
        self._writes: TurnBatch[tuple[str, tuple[Any, ...]]] = TurnBatch(self._apply)

    async def _apply(self, ops: list[tuple[str, tuple[Any, ...]]]) -> list[Any]:
        """Every op of one turn in one run of ``APPLY`` (one request, one reply to parse,
        instead of a pipeline of two commands an op), repeated whole while its reply is
        lost (the turn's write marker makes that safe); each op's answer is its own."""
        keys = [self._done, self._attempts, self._esc, self._journal]
        writes = any(kind != "hmget" for kind, _ in ops)
        if writes:
            keys.append(self._once + secrets.token_hex(12))  # the turn's write id
        args: list[Any] = [self._maxlen, self._marker_ms, "1" if writes else "0"]
        for kind, a in ops:
            if kind == "hmget":
                args += ["h", len(a), *a]
            elif kind == "release":  # (claim key, token, doc)
                keys.append(a[0])
                args += ["r", len(keys), a[1], a[2]]
            elif kind == "journal":
                args += ["j", a[1]]
            else:
                args += [_OPS[kind], a[0], a[1]]
        return list(await self._eval("APPLY", keys, args))

    async def completed(self, tokens: Collection[str]) -> set[str]:
        """The recovery tokens among ``tokens`` already recorded as done (one HMGET)."""
        toks = list(tokens)
        if not toks:
            return set()
        try:
            vals = await self._writes.submit(("hmget", tuple(toks)))
        except self._failures as exc:
            raise self._unavailable(exc, "reading the done index", "done index") from exc
        return {t for t, v in zip(toks, vals, strict=True) if v is not None}

    async def attempts(self, token: str) -> int:
        """How many handler calls were started for ``token`` (diagnostics, tests)."""
        try:
            v = await self._read(lambda c: c.hget(self._attempts, token))
        except self._failures as exc:
            raise self._unavailable(exc, "reading attempts", "read") from exc
        return int(v or 0)

    async def record(self, entry: LedgerEntry) -> None:
        """Record ``entry`` in the done index and the audit stream."""
        doc = json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":"))
        kind = {LedgerKind.DONE: "done", LedgerKind.ATTEMPT: "attempt"}.get(entry.kind, "journal")
        try:
            await self._writes.submit((kind, (entry.token, doc)))
        except self._failures as exc:
            raise self._unavailable(exc, f"journaling {entry.kind.value} of {entry.token[:12]}",
                                    entry.kind.value) from exc

    def releases_for(self, lock: object) -> bool:
        """Can ``record_release`` free claims of ``lock``: a ``RedisClaimLock`` on the same
        server (the same URL, or the same client) and in the same namespace, so its keys
        and this journal's are in one hash slot?"""
        if not isinstance(lock, RedisClaimLock) or lock._ns != self._ns:
            return False
        if self._url is not None:
            return lock._url == self._url
        return lock._fixed is not None and lock._fixed is self._fixed

    async def record_release(self, entry: LedgerEntry, lock: RedisClaimLock, claim: Claim) -> bool:
        """Journal ``entry`` (the audit stream only: a saga's closing entry) and release
        ``claim`` of ``lock`` in one request: one run of a script (no other command runs
        between the two), which releases the claim only once the entry is written. True if
        the claim was still ours and is deleted now.
        Needs ``releases_for(lock)``. A request whose reply was lost is repeated (see the
        module doc): the repeat finds the turn's marker, journals nothing again, and
        answers True if the first attempt deleted the claim (else it compares the token
        and deletes again). Raises ``ClaimStoreUnavailable``: refused, the claim is still
        held (and the entry not written, unless the claim's key was refused); every reply
        lost, the entry may have been written once and the claim deleted, or neither.
        Either way the caller releases the claim on its own (a release that finds it gone
        does nothing) or lets it expire."""
        if entry.kind in (LedgerKind.DONE, LedgerKind.ATTEMPT):
            raise ConfigurationError(f"record_release journals an entry of the audit stream only, not {entry.kind.value!r}")
        if not self.releases_for(lock):
            raise ConfigurationError(f"{lock!r} is not on this ledger's server and namespace ({self.description})")
        doc = json.dumps(entry.to_json(), sort_keys=True, separators=(",", ":"))
        try:
            out = await self._writes.submit(("release", (lock.key(claim.name), claim.token, doc)))
        except self._failures as exc:
            raise self._unavailable(
                exc, f"journaling {entry.kind.value} of {entry.token[:12]} and releasing its claim", "saga and release") from exc
        return bool(out)

    async def escalate(self, escalation: Escalation) -> bool:
        """Record ``escalation``; False if it was already recorded."""
        doc = json.dumps(escalation.to_json(), sort_keys=True, separators=(",", ":"))
        try:
            new = await self._writes.submit(("escalate", (escalation.id, doc)))
        except self._failures as exc:
            raise self._unavailable(exc, f"queueing escalation {escalation.id}", "escalate") from exc
        return bool(new)

    async def escalations(self, *, include_resolved: bool = False) -> list[Escalation]:
        """The open escalations (all with ``include_resolved``)."""
        async def both(client: Any) -> Any:
            pipe = client.pipeline(transaction=False)
            pipe.hgetall(self._esc)
            pipe.hgetall(self._resolved)
            return await pipe.execute()

        try:
            raw, resolved = await self._read(both)
        except self._failures as exc:
            raise self._unavailable(exc, "listing escalations", "read") from exc
        out: list[Escalation] = []
        for k, v in raw.items():
            esc = Escalation.from_json(json.loads(v))
            r = resolved.get(k)
            if r is not None:
                rd = json.loads(r)
                esc = esc.resolved(str(rd["by"]), str(rd.get("note", "")), float(rd["ts"]))
            if include_resolved or esc.open:
                out.append(esc)
        return sorted(out, key=lambda e: (e.ts, e.id))

    async def resolve_escalation(self, escalation_id: str, *, by: str, note: str = "") -> bool:
        """Close the escalation ``escalation_id``; False if there is none open."""
        doc = json.dumps({"by": by, "note": note, "ts": time.time()}, sort_keys=True)
        try:
            out = await self._eval("RESOLVE", [self._esc, self._resolved], [escalation_id, doc])
        except self._failures as exc:
            raise self._unavailable(exc, f"resolving escalation {escalation_id}", "resolve") from exc
        return bool(out)

    def __repr__(self) -> str:
        return f"<RedisLedger {self.description}>"
