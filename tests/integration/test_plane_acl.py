"""Least privilege on a real redis-server 7 with the ACL users of ``agent_saga.plane._acl``:
with an agent's credential every legitimate flow works (request an approval and wait,
expiry, debit within limits, its own heartbeat, obeying a halt) and every attack row is
refused with NOPERM (edit or delete a KillSwitch document, delete spend counters, EVAL an
arbitrary script, load one, heartbeat as another agent, publish its own approver key); an
``approved`` decision it writes itself is ignored (the agent trusts signed ones only)."""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalPolicy,
    BudgetLimit,
    KillSwitch,
    Lever,
    PreFlightGate,
    RedisApprovalStore,
    RedisLimitStore,
    RedisSwitchStore,
)
from agent_saga.controls.approvals import Decision, DecisionSigner, decide_request
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.errors import ConfigurationError
from agent_saga.gates import StepRequest
from agent_saga.heartbeat import AppliedState, HeartbeatWriter
from agent_saga.plane._acl import acl_rules, acl_setuser, agent_scripts, preload_scripts
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from fixtures.polling import until_async
from fixtures.redis_server import KEY_PREFIX, RedisServer, client_for, tagged
from fixtures.redis_server import PLANE_PREFIX as P

LIM = "{agent-saga}:limits"
PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")


class Users:
    """The ACL users, created on the shared server (on every node of a cluster, as its
    operator would) and deleted afterwards."""

    def __init__(self, server: RedisServer) -> None:
        self.server, self.names, self.password = server, [], secrets.token_hex(12)

    def make(self, role: str, **kw: str) -> str:
        name = f"{role}-{secrets.token_hex(3)}"
        kw.setdefault("prefix", KEY_PREFIX)
        reply = self.server.command(*acl_setuser(name, acl_rules(role, **kw), password=self.password))  # type: ignore[arg-type]
        assert reply.startswith(b"+OK"), reply
        self.names.append(name)
        return self.server.url.replace("://", f"://{name}:{self.password}@", 1)


@pytest.fixture
def users(fresh_redis: RedisServer) -> Iterator[Users]:
    u = Users(fresh_redis)
    yield u
    for n in u.names:
        fresh_redis.command("ACL", "DELUSER", n)


def noperm(fn) -> str:
    with pytest.raises(redis.exceptions.NoPermissionError) as e:
        fn()
    return str(e.value)


def test_an_agent_credential_cannot_touch_the_controls_it_is_governed_by(users: Users) -> None:
    agent_url = users.make("agent", agent="payments/payments-1")
    approver = users.make("approver")
    op = client_for(users.make("operator"))
    preload_scripts(op)
    agent = client_for(agent_url)
    # The operator's and the CLI's writes: a halt document, a limit window, an approver key.
    s = RedisSwitchStore(approver, grace=30, prefix=P)
    lever = Lever.new("Halt", "tool:wire.*", reason="incident", by="soc@corp", now=time.time())
    s.engage(lever)
    s.close()
    op.hset(f"{LIM}:totals", "daily:*", "900")
    op.hset(f"{P}:approval:keys", "k1", "-----BEGIN PUBLIC KEY-----")

    doc = f"{P}:killswitch:{lever.id}"
    assert agent.get(doc) is not None, "agents read the policy plane"
    # Rows: edit or delete a KillSwitch document; lift the halt by emptying the index.
    assert "no permissions to access" in noperm(lambda: agent.set(doc, "{}"))
    noperm(lambda: agent.delete(doc))
    noperm(lambda: agent.srem(f"{P}:killswitch:index", lever.id))
    # Rows: delete (or expire, or overwrite) the spend counters.
    noperm(lambda: agent.delete(f"{LIM}:totals"))
    noperm(lambda: agent.unlink(f"{LIM}:log"))
    noperm(lambda: agent.pexpire(f"{LIM}:totals", 1))
    noperm(lambda: agent.set(f"{LIM}:totals", "0"))
    # Rows: EVAL an arbitrary script; load a script or a function of its own.
    noperm(lambda: agent.eval("return redis.call('DEL', KEYS[1])", 1, doc))
    noperm(lambda: agent.script_load("return 1"))
    noperm(lambda: agent.execute_command("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('x', "
                                                             "function() return 1 end)"))
    noperm(lambda: agent.execute_command("FUNCTION", "FLUSH"))
    # Row: trust a key of its own, so it could sign its own approvals.
    noperm(lambda: agent.hset(f"{P}:approval:keys", "mine", "pem"))
    noperm(lambda: agent.delete(f"{P}:approval:keys"))
    # And the rest of the server: no FLUSHALL, CONFIG, ACL, KEYS.
    for cmd in (("FLUSHALL",), ("CONFIG", "SET", "appendonly", "no"), ("ACL", "LIST"), ("KEYS", "*")):
        noperm(lambda cmd=cmd: agent.execute_command(*cmd))
    assert agent.get(doc) is not None and op.hget(f"{LIM}:totals", "daily:*") == b"900"
    # The halt still holds for the agent (read with the agent's own credential).
    ks = KillSwitch(RedisSwitchStore(agent_url, grace=30, prefix=P))
    refused = asyncio.run(ks.check(StepRequest("s", "s/0", "wire.send", ActionSemantics.COMPENSABLE, {}, ())))
    assert refused is not None and "incident" in refused.reason
    ks.store.close()
    for c in (agent, op):
        c.close()


