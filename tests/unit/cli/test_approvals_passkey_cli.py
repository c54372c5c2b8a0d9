"""`agent-saga approvals keys | challenge | sign` against a real agent waiting on an
IRREVERSIBLE step (FileApprovalStore, FileWAL, real Ed25519 keys): a key enrolled with the
CLI signs the printed challenge (as a hardware key's tool would, and with --key), the
agent proceeds; a key revoked with the CLI is refused by the agent; the CLI's own
refusals name the fix."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.cli import main
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalPolicy,
    FileApprovalStore,
    PreFlightGate,
)
from agent_saga.errors import GateBlocked
from agent_saga.scope import saga_scope
from agent_saga.wal.file import FileWAL, iter_file_records
from cryptography.hazmat.primitives import serialization


def decided(wal: FileWAL, saga: str) -> dict:
    wal.barrier_sync()
    (d,) = [r.payload for _, r in iter_file_records(wal.path)
            if not isinstance(r, Exception) and r.saga == saga and r.type == "APPROVAL_DECIDED"]
    return d


async def run_agent(wal: FileWAL, store: FileApprovalStore, ring: Path, saga_id: str) -> list[str]:
    gw = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=120), poll=0.01, passkeys=str(ring))
    ran: list[str] = []
    async with saga_scope(wal, PreFlightGate(approval_provider=gw), saga_id=saga_id) as saga:
        await saga.execute("wire.send", "IRREVERSIBLE", lambda: ran.append("sent"),
                           policy_args={"amount": 80_000, "to": "acct_9"})
    return ran


async def waiting(store: FileApprovalStore, saga_id: str, task: asyncio.Task) -> str:
    while not task.done():
        mine = [r for r in store.list() if r.saga_id == saga_id]
        if mine:
            return mine[0].id
        await asyncio.sleep(0.01)
    raise AssertionError(f"the agent ended before asking: {task.result()!r}")


async def cli(*argv: str) -> int:
    return await asyncio.to_thread(main, list(argv))


async def test_enrol_challenge_sign_then_revoke(tmp_path: Path, capsys):
    priv, pub = generate_signing_key(tmp_path / "risk.pem")
    ring, approvals = tmp_path / "keyring.json", tmp_path / "approvals"
    store, wal = FileApprovalStore(approvals), FileWAL(tmp_path / "agent.wal")
    try:
        assert await cli("approvals", "keys", "enrol", "--keyring", str(ring), "--approver", "risk@corp",
                         "--public-key", pub, "--by", "soc@corp", "--label", "token", "--json") == 0
        kid = json.loads(capsys.readouterr().out)["keyId"]
        assert await cli("approvals", "keys", "enrol", "--keyring", str(ring), "--approver", "risk@corp",
                         "--public-key", pub, "--by", "soc@corp") == 2
        assert "already enrolled for risk@corp" in capsys.readouterr().err

        # a hardware key's path: the digest bytes out, a raw signature in
        agent = asyncio.create_task(run_agent(wal, store, ring, "s-hw"))
        rid = await waiting(store, "s-hw", agent)
        assert await cli("approvals", "list", "--store", str(approvals)) == 0
        assert "passkey required (approvals sign)" in capsys.readouterr().out
        assert await cli("approvals", "challenge", rid[:8], "--store", str(approvals),
                         "--out", str(tmp_path / "c.bin")) == 0
        printed = capsys.readouterr().out
        digest = (tmp_path / "c.bin").read_bytes()
        assert len(digest) == 32 and digest.hex() in printed and "wire.send" in printed
        key = serialization.load_pem_private_key(Path(priv).read_bytes(), password=None)
        (tmp_path / "sig.bin").write_bytes(key.sign(digest))
        assert await cli("approvals", "sign", rid[:8], "--store", str(approvals), "--key-id", kid,
                         "--signature", str(tmp_path / "sig.bin")) == 2
        assert "--approver NAME is required" in capsys.readouterr().err
        assert await cli("approvals", "sign", rid[:8], "--approver", "risk@corp", "--store", str(approvals),
                         "--key-id", kid, "--signature", str(tmp_path / "sig.bin"), "--break-glass") == 1
        assert "break-glass approval needs --note" in capsys.readouterr().err
        assert await cli("approvals", "sign", rid[:8], "--approver", "risk@corp", "--store", str(approvals),
                         "--key-id", kid, "--signature", str(tmp_path / "sig.bin"), "--break-glass",
                         "--note", "oncall asleep") == 0
        assert f"BREAK-GLASS: flagged for review) with passkey {kid}" in capsys.readouterr().out
        assert await agent == ["sent"]
        wal.barrier_sync()
        (glass,) = [r.payload for _, r in iter_file_records(wal.path)
                    if not isinstance(r, Exception) and r.saga == "s-hw" and r.type == "APPROVAL_BREAK_GLASS"]
        assert glass["passkey"]["keyId"] == kid and glass["requires_review"] is True

        # revoked with the CLI: the agent refuses the next signature by that key, naming why
        assert await cli("approvals", "keys", "revoke", kid[:6], "--keyring", str(ring), "--by", "soc@corp") == 0
        assert await cli("approvals", "keys", "list", "--keyring", str(ring)) == 0
        assert "REVOKED" in capsys.readouterr().out
        agent = asyncio.create_task(run_agent(wal, store, ring, "s-revoked"))
        rid = await waiting(store, "s-revoked", agent)
        assert await cli("approvals", "sign", rid, "--approver", "risk@corp", "--store", str(approvals),
                         "--key", priv) == 0
        with pytest.raises(GateBlocked) as info:
            await agent
        assert "passkey refused" in info.value.reason and "was revoked at" in info.value.reason
        assert decided(wal, "s-revoked")["passkey"] == {"refused": "revoked", "keyId": kid}
        capsys.readouterr()
        assert await cli("approvals", "sign", rid, "--approver", "risk@corp", "--store", str(approvals),
                         "--key", priv) == 1
        assert "a decision cannot be changed" in capsys.readouterr().err  # written once
    finally:
        store.close()
        wal.close()


async def test_sign_refuses_a_request_without_a_challenge_and_bad_inputs(tmp_path: Path, capsys):
    approvals = tmp_path / "approvals"
    store, wal = FileApprovalStore(approvals), FileWAL(tmp_path / "agent.wal")
    priv, _ = generate_signing_key(tmp_path / "k.pem")
    try:
        gw = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=120), poll=0.01)

        async def plain() -> None:
            async with saga_scope(wal, PreFlightGate(approval_provider=gw), saga_id="s-plain") as saga:
                await saga.execute("wire.send", "IRREVERSIBLE", lambda: None, policy_args={"amount": 1})

        agent = asyncio.create_task(plain())
        rid = await waiting(store, "s-plain", agent)
        assert await cli("approvals", "sign", rid, "--approver", "risk@corp", "--store", str(approvals),
                         "--key", priv) == 1
        assert "asks for no passkey" in capsys.readouterr().err
        assert await cli("approvals", "challenge", rid, "--store", str(approvals)) == 1
        assert "asks for no passkey" in capsys.readouterr().err
        assert await cli("approvals", "deny", rid, "--approver", "risk@corp", "--store", str(approvals)) == 0
        with pytest.raises(GateBlocked):
            await agent
        assert await cli("approvals", "keys", "list") == 2
        assert "--keyring FILE" in capsys.readouterr().err
    finally:
        store.close()
        wal.close()
