"""Projection: writing policy documents into Redis, and reading them back.

The key schema (docs/policy-plane.md is the contract; ``P`` is the key prefix,
``agentsaga`` by default, ``{agentsaga}`` on a Redis Cluster so every key shares a slot):

    P:v1:rev                         STRING  change counter, INCR on every change
    P:v1:events                      CHANNEL one JSON notification per change
    P:v1:<kind>:<ns>/<name>          STRING  the document (JSON, "rev" first)
    P:v1:<kind>:index                SET     "<ns>/<name>" of every document of the kind
    P:v1:approval:decision:<request> STRING  a human's decision (JSON), written once
    P:v1:synced                      HASH    the synced marker: field "operator" after a
                                             full projection, "store" on a CLI write
    P:v1:synced:pending:<nonce>      STRING  a full projection in progress (see ``mark_synced``)

``<kind>`` is ``killswitch``, ``budgetlimit``, ``sagapolicy`` or ``modelroute``.

Invariants:
- One Lua script per change: the document, the index, the counter and the notification
  move together (a reader never sees a document missing from the index, or a
  notification for a write that did not happen).
- Writing an unchanged document changes nothing and notifies nobody (the periodic
  resync is cheap and silent); writing into an emptied server (FLUSHALL) restores it.
- A decision is put once: a second, different decision is refused (``DecisionConflict``),
  mirroring the CRD's immutability rule; the one exception is an approval the agents
  ignore (unsigned or untrusted), which a proven decision may replace by naming that
  exact document (``decide(replaces=...)``), as the CRD allows changing it.
- ``rev`` is a change token, not a clock: after the server loses its data it counts
  from 1 again, so readers compare it for inequality, never for order.
- The marker's ``operator`` field is set only once every resource has been projected
  since it was found missing (``marker.SyncMarker``), never by a single put: documents
  without the marker are a partial state, which a reader that saw the marker before does
  not take for the whole truth (docs/policy-plane.md, "The synced marker").
- A request whose reply was lost (a closed connection: a restart, a failover, a client
  killing connections) is sent again at once, then with backoff, at most ``retries`` times
  within ``deadline`` seconds (``agent_saga._repeat``), and each repeat is logged: every
  write here is idempotent (an unchanged document, a missing one, a decision already
  stored change nothing), so a KillSwitch lands in a storm of closed connections without
  waiting for the handler's retry. The synced marker is the exception (sent once: its
  repeat would ask for a new full projection).
- Every Redis failure raises ``ProjectionUnavailable`` (the handler retries it).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from agent_saga.controls import BudgetLimit, RateLimit
from agent_saga.controls.limits import limits_from_documents, scope_from_name
from agent_saga.plane import (
    PLANE_FIX,
    ReplyLost,
    aclose,
    check_retries,
    connect_async,
    lost_text,
    repeating,
    script,
    tagged_on_cluster,
)

__all__ = [
    "KIND_SLUGS",
    "DecisionConflict",
    "Keys",
    "ProjectionUnavailable",
    "Projector",
    "limits_from_documents",
    "load_limit_documents",
    "load_limits",
    "scope_from_name",
]

KindSlug = Literal["killswitch", "budgetlimit", "sagapolicy", "modelroute"]
KIND_SLUGS: dict[str, KindSlug] = {
    "KillSwitch": "killswitch",
    "BudgetLimit": "budgetlimit",
    "SagaPolicy": "sagapolicy",
    "ModelRoute": "modelroute",
}
NOTIFICATION_VERSION = 1
log = logging.getLogger("agent_saga_operator.projection")

#: Seconds a decision outlives its deadline (RedisApprovalStore(retention=...) default).
DECISION_RETENTION = 7 * 86_400.0


class ProjectionUnavailable(Exception):
    """Redis could not be written or read; the message names the server and the step."""


class DecisionConflict(Exception):
    """The policy plane already holds a different decision for this request."""

    def __init__(self, request_id: str, stored: dict[str, Any]) -> None:
        super().__init__(f"request {request_id} already has decision {stored.get('decision')!r} "
                         f"by {stored.get('approver')!r} in the policy plane")
        self.request_id = request_id
        self.stored = stored


@dataclass(frozen=True, slots=True)
class Keys:
    """The key schema under one prefix (see the module doc)."""

    prefix: str = "agentsaga"

    @property
    def rev(self) -> str:
        """The change counter's key (``P:rev``)."""
        return f"{self.prefix}:v1:rev"

    @property
    def channel(self) -> str:
        """The change notifications' channel (``P:events``)."""
        return f"{self.prefix}:v1:events"

    def doc(self, slug: str, id_: str) -> str:
        """The key of the document ``id_`` of kind ``slug``."""
        return f"{self.prefix}:v1:{slug}:{id_}"

    def index(self, slug: str) -> str:
        """The index (a set of ids) of the documents of kind ``slug``."""
        return f"{self.prefix}:v1:{slug}:index"

    def decision(self, request_id: str) -> str:
        """The key of the decision on approval request ``request_id``."""
        return f"{self.prefix}:v1:approval:decision:{request_id}"

    @property
    def approval_keys(self) -> str:
        """The trusted approver public keys (a hash: key id -> PEM), published for agents."""
        return f"{self.prefix}:v1:approval:keys"

    @property
    def pending(self) -> str:
        """The pending approval requests' key (a sorted set by deadline)."""
        return f"{self.prefix}:v1:approval:pending"

    @property
    def unmirrored(self) -> str:
        """The approval requests no operator has mirrored yet (a sorted set by the time
        their documents expire), decided or not."""
        return f"{self.prefix}:v1:approval:unmirrored"

    @property
    def synced(self) -> str:
        """The synced marker's key (a hash, one field per writer)."""
        return f"{self.prefix}:v1:synced"

    def sync_pending(self, nonce: str) -> str:
        """The key noting that the full projection ``nonce`` is under way."""
        return f"{self.prefix}:v1:synced:pending:{nonce}"


