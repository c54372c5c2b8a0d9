"""What an agent remembers across a restart, from its own WAL (FileApprovalStore, FileWAL,
real Ed25519 keys, a new ApprovalGateway on the same WAL as a restarted process):

- the deadline it set on a request: a document whose deadline was moved later does not
  extend the request, nor make an approval signed for the moved deadline count;
- that it required signatures: a restarted process that finds no trusted key (the
  policy plane lost its data, nothing mounted) still refuses an unsigned approval.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.clocks import format_instant
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalPolicy,
    EscalationLevel,
    FileApprovalStore,
    ManualClock,
)
from agent_saga.controls.approvals import Decision, DecisionSigner, TrustedKeys, decide_request
from agent_saga.controls.approvals._signing import approver_header
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL

PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")
CALL = StepRequest("s-1", "s-1/0", "wire.send", ActionSemantics.IRREVERSIBLE, {"amount": 80_000}, ())


def risk_key(tmp_path: Path) -> tuple[DecisionSigner, TrustedKeys]:
    priv, pub = generate_signing_key(tmp_path / "risk.pem")
    Path(pub).write_text(approver_header(["risk@corp"]) + Path(pub).read_text())
    return DecisionSigner.from_file(priv), TrustedKeys.from_path(pub)


class Stuck:
    """A notifier that never returns: the first process dies while it notifies, after
    its request and APPROVAL_REQUESTED are durable."""

    def __init__(self) -> None:
        self.called = asyncio.Event()

    async def notify(self, notice) -> None:
        self.called.set()
        await asyncio.Event().wait()


async def ask_then_crash(store: FileApprovalStore, wal: FileWAL, clock: ManualClock, trusted) -> str:
    """A first process asks, then dies while it waits (the request stays in the store)."""
    stuck = Stuck()
    gw = ApprovalGateway(store, stuck, wal, ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),)),
                         poll=30, clock=clock, trusted_keys=trusted)
    task = asyncio.ensure_future(gw.request_approval(CALL, PENDING))
    await stuck.called.wait()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await wal.barrier()
    (r,) = store.list()
    return r.id


def move_deadline(store: FileApprovalStore, rid: str, seconds: float) -> float:
    path = Path(store.directory) / f"{rid}.json"
    doc = json.loads(path.read_text())
    r = store.get(rid)
    assert r is not None
    doc["deadline"] = format_instant(r.deadline + seconds)
    path.write_text(json.dumps(doc))
    return r.deadline


async def test_a_restarted_agent_keeps_the_deadline_it_set_not_the_moved_one(tmp_path: Path) -> None:
    signer, trusted = risk_key(tmp_path)
    store, wal, clock = FileApprovalStore(tmp_path / "approvals"), FileWAL(tmp_path / "w.wal"), ManualClock()
    rid = await ask_then_crash(store, wal, clock, trusted)
    own = move_deadline(store, rid, 3600)
    # A human approves after the deadline the agent set, signed for the moved one.
    decide_request(store, rid, approved=True, approver="risk@corp", now=own + 10, signer=signer)
    clock.advance(600)  # restarted 10 minutes later: without its own record it would wait until now + timeout
    again = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900), poll=30, clock=clock,
                            trusted_keys=trusted)
    out = await again.request_approval(CALL, PENDING)
    assert not out.approved and "expiry denies" in out.note and "another deadline" in out.note, out
    assert clock.time() < own + 30, "it expired at its own deadline, not an hour later"
    wal.close()


async def test_a_restarted_agent_that_finds_no_key_still_requires_a_signature(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("AGENT_SAGA_APPROVAL_KEYS", raising=False)
    _, trusted = risk_key(tmp_path)
    store, wal, clock = FileApprovalStore(tmp_path / "approvals"), FileWAL(tmp_path / "w.wal"), ManualClock()
    rid = await ask_then_crash(store, wal, clock, trusted)
    r = store.get(rid)
    assert r is not None
    store.decide(rid, Decision("Approved", "cfo@corp", clock.time(), r.arguments_digest))
    # Restarted with no key anywhere (the published keys lost, nothing mounted).
    again = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900), poll=30, clock=clock, trusted_keys=None)
    out = await again.request_approval(CALL, PENDING)
    assert not out.approved and "saw trusted keys before" in out.note, out
    wal.close()