def test_an_agent_heartbeats_only_as_itself(users: Users) -> None:
    op = client_for(users.make("operator"))
    preload_scripts(op)
    url = users.make("agent", agent="payments/payments-1")
    state = AppliedState(rev="1", posture="ok", killswitches=(), policies=None, limits=())
    mine = HeartbeatWriter(url, namespace="payments", agent="payments", pod="payments-1", state=lambda: state,
                           interval=5, prefix=P)
    assert mine.beat() is True
    assert op.exists(f"{P}:agent:{mine.id}")
    # Row: heartbeat as another agent (to hide that it is lagging, or to fake an ack).
    other = HeartbeatWriter(url, namespace="payments", agent="payments", pod="payments-10", state=lambda: state,
                            interval=5, prefix=P)
    with pytest.raises(ConnectionError, match="can't access at least one of the keys"):
        other.beat()
    assert not op.exists(f"{P}:agent:{other.id}")
    mine.close()
    assert not op.exists(f"{P}:agent:{mine.id}"), "a clean exit removes its own heartbeat"
    op.close()


async def test_an_agent_debits_within_its_limits_with_its_own_credential(users: Users) -> None:
    op = client_for(users.make("operator"))
    preload_scripts(op)
    store = RedisLimitStore(users.make("agent"))
    gate = PreFlightGate(limits=[BudgetLimit("daily", arg="amount", max_total=1000, window=86_400)], store=store)
    req = StepRequest("s", "s/0", "stripe.charge", ActionSemantics.COMPENSABLE, {"amount": 600}, ())
    assert (await gate.decide(req)).allowed
    refused = await gate.decide(req)
    assert refused.verdict == "BLOCK" and "600 of 1,000 used" in refused.reason
    await store.aclose()
    op.close()


async def test_approvals_with_least_privilege_and_signatures(users: Users, tmp_path: Path) -> None:
    op = client_for(users.make("operator"))
    preload_scripts(op)
    priv, pub = generate_signing_key(tmp_path / "risk.pem")
    Path(pub).write_text("Approver: risk@corp\n" + Path(pub).read_text())  # the key approves as risk@corp
    signer = DecisionSigner.from_file(priv)
    agent_store = RedisApprovalStore(users.make("agent"), prefix=P)
    cli_store = RedisApprovalStore(users.make("approver"), prefix=P)
    wal = FileWAL(tmp_path / "w.wal")
    gw = ApprovalGateway(agent_store, None, wal, ApprovalPolicy(timeout=2), poll=0.05, trusted_keys=pub)

    def call(n: int) -> StepRequest:
        return StepRequest(f"s-{n}", f"s-{n}/0", "wire.send", ActionSemantics.IRREVERSIBLE, {"amount": n}, ())

    async def answer(n: int, how) -> None:
        await until_async("a pending request", lambda: agent_store.list(pending_only=True))
        how(agent_store.list(pending_only=True)[0])

    # Legitimate: the CLI (approver credential) approves, signed; the agent proceeds.
    out, _ = await asyncio.gather(gw.request_approval(call(1), PENDING), answer(1, lambda r: decide_request(
        cli_store, r.id, approved=True, approver="risk@corp", now=time.time(), signer=signer)))
    assert out.approved and out.approver == "risk@corp"
    # Row: the agent writes an approved decision for its own request: Redis takes it (agents
    # write decisions to expire or deny their own requests), the agent ignores it, expiry denies.
    def forge(r) -> None:
        agent_store.decide(r.id, Decision("Approved", "cfo@corp", time.time(), r.arguments_digest))
    out, _ = await asyncio.gather(gw.request_approval(call(2), PENDING), answer(2, forge))
    assert not out.approved and "ignored" in out.note and "not signed" in out.note
    # Legitimate: expiry, written with the agent's credential.
    out = await gw.request_approval(call(3), PENDING)
    assert not out.approved and "expiry denies" in out.note
    assert [r.state for r in agent_store.list() if r.saga_id == "s-3"] == ["Expired"]
    for s in (agent_store, cli_store):
        s.close()
    wal.close()
    op.close()


