"""``RedisApprovalStore``: approval requests and decisions in the policy plane.

Keys (``prefix`` default ``agentsaga:v1``, ``{agentsaga}:v1`` on a Redis Cluster; the
schema of docs/policy-plane.md and docs/approvals.md, shared with the operator):

    {prefix}:approval:request:<ns>/<pod>/<id>
                                      STRING  the request (JSON), written by the agent
                                              <ns>/<pod> (``owner=``; its ACL lets it write
                                              only under its own name); without an owner
                                              (one credential shared by a fleet):
                                              {prefix}:approval:request:<id>
    {prefix}:approval:consumed:<ns>/<pod>/<id>
                                      STRING  the approval was used (written once, by the
                                              owner; ``...:consumed:<id>`` without an owner)
    {prefix}:approval:pending         ZSET    request id -> deadline (epoch seconds)
    {prefix}:approval:unmirrored      ZSET    request id -> when its document expires (epoch
                                              seconds), until an operator has mirrored it
    {prefix}:approval:decision:<id>   STRING  the decision (JSON), written once
    {prefix}:approval:keys            HASH    key id -> trusted approver public key (PEM),
                                              published by the operator
    {prefix}:rev                      STRING  change counter (INCR per decision)
    {prefix}:events                   channel {"kind": "ApprovalRequest" | "ApprovalDecision",
                                               "id": <request id>, "op": "put"}

Invariants:
- A reader without an owner (the CLI, the operator) finds a request by its id under any
  agent's name, and takes a document only if it is that agent's (``owner_problem``: the
  owner it names and the id derived with it): another agent cannot plant a request
  under its own name that passes for this one.
- Consumption is recorded in a key of its own, set once (``SET NX``) and never cleared:
  rewriting the request document (``consumedAt`` back to null) does not make an
  approval usable again.
- Requests change by compare-and-set of the whole document (``LUA_CAS``); decisions are
  written only if none exists (``LUA_DECIDE``), which also takes the request out of the
  pending set: two deciders never both win, and nothing overwrites a decision.
- A new request also joins the unmirrored set, which a decision does not leave: a request
  decided or expired while no operator ran still becomes an ``Approval`` when one starts
  (the operator takes it out once the ``Approval`` exists). Entries whose document has
  expired are trimmed by the next new request and by the operator.
- Documents are kept for the request's lifetime plus ``retention`` (the WAL keeps the
  records for good).
- A request whose reply was lost (``agent_saga._repeat``) is sent again, at most
  ``retries`` times (default 1; 3 on a Redis Cluster), and only because each is safe to
  repeat: reads; a compare-and-set, whose repeat finds the document it wrote (the swap
  landed: success) or refuses as before; a decision, written once (a repeat answers the
  decision stored, its own). After the last loss the call raises
  ``ApprovalStoreUnavailable`` saying the connection was lost (the gateway denies).
- ``redis`` is imported only when a client is made; a password never reaches a message.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

from ..._redis import RedisStore
from ...clocks import format_instant
from ...errors import ConfigurationError, StoreUnavailable
from ._model import ApprovalRequest, Decision
from ._store import ApprovalStoreUnavailable, Change

__all__ = ["RedisApprovalStore"]

DEFAULT_PREFIX = "agentsaga:v1"


class RedisApprovalStore(RedisStore):
    """Requests in the policy plane, shared by every agent, the CLI and the operator
    (see the module doc). ``retries``: how many times a request whose reply was lost is
    sent again (default 1; 3 on a Redis Cluster). Needs ``pip install agent-saga[redis]``.
    Its client, scripts, repeats, error mapping, cluster guard and ``close`` are
    ``agent_saga._redis.RedisStore``'s."""

    NAME = "RedisApprovalStore"
    UNAVAILABLE = ApprovalStoreUnavailable

    # KEYS[1] the request document, KEYS[2] the pending set, KEYS[3] the unmirrored set
    # ARGV[1] the document as the caller read it ('' : it must not exist yet)
    # ARGV[2] the new document, ARGV[3] its time to live in ms, ARGV[4] the request id,
    # ARGV[5] its deadline (epoch seconds), ARGV[6] the change channel, ARGV[7] its
    # request time and ARGV[8] its document's expiry (epoch seconds)
    # Returns 1 when the swap happened, else the current document ('' if there is none):
    # compare-the-document-then-act. A new request joins the pending and unmirrored sets;
    # unmirrored entries whose documents expired before this request was made leave.
    LUA_CAS = """
local cur = redis.call('GET', KEYS[1])
if not cur then cur = '' end
if cur ~= ARGV[1] then return cur end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
if ARGV[1] == '' then
  redis.call('ZADD', KEYS[2], ARGV[5], ARGV[4])
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. ARGV[7])
  redis.call('ZADD', KEYS[3], ARGV[8], ARGV[4])
end
redis.call('PUBLISH', ARGV[6], '{"v":1,"kind":"ApprovalRequest","id":"' .. ARGV[4] .. '","op":"put"}')
return 1
"""

    # KEYS[1] the decision document, KEYS[2] the pending set, KEYS[3] the change counter
    # ARGV[1] the decision without rev ('{...}'), ARGV[2] the request id, ARGV[3] its time
    # to live in ms, ARGV[4] the change channel, ARGV[5] the exact stored decision this one
    # replaces ('' : none may be stored; the caller judged that one unproven)
    # Written once: returns {1, doc} when this call wrote it, {0, doc} with the decision
    # that was there first otherwise.
    LUA_DECIDE = """
local cur = redis.call('GET', KEYS[1])
if cur and (ARGV[5] == '' or cur ~= ARGV[5]) then return {0, cur} end
local rev = redis.call('INCR', KEYS[3])
local doc = '{"rev":' .. rev .. ',' .. string.sub(ARGV[1], 2)
redis.call('SET', KEYS[1], doc, 'PX', ARGV[3])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('PUBLISH', ARGV[4], '{"rev":' .. rev .. ',"v":1,"kind":"ApprovalDecision","id":"' .. ARGV[2] .. '","op":"put"}')
return {1, doc}
"""

    def __init__(
        self,
        url: str,
        *,
        prefix: str = DEFAULT_PREFIX,
        retention: float = 7 * 86_400,
        socket_timeout: float = 2.0,
        connect_timeout: float = 1.0,
        retries: int | None = None,
        owner: str | None = None,
    ) -> None:
        self._open(url, socket_timeout=socket_timeout, connect_timeout=connect_timeout, retries=retries,
                   prefix=prefix)
        if owner is not None and (owner.count("/") != 1 or not all(owner.split("/"))
                                  or any(c in owner for c in " *?[]\\")):
            raise ConfigurationError(f"RedisApprovalStore owner {owner!r}: give <namespace>/<pod>, the agent's name "
                                     f"as its ACL user's --agent (no glob characters)")
        #: ``<namespace>/<pod>``: the agent whose requests this store writes ("" : a
        #: reader, or an agent sharing one credential with its fleet).
        self.owner = owner or ""
        self._located: dict[str, str] = {}
        self.prefix = prefix
        self.pending_key = f"{prefix}:approval:pending"
        self.unmirrored_key = f"{prefix}:approval:unmirrored"
        self.keys_key = f"{prefix}:approval:keys"
        self.rev_key = f"{prefix}:rev"
        self.channel = f"{prefix}:events"
        self.retention = retention

    def request_key(self, request_id: str, owner: str | None = None) -> str:
        """The key of the request document ``request_id`` of ``owner`` (default: this
        store's; a reader finds it under any agent's name: ``_locate``)."""
        o = self.owner if owner is None else owner
        if not o and owner is None and request_id in self._located:
            return self._located[request_id]
        return f"{self.prefix}:approval:request:{o + '/' if o else ''}{request_id}"

    def consumed_key(self, request: ApprovalRequest) -> str:
        """The key that records that ``request``'s approval was used."""
        return f"{self.prefix}:approval:consumed:{request.owner + '/' if request.owner else ''}{request.id}"

    def _key_owner(self, key: str) -> str:
        rest = key[len(f"{self.prefix}:approval:request:"):]
        return rest.rsplit("/", 1)[0] if "/" in rest else ""

    def _locate(self, client: Any, request_id: str) -> str:
        """A reader's key of request ``request_id``: kept under its agent's name (the
        first document that is that agent's), else the shared-mode key."""
        if self.owner or request_id in self._located or any(c in request_id for c in "*?[]\\/"):
            return self.request_key(request_id)
        marker = f"{self.prefix}:approval:request:"
        for raw_key in client.scan_iter(match=f"{marker}*/{request_id}", count=1000):
            key = str(raw_key.decode())
            raw = client.get(key)
            if raw is None:
                continue
            try:
                problem = ApprovalRequest.from_json(raw).owner_problem(self._key_owner(key))
            except ValueError:
                continue
            if problem is None:
                self._located[request_id] = key
                return key
        return self.request_key(request_id)

    def decision_key(self, request_id: str) -> str:
        """The key of the decision document ``request_id``."""
        return f"{self.prefix}:approval:decision:{request_id}"

    def __repr__(self) -> str:
        return self._described

    # ------------------------------------------------------------------ I/O
    def _failed(self, what: str, exc: BaseException) -> StoreUnavailable:
        return self._unavailable(f"{self._described} failed during {what}", exc, during=what,
                                 after="the approval is denied; ask again once the store answers")

    def _run(self, what: str, lua: str, keys: tuple[str, ...], args: tuple[str, ...],
             landed: Any = None) -> Any:
        """Run ``lua``, sent again while its reply is lost; ``landed(reply)`` maps a
        repeat's reply that shows the earlier attempt landed to that attempt's reply."""
        try:
            client = self._main_client()
            run = self._script(client, lua)

            def send(repeat: bool) -> Any:
                reply = run(keys=keys, args=args, client=client)
                return landed(reply) if repeat and landed is not None else reply

            return self._repeating(client, send)
        except ConfigurationError:
            raise
        except Exception as exc:
            raise self._failed(what, exc) from exc

    def _ttl_ms(self, r: ApprovalRequest) -> str:
        # the request's own lifetime plus the retention: independent of any clock
        return str(max(1000, int((max(0.0, r.deadline - r.requested_at) + self.retention) * 1000)))

    def _fetch(self, request_id: str) -> tuple[str | None, ApprovalRequest | None]:
        """The raw request document and the merged view (one round trip)."""
        key, text, raw_decision = self._fetch_raw(request_id)
        if text is None:
            return None, None
        return text, self._merge(text, raw_decision, self._key_owner(key))

    def _fetch_raw(self, request_id: str) -> tuple[str, str | None, bytes | None]:
        """The request's key, its raw document and its raw decision (one round trip)."""
        def read(client: Any) -> tuple[str, Any, Any]:
            key = self._locate(client, request_id)
            raw, raw_decision = client.mget([key, self.decision_key(request_id)])
            return key, raw, raw_decision

        try:
            key, raw, raw_decision = self._read(read)
        except Exception as exc:
            raise self._failed("read", exc) from exc
        return key, (None if raw is None else raw.decode()), raw_decision

    def _merge(self, raw: str, raw_decision: bytes | None, owner: str) -> ApprovalRequest:
        try:
            request = ApprovalRequest.from_json(raw)
            problem = request.owner_problem(owner)
            if problem is not None:
                raise ValueError(f"request {request.id[:12]} is not its agent's: {problem}")
            decision = None if raw_decision is None else Decision.from_doc(json.loads(raw_decision))
        except ValueError as exc:
            raise ApprovalStoreUnavailable(f"{self._described}: unreadable approval document ({exc})",
                                           store=self._described) from exc
        return request.with_decision(decision)

    def _read(self, op: Any) -> Any:
        """``op(client)``, a read: sent again while its reply is lost."""
        client = self._main_client()
        return self._repeating(client, lambda _repeat: op(client))

    def _cas(self, expected: str, new: ApprovalRequest) -> bool | str:
        if self.owner and new.owner != self.owner:
            raise ConfigurationError(f"{self._described} writes the requests of agent {self.owner!r}, not {new.owner!r}")
        keys = (self.request_key(new.id, new.owner), self.pending_key, self.unmirrored_key)
        doc = new.to_json()
        ttl_ms = self._ttl_ms(new)
        args = (expected, doc, ttl_ms, new.id, repr(new.deadline), self.channel,
                repr(new.requested_at), repr(new.requested_at + int(ttl_ms) / 1000))

        def landed(reply: Any) -> Any:
            # A repeat that finds our very document: the earlier attempt swapped it in.
            text = reply.decode() if isinstance(reply, bytes) else reply
            return 1 if text == doc else reply

        reply = self._run("write", self.LUA_CAS, keys, args, landed)
        if reply == 1:
            return True
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    # ------------------------------------------------------------------ the interface
    def create(self, request: ApprovalRequest) -> tuple[ApprovalRequest, bool]:
        """Store ``request`` unless one with its id exists (compare-and-set); return (the stored one, created)."""
        reply = self._cas("", request)
        if reply is True:
            return request.with_decision(None), True
        _, current = self._fetch(request.id)
        if current is None:  # created and gone again (retention): never expected
            raise ApprovalStoreUnavailable(f"{self._described}: approval {request.id} vanished", store=self._described)
        return current, False

    def get(self, request_id: str) -> ApprovalRequest | None:
        """The request with its decision, if any (one round trip)."""
        return self._fetch(request_id)[1]

    def update(self, request_id: str, change: Change) -> ApprovalRequest | None:
        """Apply ``change`` by compare-and-set, again on a concurrent write; the request afterwards."""
        for _ in range(100):
            raw, current = self._fetch(request_id)
            if raw is None or current is None:
                return None
            new = change(current)
            if new is None:
                return current
            if self._cas(raw, new) is True:
                return new.with_decision(current.decision)
            # someone else wrote in between: read again and apply the change to theirs
        raise ApprovalStoreUnavailable(f"{self._described}: approval {request_id} keeps changing under us",
                                       store=self._described)

    def decide(self, request_id: str, decision: Decision, *,
               replaces: Decision | None = None) -> ApprovalRequest | None:
        """Write ``decision`` unless one exists, or in place of exactly ``replaces`` (an
        approval the caller judged unproven; one script); the request as stored now."""
        key, text, raw_decision = self._fetch_raw(request_id)
        if text is None:
            return None
        current = self._merge(text, raw_decision, self._key_owner(key))
        expected = ""
        if current.decision is not None:
            if (replaces is None or raw_decision is None or not replaces.same_as(current.decision)
                    or replaces.signed != current.decision.signed):
                return current
            expected = raw_decision.decode()
        doc = json.dumps(decision.to_doc(request_id, current.namespace), separators=(",", ":"))
        keys = (self.decision_key(request_id), self.pending_key, self.rev_key)
        _, stored = self._run("decide", self.LUA_DECIDE, keys,
                                 (doc, request_id, self._ttl_ms(current), self.channel, expected))
        return self._merge(text, stored, current.owner)

    def mark_consumed(self, request: ApprovalRequest, by: str, now: float) -> str | None:
        """Record that ``request``'s approval was used (``by``, at ``now``), once: ``None``
        when this call recorded it, else who had (the record is never cleared)."""
        mine = json.dumps({"requestId": request.id, "by": by, "at": format_instant(now)}, separators=(",", ":"))
        key = self.consumed_key(request)

        def op(client: Any) -> Any:
            if client.set(key, mine, nx=True, px=int(self._ttl_ms(request))):
                return None
            prior = client.get(key)
            text = prior.decode() if isinstance(prior, bytes) else str(prior)
            return None if text == mine else text  # a repeat that finds its own record landed

        try:
            return self._read(op)  # type: ignore[no-any-return]
        except ConfigurationError:
            raise
        except Exception as exc:
            raise self._failed("record of the approval's use", exc) from exc

    def published_keys(self) -> dict[str, str]:
        """The trusted approver public keys the operator publishes (key id -> PEM)."""
        try:
            raw = self._read(lambda c: c.hgetall(self.keys_key))
        except Exception as exc:
            raise self._failed("read of the approver keys", exc) from exc
        return {k.decode(): v.decode() for k, v in raw.items()}

    def list(self, *, pending_only: bool = False) -> list[ApprovalRequest]:
        """Requests, newest first (``pending_only``: those without a decision)."""
        def read(client: Any) -> tuple[Any, Any, Any]:
            marker = f"{self.prefix}:approval:request:"
            mine = marker + (self.owner + "/" if self.owner else "")
            keys = sorted(k.decode() for k in client.scan_iter(match=mine + "*", count=500))
            if pending_only:
                waiting = {i.decode() for i in client.zrange(self.pending_key, 0, -1)}
                keys = [k for k in keys if k[len(marker):].rsplit("/", 1)[-1] in waiting]
            if not keys:
                return [], [], []
            ids = [k[len(marker):].rsplit("/", 1)[-1] for k in keys]
            return keys, client.mget(keys), client.mget([self.decision_key(i) for i in ids])

        try:
            keys, raws, decisions = self._read(read)
            if not raws:
                return []
        except ConfigurationError:
            raise
        except Exception as exc:
            raise self._failed("list", exc) from exc
        out = []
        for key, raw, raw_decision in zip(keys, raws, decisions, strict=True):
            if raw is None:
                continue
            with contextlib.suppress(ApprovalStoreUnavailable):
                request = self._merge(raw.decode(), raw_decision, self._key_owner(key))
                if not self.owner:
                    self._located.setdefault(request.id, key)
                out.append(request)
        if pending_only:
            out = [r for r in out if not r.decided]
        return sorted(out, key=lambda r: r.requested_at, reverse=True)
