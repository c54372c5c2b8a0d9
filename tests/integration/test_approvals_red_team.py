"""Attacks on human approvals, on a real redis-server with the ACL users exactly as
``agent-saga acl ...`` prints them, answered with the real CLI (a subprocess):

- another pod's credential rewrites what the human reads (tool, display, reason) or
  plants a request under its own name: NOPERM, or ignored; with one credential shared
  by the fleet (the weaker mode) what is shown is rendered from the canonical arguments,
  a request whose arguments do not hash to its digest is NOT APPROVABLE, and a
  consistent rewrite is refused by the agent;
- a consumed approval replayed by resetting ``consumedAt`` (a reused saga id);
- terminal escapes, bidi and zero-width characters in a model-chosen argument;
- arguments hidden behind padding arguments (a view that leaves fields out).
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.controls import ApprovalGateway, ApprovalPolicy, RedisApprovalStore
from agent_saga.controls.approvals import ApprovalRequest, action_digest
from agent_saga.controls.approvals._signing import approver_header
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.gates import StepRequest
from agent_saga.plane._acl import preload_scripts
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from agent_saga_operator.bridge import MORE_KEY, approval_object, approval_problem
from fixtures.cli import cli_module
from fixtures.polling import until_async
from fixtures.redis_server import KEY_PREFIX, PLANE_ENV, RedisServer, client_for
from fixtures.redis_server import PLANE_PREFIX as P

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")
WIRE = {"amount": 80000, "to": "acct_EVIL"}
POD_A, POD_B = "payments/payments-1", "payments/payments-2"


def run_cli(url: str | None, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    env.update({"PYTHONPATH": str(ROOT / "runtime"), **PLANE_ENV})
    if url is not None:
        env["AGENT_SAGA_REDIS_URL"] = url
    return cli_module(*args, env=env, timeout=120)


class Users:
    """ACL users made from what ``agent-saga acl ROLE ...`` prints (plus a password),
    deleted afterwards."""

    def __init__(self, server: RedisServer) -> None:
        self.server, self.names, self.password = server, [], secrets.token_hex(12)

    def make(self, role: str, *flags: str) -> str:
        name = f"{role}-{secrets.token_hex(3)}"
        out = run_cli(None, "acl", role, "--user", name, "--key-prefix", KEY_PREFIX, *flags)
        assert out.returncode == 0, out.stderr
        argv = shlex.split(out.stdout)
        assert argv[:3] == ["ACL", "SETUSER", name]
        reply = self.server.command(*argv, f">{self.password}")
        assert reply.startswith(b"+OK"), reply
        self.names.append(name)
        return self.server.url.replace("://", f"://{name}:{self.password}@", 1)


@pytest.fixture
def users(fresh_redis: RedisServer) -> Iterator[Users]:
    u = Users(fresh_redis)
    op = client_for(u.make("operator"))
    preload_scripts(op)  # agents run the runtime's scripts by SHA only
    op.close()
    yield u
    for n in u.names:
        fresh_redis.command("ACL", "DELUSER", n)


@pytest.fixture
def keys(tmp_path: Path) -> tuple[str, str]:
    priv, pub = generate_signing_key(tmp_path / "risk.pem")
    Path(pub).write_text(approver_header(["risk@corp"]) + Path(pub).read_text())  # the key approves as risk@corp
    return str(priv), str(pub)


def gateway(store: RedisApprovalStore, tmp_path: Path, pub: str, timeout: float = 120) -> ApprovalGateway:
    wal = FileWAL(tmp_path / f"{secrets.token_hex(3)}.wal")
    return ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=timeout), poll=0.05, trusted_keys=pub,
                           namespace="payments")


def call(saga: str, args: dict[str, Any] = WIRE) -> StepRequest:
    return StepRequest(saga, f"{saga}/0", "wire.send", ActionSemantics.IRREVERSIBLE, args, ())


async def pending(store: RedisApprovalStore, saga: str) -> ApprovalRequest:
    def find() -> ApprovalRequest | None:
        return next((r for r in store.list(pending_only=True) if r.saga_id == saga), None)

    found = await until_async(f"the request of {saga}", find)
    assert found is not None
    return found


async def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(run_cli, url, *args)


def noperm(fn: Any) -> None:
    with pytest.raises(redis.exceptions.NoPermissionError):
        fn()


async def test_another_pods_credential_cannot_rewrite_or_impersonate_a_request(
        users: Users, keys: tuple[str, str], tmp_path: Path) -> None:
    priv, pub = keys
    url_a, url_b = users.make("agent", "--agent", POD_A), users.make("agent", "--agent", POD_B)
    approver = users.make("approver")
    store_a = RedisApprovalStore(url_a, prefix=P, owner=POD_A)
    gw = gateway(store_a, tmp_path, pub)
    task = asyncio.create_task(gw.request_approval(call("s-own"), PENDING))
    req = await pending(store_a, "s-own")
    key = store_a.request_key(req.id)
    assert key == f"{P}:approval:request:{POD_A}/{req.id}"
    b = client_for(url_b)
    # Row: rewrite what the human reads, from another pod's credential.
    forged = {**json.loads(b.get(key)), "tool": "crm.add_note", "display": {"amount": "80", "to": "acct_9"},
              "reason": "a routine note"}
    noperm(lambda: b.set(key, json.dumps(forged)))
    noperm(lambda: b.set(f"{P}:approval:request:{req.id}", json.dumps(forged)))  # the shared-mode key
    # Row: plant a request with the victim's id under its own name (the only place it may write).
    store_b = RedisApprovalStore(url_b, prefix=P, owner=POD_B)
    fake_args = {"amount": 80, "to": "acct_9"}
    assert store_b.create(replace(req, owner=POD_B, tool="crm.add_note", arguments=fake_args, display=fake_args,
                                  arguments_digest=action_digest("crm.add_note", fake_args, "1")))[1]
    assert b.exists(f"{P}:approval:request:{POD_B}/{req.id}")
    # The human is shown the victim's request, rendered from its own arguments.
    for args in (("approvals", "list"), ("approvals", "show", req.id[:8])):
        out = await cli(approver, *args)
        assert out.returncode == 0, out.stderr
        assert "wire.send" in out.stdout and "amount: 80000" in out.stdout and "to: acct_EVIL" in out.stdout
        assert "crm.add_note" not in out.stdout and "acct_9" not in out.stdout, out.stdout
    out = await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key", priv)
    assert out.returncode == 0, out.stderr
    assert "to: acct_EVIL" in out.stdout, "the approval prints the action it approved"
    outcome = await task
    assert outcome.approved and outcome.approver == "risk@corp"
    for s in (store_a, store_b):
        s.close()
    b.close()


async def test_with_one_shared_credential_what_is_shown_is_rendered_and_checked(
        users: Users, keys: tuple[str, str], tmp_path: Path) -> None:
    """The weaker mode (``acl agent`` without ``--agent``): any agent can write any
    request, and still cannot make a human approve, or the agent run, another action."""
    priv, pub = keys
    shared = users.make("agent")
    approver = users.make("approver")
    store = RedisApprovalStore(shared, prefix=P)
    attacker = client_for(shared)

    def rewrite(req: ApprovalRequest, **fields: Any) -> None:
        key = store.request_key(req.id)
        attacker.set(key, json.dumps({**json.loads(attacker.get(key)), **fields}), keepttl=True)

    # 1. The unsigned fields a human used to read: display, reason. Not shown any more.
    gw = gateway(store, tmp_path, pub)
    task = asyncio.create_task(gw.request_approval(call("s-display"), PENDING))
    req = await pending(store, "s-display")
    rewrite(req, display={"amount": "80", "to": "acct_9"}, reason="a routine note")
    out = await cli(approver, "approvals", "list")
    assert out.returncode == 0, out.stderr
    assert "amount: 80000" in out.stdout and "to: acct_EVIL" in out.stdout and "acct_9" not in out.stdout, out.stdout
    assert (await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key",
                      priv)).returncode == 0
    assert (await task).approved, "the human saw the real action and approved it"

    # 2. The tool and the arguments, without a matching digest: not approvable.
    gw = gateway(store, tmp_path, pub)
    task = asyncio.create_task(gw.request_approval(call("s-tool"), PENDING))
    req = await pending(store, "s-tool")
    rewrite(req, tool="crm.add_note", arguments={"amount": 80, "to": "acct_9"})
    out = await cli(approver, "approvals", "show", req.id[:8])
    assert out.returncode == 0 and "NOT APPROVABLE" in out.stdout and "do not hash to its argumentsDigest" \
        in out.stdout, out.stdout
    out = await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key", priv)
    assert out.returncode == 1 and "cannot be approved" in out.stderr, out.stderr
    outcome = await task
    assert not outcome.approved and "rewritten" in outcome.note

    # 3. A consistent rewrite (tool, arguments and digest): the human approves the note
    #    they see; the agent refuses it for its wire (its own call, not the store's).
    gw = gateway(store, tmp_path, pub)
    task = asyncio.create_task(gw.request_approval(call("s-all"), PENDING))
    req = await pending(store, "s-all")
    fake_args = {"amount": 80, "to": "acct_9"}
    rewrite(req, tool="crm.add_note", arguments=fake_args,
            argumentsDigest=action_digest("crm.add_note", fake_args, req.policy_version))
    outcome = await task
    assert not outcome.approved and "rewritten" in outcome.note
    out = await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key", priv)
    assert out.returncode == 0 and "crm.add_note" in out.stdout, out.stderr
    gw = gateway(store, tmp_path, pub)  # the agent asks again (a retried step): the note's approval
    again = await gw.request_approval(call("s-all"), PENDING)
    assert not again.approved and "other arguments" in again.note
    store.close()
    attacker.close()


async def test_a_consumed_approval_is_not_replayed_by_resetting_its_request(
        users: Users, keys: tuple[str, str], tmp_path: Path, fresh_redis: RedisServer) -> None:
    priv, pub = keys
    url_a, url_b = users.make("agent", "--agent", POD_A), users.make("agent", "--agent", POD_B)
    approver = users.make("approver")
    store = RedisApprovalStore(url_a, prefix=P, owner=POD_A)
    gw = gateway(store, tmp_path, pub)
    task = asyncio.create_task(gw.request_approval(call("s-once"), PENDING))
    req = await pending(store, "s-once")
    out = await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key", priv)
    assert out.returncode == 0, out.stderr
    assert (await task).approved, "the wire is sent once"
    used = store.consumed_key(req)
    assert used == f"{P}:approval:consumed:{POD_A}/{req.id}"
    b = client_for(url_b)
    noperm(lambda: b.set(used, "x", px=1))  # another pod cannot clear (or expire) the record of its use
    # Row: the saga id is reused and the request document's consumedAt is set back to null
    # (here with the server's own admin connection: the document is all it can reset).
    admin = fresh_redis.client()
    key = store.request_key(req.id)
    doc = json.loads(admin.get(key))
    assert doc["consumedAt"] is not None
    admin.set(key, json.dumps({**doc, "consumedAt": None, "consumedBy": None}), keepttl=True)
    again = await gateway(store, tmp_path, pub).request_approval(call("s-once"), PENDING)
    assert not again.approved and "already used" in again.note, again.note
    store.close()
    b.close()
    admin.close()


async def test_escapes_in_an_argument_do_not_redraw_the_approvers_screen(
        users: Users, keys: tuple[str, str], tmp_path: Path) -> None:
    """No credential needed: the model chose the argument."""
    priv, pub = keys
    url = users.make("agent", "--agent", POD_A)
    approver = users.make("approver")
    store = RedisApprovalStore(url, prefix=P, owner=POD_A)
    memo = "\x1b[2K\x1b[1A\r      amount: 80\n      to: acct_9\x1b[8m"
    args = {**WIRE, "memo": memo, "ref": "INV-\u202e9pdf.exe\u202c", "note": "ok\u200b\u2066x\u2069"}
    task = asyncio.create_task(gateway(store, tmp_path, pub).request_approval(call("s-esc", args), PENDING))
    req = await pending(store, "s-esc")
    for argv in (("approvals", "list"), ("approvals", "show", req.id[:8], "--show-all")):
        out = await cli(approver, *argv)
        assert out.returncode == 0, out.stderr
        text = out.stdout
        assert not any(c in text for c in "\x1b\r\u202e\u202c\u200b\u2066\u2069"), repr(text)
        assert all(c.isprintable() or c == "\n" for c in text), repr(text)
        assert r"memo: \x1b[2K\x1b[1A\x0d      amount: 80\x0a      to: acct_9\x1b[8m" in text, text
        assert "ref: INV-<U+202E>9pdf.exe<U+202C>" in text and "note: ok<U+200B><U+2066>x<U+2069>" in text
        assert "to: acct_EVIL" in text
    # What the operator writes into the Approval (kubectl get -o yaml shows it).
    obj = approval_object(json.loads(client_for(url).get(store.request_key(req.id))))
    shown = json.dumps(obj["spec"], ensure_ascii=False)
    assert not any(c in shown for c in "\x1b\r\u202e\u200b"), shown
    assert obj["spec"]["display"]["to"] == "acct_EVIL" and obj["spec"]["display"]["memo"].startswith(r"\x1b[2K")
    out = await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key", priv)
    assert out.returncode == 0, out.stderr
    assert (await task).approved
    store.close()


async def test_a_human_cannot_approve_fields_the_view_left_out(
        users: Users, keys: tuple[str, str], tmp_path: Path) -> None:
    priv, pub = keys
    url = users.make("agent", "--agent", POD_A)
    approver = users.make("approver")
    store = RedisApprovalStore(url, prefix=P, owner=POD_A)
    padding = {f"a{i:02d}": "pad" for i in range(32)}  # sorted before amount and to
    task = asyncio.create_task(gateway(store, tmp_path, pub).request_approval(call("s-pad", {**padding, **WIRE}),
                                                                             PENDING))
    req = await pending(store, "s-pad")
    out = await cli(approver, "approvals", "list")
    assert out.returncode == 0, out.stderr
    assert "acct_EVIL" not in out.stdout and "[2 more fields: this is not the whole action" in out.stdout, out.stdout
    # Row: approve what the list showed.
    out = await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key", priv)
    assert out.returncode == 1 and "--show-all" in out.stderr and "34 fields" in out.stderr, out.stderr
    out = await cli(approver, "approvals", "show", req.id[:8], "--show-all")
    assert "amount: 80000" in out.stdout and "to: acct_EVIL" in out.stdout and "more field" not in out.stdout
    # The operator's Approval says so too, and is not approvable with kubectl.
    doc = json.loads(client_for(url).get(store.request_key(req.id)))
    assert "--show-all" in approval_object(doc)["spec"]["display"][MORE_KEY]
    assert approval_problem(doc) is not None and approval_problem(doc)[0] == "NotAllShown"  # type: ignore[index]
    out = await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key", priv,
                    "--show-all")
    assert out.returncode == 0 and "to: acct_EVIL" in out.stdout, out.stderr
    assert (await task).approved
    # One value longer than a view shows: cut, and says where.
    task = asyncio.create_task(gateway(store, tmp_path, pub).request_approval(
        call("s-long", {"amount": 80000, "to": "acct_9" + " " * 2000 + "acct_EVIL"}), PENDING))
    req = await pending(store, "s-long")
    out = await cli(approver, "approvals", "show", req.id[:8])
    assert "[value cut at 1024 of 2015 characters]" in out.stdout and "acct_EVIL" not in out.stdout, out.stdout
    out = await cli(approver, "approvals", "approve", req.id[:8], "--approver", "risk@corp", "--signing-key", priv)
    assert out.returncode == 1 and "--show-all" in out.stderr
    out = await cli(approver, "approvals", "deny", req.id[:8], "--approver", "risk@corp")
    assert out.returncode == 0, "a denial needs no complete view"
    assert not (await task).approved
    store.close()
