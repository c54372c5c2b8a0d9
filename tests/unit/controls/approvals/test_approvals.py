"""Durable approvals through the real gate and engine (FileApprovalStore, FileWAL):
written to the store and the WAL before anyone is asked, escalated level by level,
denied on expiry and on every failure, found again instead of re-asked, bound to the
exact arguments and used once; break-glass is recorded distinctly."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga.cli import main
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalNotice,
    ApprovalPolicy,
    EscalationLevel,
    FileApprovalStore,
    ManualClock,
    NotifierError,
    PreFlightGate,
    WebhookNotifier,
)
from agent_saga.controls.approvals import ApprovalRefused, decide_request
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.errors import ConfigurationError, GateBlocked
from agent_saga.gates import StepRequest
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL, iter_file_records
from engine_support import read, wal_fixture  # noqa: F401

I = ActionSemantics.IRREVERSIBLE  # noqa: E741


class Human:
    """A notifier standing in for Slack: records what it was told, and (optionally)
    answers through the store from a worker thread, as a web process would."""

    def __init__(self, store: FileApprovalStore, wal: FileWAL | None = None, *, answer: str | None = "approve",
                 at_level: int = 0, note: str = "verified by phone", break_glass: bool = False) -> None:
        self.store, self.wal = store, wal
        self.answer, self.at_level, self.note, self.break_glass = answer, at_level, note, break_glass
        self.notices: list[ApprovalNotice] = []
        self.seen_in_store: list[bool] = []
        self.seen_in_wal: list[bool] = []

    async def notify(self, notice: ApprovalNotice) -> None:
        self.notices.append(notice)
        self.seen_in_store.append(self.store.get(notice.request.id) is not None)
        if self.wal is not None:  # read the file as it is on disk, without flushing
            on_disk = [item for _, item in iter_file_records(self.wal.path)]
            self.seen_in_wal.append(any(getattr(r, "type", "") == "APPROVAL_REQUESTED" for r in on_disk))
        if self.answer is not None and notice.level == self.at_level:
            decide_request(self.store, notice.request.id, approved=self.answer == "approve", approver="risk@corp",
                           now=notice.request.requested_at + 1 + notice.level * 0, note=self.note,
                           break_glass=self.break_glass)


def gateway(tmp_path: Path, wal: FileWAL, notifier=None, clock=None, poll: float = 0.01, **policy) -> ApprovalGateway:
    store = FileApprovalStore(tmp_path / "approvals")
    policy.setdefault("timeout", 900)
    return ApprovalGateway(store, notifier, wal, ApprovalPolicy(**policy), poll=poll, clock=clock)


async def wire(wal: FileWAL, gw: ApprovalGateway, amount: int = 80_000, saga_id: str | None = None) -> list[str]:
    ran: list[str] = []
    async with saga_scope(wal, PreFlightGate(approval_provider=gw), saga_id=saga_id) as saga:
        await saga.execute("wire.send", I, lambda: ran.append("sent"), policy_args={"amount": amount, "to": "acct_9"})
    return ran


def kinds(wal: FileWAL, saga: str | None = None) -> list[str]:
    return [r.type for r in read(wal, saga) if r.type.startswith("APPROVAL")]


async def test_the_request_is_durable_before_anyone_is_asked_and_the_approval_is_recorded(tmp_path, wal):
    store = FileApprovalStore(tmp_path / "approvals")
    human = Human(store, wal)
    gw = ApprovalGateway(store, human, wal, ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),)),
                         poll=0.01)
    assert await wire(wal, gw, saga_id="s-1") == ["sent"]
    assert human.seen_in_store == [True] and human.seen_in_wal == [True]
    assert kinds(wal, "s-1") == ["APPROVAL_REQUESTED", "APPROVAL_DECIDED"]
    decided = next(r for r in read(wal, "s-1") if r.type == "APPROVAL_DECIDED").payload
    assert decided["approver"] == "risk@corp" and decided["note"] == "verified by phone"
    assert decided["policy_args"] == {"amount": 80_000, "to": "acct_9"} and decided["decided_at"]
    assert decided["digest"].startswith("sha256:") and decided["decision"] == "Approved"
    verdict = next(r for r in read(wal, "s-1") if r.type == "GATE_VERDICT").payload
    assert verdict["allowed"] and "approved by risk@corp" in verdict["reason"]
    (req,) = store.list()
    assert req.state == "Approved" and req.consumed_at is not None and req.display["amount"] == "80000"


async def test_a_denial_refuses_the_step(tmp_path, wal):
    store = FileApprovalStore(tmp_path / "approvals")
    gw = ApprovalGateway(store, Human(store, answer="deny", note="not this one"), wal,
                         ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),)), poll=0.01)
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw)
    assert "denied by risk@corp: not this one" in info.value.reason


async def test_the_deadline_is_mandatory_and_expiry_denies(tmp_path, wal):
    with pytest.raises(ConfigurationError, match="deadline is mandatory"):
        ApprovalGateway(FileApprovalStore(tmp_path), None, wal, None)
    clock = ManualClock()
    gw = gateway(tmp_path, wal, clock=clock, poll=30, timeout=900)
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw, saga_id="s-exp")
    assert "expiry denies" in info.value.reason
    assert 900 <= sum(clock.sleeps) < 901, "it waited exactly until the deadline (on the fake clock)"
    (req,) = gw.store.list()
    assert req.state == "Expired"
    decided = [r.payload for r in read(wal, "s-exp") if r.type == "APPROVAL_DECIDED"]
    assert [d["decision"] for d in decided] == ["Expired"]
    with pytest.raises(ApprovalRefused, match="already expired"):
        decide_request(gw.store, req.id, approved=True, approver="late@corp", now=clock.time())


async def test_escalation_walks_the_levels_and_records_each(tmp_path, wal):
    clock = ManualClock()
    store = FileApprovalStore(tmp_path / "approvals")
    human = Human(store, answer="approve", at_level=1)
    gw = ApprovalGateway(store, human, wal, ApprovalPolicy(timeout=900, levels=(
        EscalationLevel(targets=("@oncall",)),
        EscalationLevel(targets=("@head-of-risk",), after_seconds=300))), poll=5, clock=clock)
    start = clock.time()
    assert await wire(wal, gw, saga_id="s-esc") == ["sent"]
    assert [(n.kind, n.level, n.targets) for n in human.notices] == [
        ("requested", 0, ("@oncall",)), ("escalated", 1, ("@head-of-risk",))]
    assert 300 <= clock.time() - start < 310
    esc = [r.payload for r in read(wal, "s-esc") if r.type == "APPROVAL_ESCALATED"]
    assert [(e["level"], e["targets"]) for e in esc] == [(1, ["@head-of-risk"])]
    (req,) = store.list()
    assert [lv for lv, _, _ in req.escalations] == [0, 1]


def _request(saga: str = "s-1", amount: int = 100) -> StepRequest:
    return StepRequest(saga, f"{saga}/0", "wire.send", I, {"amount": amount}, ())


PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")


async def _crash_while_waiting(gw: ApprovalGateway, request: StepRequest) -> str:
    """Start a request and kill the waiter once it is waiting (as a crash would): the request
    is in the store, its first level marked and, with a notifier, notified. (Killing it as
    soon as the document exists could land before the human was asked.)"""
    task = asyncio.create_task(gw.request_approval(request, PENDING))
    told = getattr(gw.notifier, "notices", None)
    for _ in range(500):
        reqs = gw.store.list()
        # Waiting: its first level notified (with no levels, nobody is asked: the request stored).
        if reqs and (not reqs[0].levels or reqs[0].escalated_to(0)) and (told is None or told):
            break
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    (req,) = gw.store.list()
    return req.id


async def test_a_restarted_step_finds_its_request_and_does_not_ask_twice(tmp_path, wal):
    store = FileApprovalStore(tmp_path / "approvals")
    human = Human(store, answer=None)
    policy = ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),))
    rid = await _crash_while_waiting(ApprovalGateway(store, human, wal, policy, poll=0.01), _request())
    decide_request(store, rid, approved=True, approver="risk@corp", now=store.get(rid).requested_at + 5)

    restarted = ApprovalGateway(store, human, wal, policy, poll=0.01)
    outcome = await restarted.request_approval(_request(), PENDING)
    assert outcome.approved and outcome.approver == "risk@corp" and outcome.request_id == rid
    assert len(human.notices) == 1, "the human was asked once"
    assert kinds(wal, "s-1") == ["APPROVAL_REQUESTED", "APPROVAL_RESUMED", "APPROVAL_DECIDED"]

    again = await restarted.request_approval(_request(), PENDING)  # single use
    assert not again.approved and "already used" in again.note and len(human.notices) == 1


async def test_changing_the_arguments_after_approval_is_refused(tmp_path, wal):
    store = FileApprovalStore(tmp_path / "approvals")
    policy = ApprovalPolicy(timeout=900)
    gw = ApprovalGateway(store, None, wal, policy, poll=0.01)
    rid = await _crash_while_waiting(gw, _request(amount=100))
    decide_request(store, rid, approved=True, approver="risk@corp", now=store.get(rid).requested_at + 5)
    outcome = await gw.request_approval(_request(amount=100_000), PENDING)
    assert not outcome.approved and "changing the arguments after approval is refused" in outcome.note
    assert store.get(rid).consumed_at is None, "the approval of the real action was not used up"
    assert (await gw.request_approval(_request(amount=100), PENDING)).approved


async def test_a_new_policy_version_does_not_reuse_an_old_approval(tmp_path, wal):
    store = FileApprovalStore(tmp_path / "approvals")
    rid = await _crash_while_waiting(ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900), poll=0.01),
                                     _request())
    decide_request(store, rid, approved=True, approver="risk@corp", now=store.get(rid).requested_at + 5)
    newer = ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900, version="2"), poll=0.01)
    assert not (await newer.request_approval(_request(), PENDING)).approved


async def test_break_glass_is_recorded_distinctly_and_flagged_for_review(tmp_path, wal):
    store = FileApprovalStore(tmp_path / "approvals")
    human = Human(store, note="CFO on the phone, system down", break_glass=True)
    gw = ApprovalGateway(store, human, wal, ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),)),
                         poll=0.01)
    assert await wire(wal, gw, saga_id="s-bg") == ["sent"]
    assert kinds(wal, "s-bg") == ["APPROVAL_REQUESTED", "APPROVAL_BREAK_GLASS"]
    glass = next(r for r in read(wal, "s-bg") if r.type == "APPROVAL_BREAK_GLASS").payload
    assert glass["requires_review"] is True and glass["approver"] == "risk@corp"
    verdict = next(r for r in read(wal, "s-bg") if r.type == "GATE_VERDICT").payload
    assert "(break-glass)" in verdict["reason"] and verdict["detail"]["approval"]["break_glass"] is True
    with pytest.raises(ApprovalRefused, match="needs --note"):
        decide_request(store, "x", approved=True, approver="a", now=0, break_glass=True)


async def test_a_failing_notifier_denies_and_the_request_cannot_be_approved_later(tmp_path, wal):
    class BrokenSlack:
        async def notify(self, notice):
            raise NotifierError("webhook answered HTTP 500")

    store = FileApprovalStore(tmp_path / "approvals")
    gw = ApprovalGateway(store, BrokenSlack(), wal, ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@x",)),)),
                         poll=0.01)
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw)
    assert "the notifier failed" in info.value.reason and "never authorises" in info.value.reason
    (req,) = store.list()
    assert req.state == "Denied" and req.approver == "agent-saga"
    with pytest.raises(ApprovalRefused, match="already denied"):
        decide_request(store, req.id, approved=True, approver="risk@corp", now=req.requested_at + 1)


async def test_an_unreachable_store_denies(tmp_path, wal):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the store's directory should be")
    gw = ApprovalGateway(FileApprovalStore(blocker / "approvals"), None, wal, ApprovalPolicy(timeout=900))
    with pytest.raises(GateBlocked) as info:
        await wire(wal, gw)
    assert "approvals fail closed" in info.value.reason and "FileApprovalStore" in info.value.reason


def test_policies_are_validated():
    with pytest.raises(ConfigurationError, match="mandatory"):
        ApprovalPolicy(timeout=0)
    with pytest.raises(ConfigurationError, match="in order"):
        ApprovalPolicy(timeout=900, levels=(EscalationLevel(("b",), 300), EscalationLevel(("a",), 0)))
    with pytest.raises(ConfigurationError, match="never happens"):
        ApprovalPolicy(timeout=900, levels=(EscalationLevel(("a",), 900),))
    with pytest.raises(ConfigurationError, match="targets"):
        EscalationLevel("@oncall")  # type: ignore[arg-type]


# --------------------------------------------------------------------------- CLI
def test_the_cli_lists_approves_and_refuses_an_anonymous_approval(tmp_path, capsys, wal):
    store = FileApprovalStore(tmp_path / "approvals")
    rid = asyncio.run(_crash_while_waiting(ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900), poll=0.01),
                                           StepRequest("s-1", "s-1/0", "wire.send", I,
                                                       {"amount": 80000, "to": "acct_9"}, ())))
    d = str(tmp_path / "approvals")
    assert main(["approvals", "list", "--store", d]) == 0
    out = capsys.readouterr().out
    assert "[PENDING] wire.send -- Action cannot be undone (rule irreversible," in out and f"id {rid[:8]})" in out
    assert "amount: 80000" in out and "to: acct_9" in out

    assert main(["approvals", "approve", rid[:8], "--store", d]) == 2
    assert "--approver NAME is required" in capsys.readouterr().err
    assert main(["approvals", "approve", rid[:8], "--approver", "  ", "--store", d]) == 2
    assert store.get(rid).state == "Pending"

    assert main(["approvals", "approve", rid[:8], "--approver", "risk@corp", "--note", "verified", "--store", d]) == 0
    r = store.get(rid)
    assert r.state == "Approved" and r.approver == "risk@corp" and r.note == "verified"
    assert main(["approvals", "deny", rid, "--approver", "other@corp", "--store", d]) == 1
    assert "already approved by risk@corp" in capsys.readouterr().err
    assert main(["approvals", "list", "--store", d]) == 0 and "no approval requests waiting" in capsys.readouterr().out


# --------------------------------------------------------------------------- webhook
@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict], list[int]]]:
    got: list[dict] = []
    status = [200]

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(status[0])
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/services/T000/B000/SECRETPATH", got, status
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_the_webhook_notifier_posts_json_and_fails_loudly(tmp_path, wal, webhook):
    url, got, status = webhook
    store = FileApprovalStore(tmp_path / "approvals")
    rid = await _crash_while_waiting(ApprovalGateway(store, None, wal, ApprovalPolicy(timeout=900), poll=0.01),
                                     _request())
    notice = ApprovalNotice("requested", 0, ("@oncall",), store.get(rid))
    n = WebhookNotifier(url)
    await n.notify(notice)
    assert got[0]["agent_saga"]["request"]["requestId"] == rid and "@oncall" in got[0]["text"]
    assert f"approvals approve {rid}" in got[0]["text"]
    status[0] = 500
    with pytest.raises(NotifierError, match="HTTP 500") as info:
        await n.notify(notice)
    assert "SECRETPATH" not in str(info.value) and "SECRETPATH" not in repr(n)
    with pytest.raises(NotifierError, match="could not be reached"):
        await WebhookNotifier("http://127.0.0.1:9/hook", timeout=1).notify(notice)


async def test_resetting_consumed_at_does_not_make_a_used_approval_usable_again(tmp_path, wal):
    """The record of an approval's use is kept apart from the request document (a file of
    its own, created once): setting the document's consumedAt back to null replays nothing."""
    store = FileApprovalStore(tmp_path / "approvals")
    human = Human(store, answer=None)
    policy = ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),))
    rid = await _crash_while_waiting(ApprovalGateway(store, human, wal, policy, poll=0.01), _request())
    decide_request(store, rid, approved=True, approver="risk@corp", now=store.get(rid).requested_at + 5)
    gw = ApprovalGateway(store, human, wal, policy, poll=0.01)
    assert (await gw.request_approval(_request(), PENDING)).approved
    path = tmp_path / "approvals" / f"{rid}.json"
    doc = json.loads(path.read_text())
    assert doc["consumedAt"] is not None and (tmp_path / "approvals" / f"{rid}.consumed").exists()
    path.write_text(json.dumps({**doc, "consumedAt": None, "consumedBy": None}))
    again = await gw.request_approval(_request(), PENDING)
    assert not again.approved and "already used" in again.note and "whatever its request document says" in again.note