def _canonical(doc: dict[str, Any]) -> str:
    return json.dumps(doc, sort_keys=False, separators=(",", ":"), ensure_ascii=False)


class Projector:
    """Writes documents for one Redis server (``redis.asyncio`` client, one event loop).

    ``put`` / ``delete`` return the new ``rev``, or 0 when nothing changed.
    """

    # KEYS[1] the document   KEYS[2] the kind's index   KEYS[3] the change counter
    # ARGV[1] "<ns>/<name>"  ARGV[2] the document without "rev": "{" + members + "}"
    # ARGV[3] the channel    ARGV[4] the notification without "rev", same shape
    # The stored document is '{"rev":N,' .. members; unchanged members -> return 0
    # (the index is still healed); else INCR, SET, SADD, PUBLISH and return N.
    LUA_PUT = """
local body = string.sub(ARGV[2], 2)
local cur = redis.call('GET', KEYS[1])
if cur then
  local comma = string.find(cur, ',', 1, true)
  if comma and string.sub(cur, comma + 1) == body then
    redis.call('SADD', KEYS[2], ARGV[1])
    return 0
  end
end
local rev = redis.call('INCR', KEYS[3])
redis.call('SET', KEYS[1], '{"rev":' .. rev .. ',' .. body)
redis.call('SADD', KEYS[2], ARGV[1])
redis.call('PUBLISH', ARGV[3], '{"rev":' .. rev .. ',' .. string.sub(ARGV[4], 2))
return rev
"""

    # KEYS and ARGV[1], ARGV[3], ARGV[4] as LUA_PUT. Deletes the document and its index
    # entry; notifies only if a document was there.
    LUA_DELETE = """
redis.call('SREM', KEYS[2], ARGV[1])
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
local rev = redis.call('INCR', KEYS[3])
redis.call('PUBLISH', ARGV[3], '{"rev":' .. rev .. ',' .. string.sub(ARGV[4], 2))
return rev
"""

    # KEYS[1] the decision   KEYS[2] the change counter   KEYS[3] the pending set
    # ARGV[1] the decision without "rev"   ARGV[2] the channel   ARGV[3] the notification
    # ARGV[4] the request id   ARGV[5] time to live in ms (the runtime's: the request's
    # lifetime plus retention)   ARGV[6] the exact stored decision this one replaces
    # ('' : none may be stored; the caller judged that one an approval agents ignore)
    # Put once (compare-and-set against absence, as RedisApprovalStore.LUA_DECIDE): if a
    # decision is stored (other than ARGV[6]), return it untouched (the caller compares);
    # else write it, take the request out of the pending set, notify, and return the new rev.
    LUA_DECIDE = """
local cur = redis.call('GET', KEYS[1])
if cur and (ARGV[6] == '' or cur ~= ARGV[6]) then return cur end
local rev = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], '{"rev":' .. rev .. ',' .. string.sub(ARGV[1], 2), 'PX', ARGV[5])
redis.call('ZREM', KEYS[3], ARGV[4])
redis.call('PUBLISH', ARGV[2], '{"rev":' .. rev .. ',' .. string.sub(ARGV[3], 2))
return rev
"""

    # KEYS[1] the synced marker   KEYS[2] the change counter   KEYS[3] the pending key
    # ARGV[1] the writer field   ARGV[2] the time (epoch seconds)   ARGV[3] the channel
    # ARGV[4] the notification without "rev"
    # The pending key was set when the full projection began: if it is gone, the server
    # lost its data again meanwhile and what was projected may be gone too (-1, start
    # over). An existing field is left alone (0: no churn, no notification). Else set it,
    # INCR, notify, and return the new rev.
    LUA_MARK = """
if redis.call('EXISTS', KEYS[3]) == 0 then return -1 end
redis.call('DEL', KEYS[3])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
local rev = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], ARGV[1], '{"v":1,"writer":"' .. ARGV[1] .. '","rev":' .. rev .. ',"ts":' .. ARGV[2] .. '}')
redis.call('PUBLISH', ARGV[3], '{"rev":' .. rev .. ',' .. string.sub(ARGV[4], 2))
return rev
"""

    #: The synced marker's field this operator owns.
    WRITER = "operator"

    def __init__(self, url: str, *, prefix: str = "agentsaga", socket_timeout: float = 5.0,
                 client: Any = None, retries: int = 5, deadline: float = 10.0) -> None:
        if not prefix or any(c in prefix for c in " \n"):
            raise ValueError(f"key prefix {prefix!r} must be non-empty without spaces")
        check_retries(retries)
        if not 0 < deadline < float("inf"):
            raise ValueError(f"deadline must be a positive number of seconds, got {deadline!r}")
        self.retries = retries
        self.deadline = deadline
        tagged_on_cluster(url, prefix, "the operator's projection", PLANE_FIX)
        self.url = url
        self.keys = Keys(prefix)
        self._owned = client is None
        if client is None:
            client = connect_async(url, feature="the operator's projection", socket_timeout=socket_timeout,
                                   health_check_interval=30)
        self.client = client
        self._scripts: dict[str, Any] = {}

    def describe(self) -> str:
        """The policy plane's address, without a password."""
        url = self.url
        if "@" in url and "://" in url:
            scheme, rest = url.split("://", 1)
            url = f"{scheme}://***@{rest.rsplit('@', 1)[1]}"
        return url

    async def aclose(self) -> None:
        """Close the client (and its connections; every node's, on a cluster)."""
        await (aclose(self.client) if self._owned else self.client.aclose())

    async def ping(self) -> None:
        """Raise ``ProjectionUnavailable`` unless the server answers."""
        await self._io("ping", lambda: self.client.ping())

    # ------------------------------------------------------------------ writes
    @staticmethod
    def _notification(kind: str, id_: str, op: str) -> str:
        return _canonical({"v": NOTIFICATION_VERSION, "kind": kind, "id": id_, "op": op})

    async def put(self, kind: str, id_: str, doc: dict[str, Any]) -> int:
        """Write ``doc`` (without ``rev``) as the document of ``kind`` ``id_``."""
        slug = KIND_SLUGS[kind]
        body = _canonical(doc)
        keys = (self.keys.doc(slug, id_), self.keys.index(slug), self.keys.rev)
        args = (id_, body, self.keys.channel, self._notification(kind, id_, "put"))
        return int(await self._script("put", self.LUA_PUT, keys, args))

    async def delete(self, kind: str, id_: str) -> int:
        """Remove the document of ``kind`` ``id_`` (0 if there was none)."""
        slug = KIND_SLUGS[kind]
        keys = (self.keys.doc(slug, id_), self.keys.index(slug), self.keys.rev)
        args = (id_, "{}", self.keys.channel, self._notification(kind, id_, "delete"))
        return int(await self._script("delete", self.LUA_DELETE, keys, args))

    async def decide(self, request_id: str, doc: dict[str, Any], *, deadline: datetime | None = None,
                     now: datetime | None = None, retention: float = DECISION_RETENTION,
                     replaces: str = "") -> int:
        """Put a decision once at the runtime's key (``RedisApprovalStore.decision_key``);
        raises ``DecisionConflict`` if a different one is stored (other than ``replaces``,
        the exact text of an approval the agents ignore). The document lives for the time
        left until ``deadline`` plus ``retention`` seconds (the runtime's rule)."""
        body = _canonical(doc)
        left = 0.0 if deadline is None or now is None else max(0.0, (deadline - now).total_seconds())
        ttl_ms = str(max(1000, int((left + retention) * 1000)))
        keys = (self.keys.decision(request_id), self.keys.rev, self.keys.pending)
        args = (body, self.keys.channel, self._notification("ApprovalDecision", request_id, "put"), request_id,
                ttl_ms, replaces)
        reply = await self._script("decide", self.LUA_DECIDE, keys, args)
        if isinstance(reply, bytes | str):
            stored = json.loads(reply)
            same = ("decision", "approver", "argumentsDigest")
            if any((stored.get(k) or None) != (doc.get(k) or None) for k in same):
                raise DecisionConflict(request_id, stored)
            return 0
        return int(reply)

    async def begin_sync(self, nonce: str, *, ttl: float = 86_400.0) -> None:
        """Note that a full projection starts now (``mark_synced`` needs the note intact)."""
        await self._io("set", lambda: self.client.set(self.keys.sync_pending(nonce), "1", px=int(ttl * 1000)))

    async def mark_synced(self, nonce: str, *, now: float) -> int:
        """Set the marker's ``operator`` field after a full projection begun with
        ``begin_sync(nonce)``: the new rev, 0 if it was set already, -1 if the server lost
        its data since ``begin_sync`` (project again)."""
        keys = (self.keys.synced, self.keys.rev, self.keys.sync_pending(nonce))
        args = (self.WRITER, f"{now:.3f}", self.keys.channel, self._notification("PolicyPlane", self.WRITER, "synced"))
        return int(await self._script("mark", self.LUA_MARK, keys, args, repeat=False))

    async def is_synced(self) -> bool:
        """Does the policy plane carry this operator's synced marker?"""
        return bool(await self._io("hexists", lambda: self.client.hexists(self.keys.synced, self.WRITER)))

    async def plane_rev(self) -> int | None:
        """The change counter (``None``: none, the plane is empty)."""
        rev = await self._io("get", lambda: self.client.get(self.keys.rev))
        return None if rev is None else int(rev)

    async def unmark(self) -> None:
        """Remove this operator's synced marker field (the plane is not whole any more)."""
        await self._io("hdel", lambda: self.client.hdel(self.keys.synced, self.WRITER))

    # ------------------------------------------------------------------ reads
    async def get(self, kind: str, id_: str) -> dict[str, Any] | None:
        """The document ``id_`` of ``kind``, or ``None``."""
        raw = await self._io("get", lambda: self.client.get(self.keys.doc(KIND_SLUGS[kind], id_)))
        return json.loads(raw) if raw is not None else None

    async def publish_keys(self, keys: Mapping[str, str]) -> bool:
        """Make the published approver keys exactly ``keys`` (key id -> PEM); True if
        anything changed (a rotation: new ids added, retired ones removed). With no keys
        configured nothing is touched: turning signing off is an explicit ``DEL``, never a
        side effect of an operator started without its key."""
        if not keys:
            return False
        raw = await self._io("hgetall", lambda: self.client.hgetall(self.keys.approval_keys))
        have = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in raw.items()}
        if have == dict(keys):
            return False
        gone = [k for k in have if k not in keys]
        if gone:
            await self._io("hdel", lambda: self.client.hdel(self.keys.approval_keys, *gone))
        await self._io("hset", lambda: self.client.hset(self.keys.approval_keys, mapping=dict(keys)))
        return True

    async def preload_scripts(self) -> int:
        """``SCRIPT LOAD`` the runtime's scripts the server does not hold (agents whose ACL
        forbids loading scripts can then run them by SHA); how many were loaded."""
        import hashlib

        from agent_saga.plane import agent_scripts

        texts = agent_scripts()
        shas = [hashlib.sha1(t.encode()).hexdigest() for t in texts]  # noqa: S324 - Redis names scripts by SHA-1
        have = await self._io("script exists", lambda: self.client.script_exists(*shas))
        missing = [t for t, ok in zip(texts, have, strict=True) if not ok]
        for t in missing:
            await self._io("script load", lambda t=t: self.client.script_load(t))
        return len(missing)

    async def get_decision(self, request_id: str) -> dict[str, Any] | None:
        """The decision stored for ``request_id``, or ``None``."""
        raw = await self.get_decision_text(request_id)
        return json.loads(raw) if raw is not None else None

    async def get_decision_text(self, request_id: str) -> str | None:
        """The decision stored for ``request_id`` exactly as stored (what ``decide``'s
        ``replaces`` names), or ``None``."""
        raw = await self._io("get", lambda: self.client.get(self.keys.decision(request_id)))
        return raw.decode() if isinstance(raw, bytes) else raw

    async def ids(self, kind: str) -> set[str]:
        """The ids in the index of ``kind``."""
        raw = await self._io("smembers", lambda: self.client.smembers(self.keys.index(KIND_SLUGS[kind])))
        return {m.decode() if isinstance(m, bytes) else str(m) for m in raw}

    async def documents(self, kind: str, namespace: str | None = None) -> list[dict[str, Any]]:
        """Every document of ``kind`` (in ``namespace`` if given), sorted by id."""
        return await load_documents(self.client, kind, namespace=namespace, keys=self.keys)

    # ------------------------------------------------------------------ I/O
    async def _script(self, name: str, lua: str, keys: Sequence[str], args: Sequence[str], *,
                      repeat: bool = True) -> Any:
        """Run ``lua`` through redis-py's ``register_script`` (EVALSHA, reloaded on NOSCRIPT)."""
        run = self._scripts.get(name)
        if run is None:
            run = self._scripts[name] = script(self.client, lua)
        what = f"{name} {keys[0]}"
        return await self._io(what, lambda: run(keys=keys, args=args, client=self.client), repeat=repeat)

    async def _io(self, what: str, op: Any, *, repeat: bool = True) -> Any:
        """``await op()``, repeated while its reply is lost (see the module doc)."""
        repeats: list[str] = []

        def again(attempt: int, why: str) -> None:
            repeats.append(why)
            log.warning("policy plane %s: %s lost its reply (%s); sending it again (repeat %d of at most %d)",
                        self.describe(), what, why, attempt, self.retries)

        try:
            result = await repeating(lambda _repeat: op(), retries=self.retries if repeat else 0, client=self.client,
                                     deadline=time.monotonic() + self.deadline, on_repeat=again)
        except ReplyLost as lost:
            raise ProjectionUnavailable(lost_text(f"policy plane {self.describe()}", what, lost,
                                                  "not projected (the handler retries)")) from lost.error
        except Exception as exc:
            raise ProjectionUnavailable(
                f"policy plane {self.describe()} failed during {what} ({type(exc).__name__}: {exc})"
            ) from exc
        if repeats:
            log.warning("policy plane %s: %s landed after %d attempts (the connection was lost %d time(s))",
                        self.describe(), what, len(repeats) + 1, len(repeats))
        return result


