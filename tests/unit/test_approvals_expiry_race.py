"""Expiry denies, whoever sees the deadline first.

At the deadline two parties race to expire a request: the agent waiting on it and the
operator's expiry daemon (or any other process sharing the store). The agent must give
the same answer and the same record either way; the operator e2e test that asserts the
wording saw both interleavings under load.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from agent_saga.controls import ApprovalGateway, ApprovalPolicy, FileApprovalStore
from agent_saga.controls.approvals import Decision
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from engine_support import read, wal_fixture  # noqa: F401

PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")


async def test_a_request_expired_by_another_process_is_reported_as_expiry(tmp_path: Path, wal: FileWAL) -> None:
    store = FileApprovalStore(tmp_path / "approvals")
    gw = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900), poll=0.01)
    request = StepRequest("s-1", "s-1/0", "wire.send", ActionSemantics.IRREVERSIBLE, {"amount": 7}, ())
    waiting = asyncio.create_task(gw.request_approval(request, PENDING))
    for _ in range(2000):
        if store.list():
            break
        await asyncio.sleep(0.01)
    (req,) = store.list()
    # What the operator's expiry daemon writes when it sees the deadline first.
    store.decide(req.id, Decision("Expired", "agent-saga", req.deadline, req.arguments_digest,
                                  "deadline passed without an answer: expiry denies", "kubernetes:ns/x"))
    outcome = await asyncio.wait_for(waiting, 60)
    assert not outcome.approved
    assert "expiry denies" in outcome.note and "expired at" in outcome.note
    decided = [r.payload for r in read(wal, "s-1") if r.type == "APPROVAL_DECIDED"]
    assert [d["decision"] for d in decided] == ["Expired"]