def test_without_the_preloaded_scripts_an_agent_fails_closed_and_the_operator_loads_them(
        users: Users, fresh_redis: RedisServer) -> None:
    admin = fresh_redis.client()
    admin.script_flush()
    store = RedisApprovalStore(users.make("agent"), prefix=P)
    from agent_saga.controls.approvals import ApprovalRequest, ApprovalStoreUnavailable

    now = time.time()
    r = ApprovalRequest("ab" * 16, "s", "s/0", "t", "irreversible", "", "sha256:x", "1", now, now + 60)
    with pytest.raises(ApprovalStoreUnavailable):
        store.create(r)  # EVALSHA misses; the agent may not load it (fail closed)
    op = client_for(users.make("operator"))
    assert preload_scripts(op) == len(agent_scripts())
    assert preload_scripts(op) == 0, "loaded once"
    assert store.create(r)[1] is True
    store.close()
    op.close()
    admin.close()


def test_bad_acl_arguments_name_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="not one of agent, approver, operator"):
        acl_rules("root")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="<namespace>/<pod>"):
        acl_rules("agent", agent="payments-*")
    with pytest.raises(ConfigurationError, match="wal_keys are for the agent role"):
        acl_rules("approver", wal_keys=("agent-saga:wal",))
    with pytest.raises(ConfigurationError, match="<namespace>/<pod>"):
        acl_rules("agent", agent="payments/p-1@x", wal_keys=("agent-saga:wal",))


def test_the_cli_prints_the_acl_user_redis_accepts(fresh_redis: RedisServer, capsys) -> None:
    import shlex

    from agent_saga.cli import main

    assert main(["acl", "agent", "--user", "payments-1", "--agent", "payments/payments-1"]) == 0
    argv = shlex.split(capsys.readouterr().out)
    assert argv[:3] == ["ACL", "SETUSER", "payments-1"] and not any(a.startswith(">") for a in argv)
    admin = fresh_redis.client()
    try:
        assert admin.execute_command(*argv) in (b"OK", True, "OK")
        (line,) = [u for u in admin.execute_command("ACL", "LIST") if u.startswith(b"user payments-1 ")]
        assert b"~agentsaga:v1:agent:payments/payments-1.*" in line and b"-@all" in line
    finally:
        admin.execute_command("ACL", "DELUSER", "payments-1")
        admin.close()


def test_an_agent_appends_to_its_wal_and_cannot_delete_a_record(users: Users) -> None:
    from agent_saga.wal.redis import RedisWAL

    op = client_for(users.make("operator"))
    preload_scripts(op)
    key = tagged(f"acl-wal-{secrets.token_hex(3)}")
    url = users.make("agent", agent="payments/payments-1", wal_keys=(key,))
    wal = RedisWAL(url, key=key, identity="payments/payments-1", writer="payments/payments-1")
    seq = wal.append("SAGA_STARTED", "s-1", None, {"tool": "wire.send"})
    wal.barrier_sync(seq)
    wal.close()
    agent = client_for(url)
    stream = f"{key}:w:payments/payments-1"
    (entry_id, _), = agent.xrange(stream)
    # Rows: rewrite the log (delete, trim or drop the stream).
    noperm(lambda: agent.xdel(stream, entry_id))
    noperm(lambda: agent.xtrim(stream, maxlen=0))
    noperm(lambda: agent.delete(stream))
    noperm(lambda: agent.set(f"{key}:gseq", "0"))
    assert len(agent.xrange(stream)) == 1
    agent.close()
    op.close()