# ---------------------------------------------------------------------- readers
async def load_documents(
    client: Any, kind: str, *, namespace: str | None = None, keys: Keys | None = None
) -> list[dict[str, Any]]:
    """Every document of ``kind`` through its index (``namespace``: only that one).

    A reader's view, as the runtime's stores take it: documents whose ``v`` it does not
    know are skipped (written by a newer operator), never guessed at.
    """
    keys = keys or Keys()
    slug = KIND_SLUGS[kind]
    members = sorted(m.decode() if isinstance(m, bytes) else str(m) for m in await client.smembers(keys.index(slug)))
    if namespace is not None:
        members = [m for m in members if m.split("/", 1)[0] == namespace]
    if not members:
        return []
    raws = await client.mget([keys.doc(slug, m) for m in members])
    docs = []
    for raw in raws:
        if raw is None:
            continue
        doc = json.loads(raw)
        if doc.get("v") == 1:
            docs.append(doc)
    return docs


async def load_limit_documents(client: Any, namespace: str | None = None, *, prefix: str = "agentsaga") -> list[dict[str, Any]]:
    """Every BudgetLimit document (of ``namespace`` if given), sorted by id."""
    return await load_documents(client, "BudgetLimit", namespace=namespace, keys=Keys(prefix))


async def load_limits(client: Any, namespace: str | None = None, *, prefix: str = "agentsaga") -> list[BudgetLimit | RateLimit]:
    """The limits the operator projected for ``namespace``, ready for ``PreFlightGate(limits=...)``.

    ``client`` is a ``redis.asyncio`` client (a one-shot read, for tests and tools);
    agents use ``agent_saga.controls.RedisLimitSource``, which also follows changes.
    """
    return limits_from_documents(await load_limit_documents(client, namespace, prefix=prefix))
