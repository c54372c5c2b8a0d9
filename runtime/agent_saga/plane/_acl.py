"""Least privilege on the policy plane: one Redis ACL user per component.

    acl_setuser("payments-1", acl_rules("agent", agent="payments/payments-1"), password=pw)

``acl_rules(role, ...)`` is the ACL (Redis 7 rules and selectors) each component needs and
no more; ``acl_setuser`` renders it as the ``ACL SETUSER`` command (the password comes
from a Secret, never from this module's output unless passed in). ``agent_scripts()`` is
every Lua script an agent runs: agents may call only scripts already in the server's
cache (``EVALSHA``), never load one, so the operator preloads them (``preload_scripts``)
at startup and after the server lost its data.

What each role may write (``P`` = the key prefix, ``{L}`` = the limit store's hash tag):

    agent      its own RedisWAL streams (append only, with ``wal_keys`` and ``agent``:
               K:w:<ns>/<pod> and K:w:<ns>/<pod>@*, never another identity's);
               its own approval requests P:v1:approval:request:<ns>/<pod>/* and the
               record of their use :consumed:<ns>/<pod>/* (without ``agent``: every
               agent's, and the shared-mode keys :request:<id>, :consumed:<id>);
               :pending, :decision:* (expiry and denial), :unmirrored (its new
               requests), P:v1:rev; its own heartbeat
               P:v1:agent:<ns>/<pod>.* (+ its index bucket and the previous release's
               index); P:v1:surface:<ns>/* (+ index);
               its own part of the limit windows {L}:limits:part:<ns>/<pod>:* (debits; with
               no --agent: every part and the shared {L}:limits:totals, :log), SADD on
               its bucket {L}:limits:parts:<b>, {L}:limits:buckets and the previous
               release's {L}:limits:parts, HSET on {L}:limits:defs; publish on P:v1:events and
               P:v1:agents:events. No DEL except its own heartbeat; no EVAL, SCRIPT,
               FUNCTION, CONFIG, FLUSH*, ACL, KEYS.
    approver   (the CLI) P:v1:approval:decision:*, :pending, P:v1:rev; the kill switch
               documents P:v1:killswitch:*, P:v1:synced; publish on P:v1:events.
    operator   everything under P:v1:* and {L}:limits:*, SCRIPT LOAD (not FLUSH, CONFIG,
               ACL, FUNCTION, EVAL of arbitrary scripts: it loads the runtime's own);
               with ``wal_keys``, reads each RedisWAL and writes its writer quarantine
               K:quarantine (``agent-saga wal quarantine``), never a stream.

Every role reads the whole policy plane, and the slot map of a Redis Cluster (so a
cluster client can connect with it; create each user on every node of a cluster). No role
reaches another client's connection (``CONNECTION``: no CLIENT KILL, PAUSE, LIST, ...).
Redis checks the caller's ACL for every command
a script runs, so these rules hold inside scripts too: the scripts change nothing an agent
could not do with single commands on the keys above (docs/threat-model.md says what that
leaves a compromised agent).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Literal

from ..errors import ConfigurationError

__all__ = ["CONNECTION", "ROLES", "acl_rules", "acl_setuser", "agent_scripts", "preload_scripts", "wal_append_rules",
           "wal_quarantine_rules"]

Role = Literal["agent", "approver", "operator"]
ROLES: tuple[Role, ...] = ("agent", "approver", "operator")

#: What a connection needs and nothing that reaches another connection: the handshake
#: (HELLO, AUTH, SELECT, its own name and id), PING, COMMAND and ASKING / READONLY for a
#: Cluster client, RESET, QUIT, WAIT (a write's replica acknowledgements). Not ``+@connection``:
#: it holds CLIENT KILL, PAUSE, UNPAUSE, LIST, NO-EVICT, UNBLOCK and TRACKING, with which one
#: credential could cut, freeze or spy on every other client, the admin's included. CLIENT
#: SETINFO (Redis 7.2+; redis-py sends it on connect and ignores a refusal) is left out: Redis
#: 7.0 does not know it and would refuse the whole user.
CONNECTION = ("+hello", "+auth", "+select", "+ping", "+echo", "+quit", "+reset", "+command", "+asking",
              "+readonly", "+readwrite", "+wait", "+client|id", "+client|getname", "+client|setname",
              "+client|info")

_READS = (*CONNECTION, "+get", "+mget", "+exists", "+type", "+ttl", "+pttl", "+scan", "+hget", "+hgetall",
          "+hmget", "+hkeys", "+hexists", "+hlen", "+zrange", "+zrangebyscore", "+zscore", "+zcard", "+smembers",
          "+sismember", "+scard", "+strlen", "+xrange", "+xrevrange", "+xlen", "+time", "+subscribe", "+unsubscribe", "+psubscribe",
          "+punsubscribe", "+evalsha", "+evalsha_ro", "+script|exists",
          # A Redis Cluster client reads the slot map (CLUSTER SLOTS or SHARDS) when it connects
          # and after a MOVED (COMMAND and ASKING are in CONNECTION). On one server: an error.
          "+cluster|slots", "+cluster|shards")


def acl_rules(
    role: Role,
    *,
    prefix: str = "agentsaga",
    limit_namespace: str = "agent-saga",
    agent: str | None = None,
    wal_keys: Sequence[str] = (),
) -> list[str]:
    """The ACL rules of ``role`` (``agent``, ``approver``, ``operator``) for the policy
    plane under ``prefix`` and the limit store ``limit_namespace``. ``agent`` (an agent
    role only): ``<namespace>/<pod>``, the only heartbeat, surface and approval requests
    it may write (``RedisApprovalStore(owner=...)`` names the same pod); ``None`` lets the
    credential write any agent's (one credential shared by a fleet: weaker, as any agent
    could then rewrite the request a human reads for another agent's call).
    ``wal_keys``: the ``key`` of each RedisWAL the agent appends to (``agent-saga:wal``):
    it may append (``XADD``) to the writer streams of its own identity ``agent`` only
    (``None``: of every agent identity, never a service writer's such as recovery's),
    never delete or trim a record. For the operator role, ``wal_keys``
    lets it quarantine a writer of those logs."""
    if role not in ROLES:
        raise ConfigurationError(f"ACL role {role!r} is not one of {', '.join(ROLES)}")
    if not prefix or any(c in prefix for c in " *?[]"):
        raise ConfigurationError(f"key prefix {prefix!r} must be non-empty without spaces or glob characters")
    if agent is not None and (role != "agent" or agent.count("/") != 1 or any(c in agent for c in " *?[]{}:")):
        raise ConfigurationError(f"agent {agent!r}: give <namespace>/<pod> (no glob characters), agents only")
    p, lim = f"{prefix}:v1", f"{{{limit_namespace}}}:limits"
    # EVALSHA needs read-write access to the keys it declares, so it has a selector of its
    # own: it runs only scripts already loaded (no EVAL, no SCRIPT LOAD), and every command
    # such a script runs is checked again against the rules below (reads everywhere,
    # writes only where a selector allows them).
    if role == "approver" and wal_keys:
        raise ConfigurationError("wal_keys are for the agent role (RedisWAL appends) and the operator (quarantine)")
    if any(not k or any(c in k for c in " *?[]") for k in wal_keys):
        raise ConfigurationError(f"wal_keys {list(wal_keys)!r}: give each RedisWAL key, without glob characters")
    base = ["reset", "on", "resetkeys", "resetchannels", "-@all", *_READS, f"%R~{p}:*", f"%R~{lim}:*",
            f"(~{p}:* ~{lim}:* +evalsha)"]
    if role == "operator":
        return ["reset", "on", "resetkeys", "resetchannels", "-@all", *_READS, "+@read", "+@write", "+@pubsub",
                "+@transaction", "+script|load", "+publish", "-@dangerous", "+info", f"~{p}:*", f"~{lim}:*",
                f"&{p}:*", *(rule for k in wal_keys for rule in wal_quarantine_rules(k))]
    if role == "approver":
        return [*base, f"&{p}:events", "+publish",
                f"({_keys(f'{p}:approval:decision:*', f'{p}:approval:pending', f'{p}:rev')} +set +incr +zrem)",
                f"({_keys(f'{p}:killswitch:*', f'{p}:synced', f'{p}:rev')} +set +del +incr +sadd +srem +hset)"]
    beat, surface = ("*", "*") if agent is None else (f"{agent}.*", agent.split("/")[0] + "/*")
    owned = "*" if agent is None else f"{agent}/*"
    limit_parts = (f"{lim}:totals", f"{lim}:log", f"{lim}:part:*") if agent is None else (f"{lim}:part:{agent}:*",)
    from ..controls.limits._redis import parts_bucket
    from ..heartbeat._model import heartbeat_index_key

    # the index bucket and the parts bucket its identity hashes to (every one's, shared)
    index = f"{p}:agent:index:*" if agent is None else heartbeat_index_key(p, agent)
    parts = f"{lim}:parts:*" if agent is None else f"{lim}:parts:{parts_bucket(agent)}"
    return [
        *base, f"&{p}:events", f"&{p}:agents:events", "+publish",
        f"({_keys(f'{p}:approval:request:{owned}', f'{p}:approval:consumed:{owned}')} +set)",
        f"({_keys(f'{p}:approval:pending', f'{p}:approval:decision:*', f'{p}:rev')} +set +zadd +zrem +incr)",
        f"({_keys(f'{p}:approval:unmirrored')} +zadd +zremrangebyscore)",
        f"({_keys(f'{p}:agent:{beat}', index, f'{p}:agent:index')} +set +del +zadd +zrem)",
        f"({_keys(f'{p}:surface:{surface}', f'{p}:surface:index')} +hset +sadd)",
        # Its own part of the limit windows (RedisLimitStore(part=...)): the debit script
        # reads every part and writes this one, so another pod's spend is out of its reach.
        f"({_keys(*limit_parts)} +hset +hdel +zadd +zrem +zremrangebyscore)",
        f"({_keys(f'{lim}:parts', parts, f'{lim}:buckets')} +sadd)", f"({_keys(f'{lim}:defs')} +hset)",
        *(rule for k in wal_keys for rule in wal_append_rules(k, agent)),
    ]


def wal_append_rules(key: str, agent: str | None) -> list[str]:
    """The agent's rules for one RedisWAL ``key``: read it, run the append script on it,
    append (``XADD``) to its own identity's writer streams only (``<key>:w:<agent>`` and
    ``<key>:w:<agent>@*``: a writer id holds one ``@``, a pod name none), never delete or
    trim. ``agent`` is ``<namespace>/<pod>``; ``None`` (one credential shared by a fleet):
    every agent identity's streams (``<key>:w:*/*``), still never a service writer's."""
    if agent is None:
        streams = [f"{key}:w:*/*"]
    else:
        from ..wal.writers import check_identity

        check_identity(agent)
        streams = [f"{key}:w:{agent}", f"{key}:w:{agent}@*"]
    return [f"%R~{key}:*", f"(~{key}:* +evalsha)",
            f"({_keys(*streams, f'{key}:gseq', f'{key}:writers')} +xadd +incrby +sadd)", "+wait"]


def wal_quarantine_rules(key: str) -> list[str]:
    """The operator's rules for one RedisWAL ``key``: read it, write its writer quarantine
    (``<key>:quarantine`` and its journal), nothing else of it."""
    return [f"%R~{key}:*", f"~{key}:quarantine", f"~{key}:quarantine:journal"]


def _keys(*patterns: str) -> str:
    return " ".join(f"~{k}" for k in patterns)


def acl_setuser(user: str, rules: Sequence[str], *, password: str | None = None) -> list[str]:
    """``ACL SETUSER`` as a command (a list of arguments): ``user`` with ``rules`` and,
    if given, ``password`` (else the user has none until you add ``>PASSWORD``)."""
    if not user or any(c.isspace() for c in user):
        raise ConfigurationError(f"ACL user name {user!r} must be non-empty without spaces")
    return ["ACL", "SETUSER", user, *rules, *((f">{password}",) if password else ())]


def agent_scripts() -> list[str]:
    """Every Lua script an agent process runs (approvals, limits, heartbeat, the policy
    plane's reader, the kill switch's writes, the policy surface and RedisWAL appends)."""
    from ..controls._policyplane import PolicyPlaneReader
    from ..controls.approvals import RedisApprovalStore
    from ..controls.killswitch import RedisSwitchStore
    from ..controls.limits import RedisLimitStore
    from ..controls.policy._surface import LUA_RECORD
    from ..heartbeat._writer import HeartbeatWriter
    from ..wal.redis import RedisWAL

    return [RedisApprovalStore.LUA_CAS, RedisApprovalStore.LUA_DECIDE, RedisLimitStore.LUA_DEBIT,
            RedisLimitStore.LUA_REFUND, RedisLimitStore.LUA_USAGE, HeartbeatWriter.LUA_BEAT,
            HeartbeatWriter.LUA_GONE, PolicyPlaneReader.LUA_READ, RedisSwitchStore.LUA_PUT,
            RedisSwitchStore.LUA_DELETE, LUA_RECORD, RedisWAL.APPEND]


def preload_scripts(client: Any, scripts: Iterable[str] | None = None) -> int:
    """``SCRIPT LOAD`` every script not yet in the server's cache (``client``: a redis-py
    client with the operator's credential); return how many were loaded."""
    import hashlib

    texts = list(agent_scripts() if scripts is None else scripts)
    shas = [hashlib.sha1(t.encode()).hexdigest() for t in texts]  # noqa: S324 - Redis names scripts by SHA-1
    have = client.script_exists(*shas)
    missing = [t for t, ok in zip(texts, have, strict=True) if not ok]
    for t in missing:
        client.script_load(t)
    return len(missing)
