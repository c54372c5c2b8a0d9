"""The kill switch through the real gate and engine: HALT scopes match exactly what they
name, DRAIN refuses new sagas and lets running ones finish, QUARANTINE freezes a saga
without rolling it back (and recovery skips it), TTLs lift levers, and every change
lands in the WAL with who, why and when."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from agent_saga.compensation import Compensation
from agent_saga.controls import (
    ApprovalOutcome,
    BudgetLimit,
    FileSwitchStore,
    InProcessLimitStore,
    KillSwitch,
    Lever,
    LeverAction,
    ManualClock,
    PreFlightGate,
    get_kill_switch,
    set_kill_switch,
)
from agent_saga.controls.killswitch import compile_glob, parse_scope
from agent_saga.errors import ConfigurationError, GateBlocked, SagaQuarantined
from agent_saga.gates import StepRequest
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from engine_support import read, types, wal_fixture  # noqa: F401
from fixtures.steps import req

R = ActionSemantics.REVERSIBLE
C = ActionSemantics.COMPENSABLE
I = ActionSemantics.IRREVERSIBLE  # noqa: E741
DAY = 86_400


def switch(clock: ManualClock | None = None, wal: FileWAL | None = None) -> KillSwitch:
    return KillSwitch(FileSwitchStore(warn=False, clock=clock), wal=wal, clock=clock)


async def refused(ks: KillSwitch, tool: str, **kw: object) -> bool:
    return await ks.check(req(tool, **kw)) is not None  # type: ignore[arg-type]


# --------------------------------------------------------------------------- HALT scopes
async def test_a_tool_halt_stops_exactly_that_tool():
    ks = switch()
    ks.halt("tool:wire.send", reason="fraud pattern", by="soc@corp")
    assert await refused(ks, "wire.send")
    for other in ("wire.sender", "wire", "xwire.send", "wire_send", "Wire.send"):
        assert not await refused(ks, other), other


async def test_a_glob_halt_follows_the_documented_rules():
    ks = switch()
    ks.halt("tool:stripe.*", reason="stripe incident", by="soc@corp")
    for hit in ("stripe.charge", "stripe.refund.create", "stripe."):
        assert await refused(ks, hit), hit
    for miss in ("stripe_mock.x", "stripe", "stripex.charge", "my.stripe.charge", "Stripe.charge"):
        assert not await refused(ks, miss), miss
    assert compile_glob("*.send").fullmatch("wire.send")
    assert compile_glob("wire.?end").fullmatch("wire.send") and not compile_glob("wire.?end").fullmatch("wire.ssend")
    assert not compile_glob("a[b]").fullmatch("ab")  # no character classes: brackets are literal


async def test_a_tag_halt_stops_only_sagas_carrying_the_tag():
    ks = switch()
    ks.halt("tag:eu", reason="EU regulator", by="soc@corp")
    assert await refused(ks, "wire.send", tags=("eu", "payments"))
    assert not await refused(ks, "wire.send", tags=("us",))
    assert not await refused(ks, "wire.send", tags=("europe",))


async def test_a_global_halt_stops_everything_and_resume_lifts_it():
    ks = switch()
    ks.halt(reason="incident 42", by="soc@corp")
    assert await refused(ks, "anything.at_all")
    lifted = ks.resume("global", by="soc@corp")
    assert [lv.action for lv in lifted] == [LeverAction.HALT]
    assert not await refused(ks, "anything.at_all")


def test_levers_refuse_scopes_their_action_cannot_have():
    with pytest.raises(ConfigurationError, match="DRAIN starts no new sagas"):
        Lever.new("Drain", "tool:wire.send", reason="r", by="b", now=0)
    with pytest.raises(ConfigurationError, match="QUARANTINE freezes one saga"):
        Lever.new("Quarantine", "global", reason="r", by="b", now=0)
    with pytest.raises(ConfigurationError, match="quarantine it"):
        Lever.new("Halt", "saga:s-1", reason="r", by="b", now=0)
    with pytest.raises(ConfigurationError, match="reason"):
        Lever.new("Halt", "global", reason=" ", by="b", now=0)
    with pytest.raises(ConfigurationError, match="requester"):
        Lever.new("Halt", "global", reason="r", by="", now=0)
    with pytest.raises(ConfigurationError, match="ttl"):
        Lever.new("Halt", "global", reason="r", by="b", now=0, ttl=0)
    with pytest.raises(ValueError, match="not one of"):
        parse_scope("tools:wire.send")
    assert parse_scope({"sagaId": "s-1"}) == ("saga", "s-1") and parse_scope({}) == ("global", "")


async def test_the_kill_switch_comes_before_limits_and_approvals(wal):
    asked: list[str] = []

    class Approver:
        async def request_approval(self, request, verdict):
            asked.append(request.tool)
            return ApprovalOutcome(True, "risk@corp")

    ks = switch()
    ks.halt("tool:wire.send", reason="fraud pattern", by="soc@corp")
    store = InProcessLimitStore()
    gate = PreFlightGate(limits=[BudgetLimit("daily", arg="amount", max_total=100, window=DAY)],
                         approval_provider=Approver(), store=store, checks=[ks])
    with pytest.raises(GateBlocked) as info:
        async with saga_scope(wal, gate) as saga:
            await saga.execute("wire.send", I, lambda: None, policy_args={"amount": 10})
    assert info.value.decided_by == "kill-switch" and "fraud pattern" in info.value.reason
    assert "soc@corp" in info.value.reason and "agent-saga resume --scope tool:wire.send" in info.value.reason
    assert str(info.value).count("nothing was executed") == 1, str(info.value)  # said once
    assert asked == [] and await gate.usage() == [], "no budget spent, no human woken"
    verdict = next(r for r in read(wal, saga.saga_id) if r.type == "GATE_VERDICT")
    assert verdict.payload["stage"] == "kill_switch"
    assert verdict.payload["detail"]["lever"]["requestedBy"] == "soc@corp"


async def test_a_halt_engaged_while_a_human_decided_still_stops_the_call():
    ks = switch()

    class SlowApprover:
        async def request_approval(self, request, verdict):
            ks.halt("tool:wire.send", reason="halted meanwhile", by="soc@corp")
            return ApprovalOutcome(True, "risk@corp")

    gate = PreFlightGate(approval_provider=SlowApprover(), checks=[ks])
    d = await gate.decide(StepRequest("s", "s/0", "wire.send", I, {}, ()))
    assert not d.allowed and d.stage == "kill_switch" and "approved by risk@corp, but meanwhile" in d.reason


# --------------------------------------------------------------------------- DRAIN
async def test_drain_refuses_new_sagas_and_lets_running_ones_finish(wal):
    ks = switch()
    gate = PreFlightGate(default_rules=(), checks=[ks])
    ran: list[str] = []
    undo = lambda r: Compensation(fn=lambda: None, handler="test.noop")  # noqa: E731
    async with saga_scope(wal, gate, saga_id="running") as saga:
        await saga.execute("a.step", C, lambda: ran.append("a"), undo)
        ks.drain(reason="deploying", by="ci@corp", ttl=600)
        await saga.execute("b.step", C, lambda: ran.append("b"), undo)  # not blocked: it drains
    assert ran == ["a", "b"] and saga.status == "COMPLETED"

    with pytest.raises(GateBlocked) as info:
        async with saga_scope(wal, gate, saga_id="new-one"):
            ran.append("body")
    assert ran == ["a", "b"], "the body of a refused saga never runs"
    assert "DRAIN" in info.value.reason and "deploying" in info.value.reason and "ci@corp" in info.value.reason
    assert types(wal, "new-one") == [], "a refused saga writes nothing"


async def test_a_tag_drain_only_refuses_sagas_with_the_tag(wal):
    ks = switch()
    gate = PreFlightGate(default_rules=(), checks=[ks])
    ks.drain("tag:eu", reason="EU maintenance", by="ci@corp")
    with pytest.raises(GateBlocked):
        async with saga_scope(wal, gate, tags=("eu",)):
            pass
    async with saga_scope(wal, gate, tags=("us",)) as saga:
        await saga.execute("a.read", R, lambda: 1)
    assert saga.status == "COMPLETED"


# --------------------------------------------------------------------------- QUARANTINE
async def test_a_quarantined_saga_stops_at_its_next_step_and_is_not_rolled_back(wal):
    ks = switch()
    gate = PreFlightGate(default_rules=(), checks=[ks])
    undone: list[str] = []
    ran: list[str] = []

    def undo(name: str):
        return lambda r: Compensation(fn=lambda: undone.append(name), handler="test.noop")

    with pytest.raises(SagaQuarantined) as info:
        async with saga_scope(wal, gate, saga_id="saga-8f3c") as saga:
            await saga.execute("stripe.charge", C, lambda: ran.append("c1"), undo("c1"))
            await saga.execute("stripe.charge", C, lambda: ran.append("c2"), undo("c2"))
            ks.quarantine("saga-8f3c", reason="suspected duplicate charges", by="soc@corp")
            await saga.execute("stripe.charge", C, lambda: ran.append("c3"), undo("c3"))
    assert ran == ["c1", "c2"] and undone == [], "stopped, never rolled back"
    assert saga.status == "QUARANTINED" and saga.rollback_report is None
    assert "NOT rolled back" in str(info.value) and info.value.lever["requestedBy"] == "soc@corp"
    kinds = types(wal, "saga-8f3c")
    assert kinds[-1] == "SAGA_QUARANTINED" and not any(k.startswith("COMPENSATION") for k in kinds)
    frozen = read(wal, "saga-8f3c")[-1].payload
    assert frozen["by"] == "soc@corp" and frozen["reason"] == "suspected duplicate charges"
    assert [s["step"] for s in frozen["standing"]] == ["saga-8f3c/0", "saga-8f3c/1"]
    assert ks.is_quarantined("saga-8f3c") and not ks.is_quarantined("other")

    async with saga_scope(wal, gate, saga_id="other") as other:  # others are not affected
        await other.execute("stripe.charge", C, lambda: None, undo("x"))
    assert other.status == "COMPLETED"


async def test_a_quarantined_saga_that_fails_otherwise_is_still_not_rolled_back(wal):
    ks = switch()
    gate = PreFlightGate(default_rules=(), checks=[ks])
    undone: list[str] = []
    with pytest.raises(SagaQuarantined) as info:
        async with saga_scope(wal, gate, saga_id="s-q") as saga:
            await saga.execute("a.b", C, lambda: None, lambda r: Compensation(fn=lambda: undone.append("a"),
                                                                            handler="test.noop"))
            ks.quarantine("s-q", reason="look first", by="soc@corp")
            raise ValueError("the agent hallucinated")
    assert undone == [] and isinstance(info.value.__cause__, ValueError)
    assert types(wal, "s-q")[-1] == "SAGA_QUARANTINED"


async def test_a_saga_that_is_not_quarantined_rolls_back_as_always(wal):
    ks = switch()
    gate = PreFlightGate(default_rules=(), checks=[ks])
    ks.quarantine("someone-else", reason="r", by="b")
    undone: list[str] = []
    with pytest.raises(ValueError):
        async with saga_scope(wal, gate, saga_id="s-r") as saga:
            await saga.execute("a.b", C, lambda: None, lambda r: Compensation(fn=lambda: undone.append("a"),
                                                                            handler="test.noop"))
            raise ValueError("boom")
    assert undone == ["a"] and saga.status == "ROLLED_BACK"


async def test_recovery_skips_a_quarantined_saga(tmp_path: Path):
    from agent_saga.recovery import RecoveryDaemon
    from recovery_support import CALLS, FUTURE, desc, write_orphan

    CALLS.clear()
    log_path = tmp_path / "a.wal"
    write_orphan(log_path, "saga-q", [{"comp": desc("c0")}])
    ks = switch()
    ks.quarantine("saga-q", reason="suspected duplicate charges", by="soc@corp")
    rep = await RecoveryDaemon(log_path, quarantine=ks, clock=FUTURE).sweep()
    assert [r.status for r in rep.results] == ["QUARANTINED"] and rep.recovered == 0 and CALLS == []
    ks.resume("saga:saga-q", by="soc@corp")  # a human decided: let recovery finish it
    rep = await RecoveryDaemon(log_path, quarantine=ks, clock=FUTURE).sweep()
    assert rep.recovered == 1 and [c[1] for c in CALLS] == [{"charge_id": "c0"}]


async def test_a_frozen_saga_stays_with_recovery_skipped_even_after_the_lever_is_lifted(tmp_path: Path):
    from agent_saga.recovery import RecoveryDaemon, lift_quarantine
    from recovery_support import CALLS, FUTURE

    CALLS.clear()
    log_path = tmp_path / "agent.wal"
    wal = FileWAL(log_path)
    ks = switch()
    gate = PreFlightGate(default_rules=(), checks=[ks])
    with pytest.raises(SagaQuarantined):
        async with saga_scope(wal, gate, saga_id="saga-f") as saga:
            await saga.execute("pay.charge", C, lambda: "c0",
                               lambda r: Compensation(handler="test.recovery.refund", kwargs={"charge_id": "c0"}))
            ks.quarantine("saga-f", reason="suspected duplicate charges", by="soc@corp")
            await saga.execute("pay.charge", C, lambda: "c1", lambda r: None)
    wal.close()  # the agent is gone; the saga is frozen in its log
    ks.resume("saga:saga-f", by="soc@corp")
    rep = await RecoveryDaemon(log_path, quarantine=ks, clock=FUTURE).sweep()
    assert rep.quarantined == 1 and rep.recovered == 0 and CALLS == [], "the log itself says: frozen"
    w = FileWAL(log_path)
    lift_quarantine(w, "saga-f", reason="checked: roll it back", by="soc@corp")  # a human decided
    w.close()
    rep = await RecoveryDaemon(log_path, quarantine=ks, clock=FUTURE).sweep()
    assert rep.recovered == 1 and [c[1] for c in CALLS] == [{"charge_id": "c0"}]


# --------------------------------------------------------------------------- TTL, WAL, stores
async def test_a_ttl_lifts_the_lever_at_its_instant_and_the_wal_says_so(wal):
    clock = ManualClock()
    ks = switch(clock, wal)
    ks.halt("tool:wire.send", reason="fraud pattern", by="soc@corp", ttl=600)
    assert await refused(ks, "wire.send")
    clock.advance(599)
    assert await refused(ks, "wire.send")
    clock.advance(1)
    assert not await refused(ks, "wire.send")
    recs = [r for r in read(wal, "wal") if r.type.startswith("KILL_SWITCH")]
    assert [r.type for r in recs] == ["KILL_SWITCH_ENGAGED", "KILL_SWITCH_LIFTED"]
    engaged, lifted = recs[0].payload, recs[1].payload
    assert engaged["lever"]["requestedBy"] == "soc@corp" and engaged["lever"]["reason"] == "fraud pattern"
    assert engaged["lever"]["engagedAt"] and engaged["lever"]["ttl"] == 600
    assert lifted["how"] == "expired" and lifted["id"] == engaged["lever"]["id"]


async def test_changes_made_by_another_process_are_recorded_when_seen(tmp_path: Path, wal):
    path = tmp_path / "switch.json"
    agent = KillSwitch(FileSwitchStore(path, poll=0, warn=False), wal=wal)
    operator = KillSwitch(FileSwitchStore(path, poll=0, warn=False))
    assert not await refused(agent, "wire.send")
    operator.halt("tool:wire.send", reason="fraud pattern", by="soc@corp")
    assert await refused(agent, "wire.send")
    operator.resume("tool:wire.send", by="soc@corp")
    assert not await refused(agent, "wire.send")
    recs = [r for r in read(wal, "wal") if r.type.startswith("KILL_SWITCH")]
    assert [(r.type, r.payload.get("source") or r.payload.get("how")) for r in recs] == [
        ("KILL_SWITCH_ENGAGED", "observed"), ("KILL_SWITCH_LIFTED", "lifted")]


async def test_an_unreadable_lever_document_halts_everything(tmp_path: Path):
    path = tmp_path / "switch.json"
    path.write_text('{"v": 1, "levers": {"ops/typo": {"v": 1, "action": "Hault", "scope": "global"}}}')
    ks = KillSwitch(FileSwitchStore(path, warn=False))
    refusal = await ks.check(req("anything"))
    assert refusal is not None and "unreadable kill switch document" in refusal.reason


async def test_an_unreadable_switch_file_fails_closed(tmp_path: Path):
    path = tmp_path / "switch.json"
    path.write_text("not json")
    ks = KillSwitch(FileSwitchStore(path, warn=False))
    refusal = await ks.check(req("anything"))
    assert refusal is not None and "refuses everything" in refusal.reason
    with pytest.raises(GateBlocked):
        await PreFlightGate(checks=[ks]).admit_saga("s", None, ())


def test_the_file_store_warns_loudly_that_it_only_stops_this_process(caplog):
    with caplog.at_level(logging.WARNING, logger="agent_saga.controls"):
        KillSwitch()
    (rec,) = [r for r in caplog.records if "FileSwitchStore" in r.getMessage()]
    assert rec.levelno == logging.WARNING
    assert "stops this process" in rec.getMessage() and "RedisSwitchStore" in rec.getMessage()


async def test_the_process_wide_switch_is_used_by_gates_built_without_checks(wal):
    ks = switch()
    prev = set_kill_switch(ks)
    try:
        assert get_kill_switch() is ks
        ks.halt("tool:wire.send", reason="fraud", by="soc@corp")
        d = await PreFlightGate(default_rules=()).decide(req("wire.send"))
        assert d.stage == "kill_switch" and not d.allowed
        assert (await PreFlightGate(default_rules=(), checks=[]).decide(req("wire.send"))).allowed
    finally:
        set_kill_switch(prev)


def test_the_documented_redis_setup_opens_a_store_with_its_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/killswitch.md's export line, as written, gives a working store (a URL without a
    grace window would refuse every call)."""
    import re
    from pathlib import Path

    from agent_saga.controls.killswitch import open_switch_store

    doc = (Path(__file__).resolve().parents[4] / "docs" / "killswitch.md").read_text()
    (url,) = re.findall(r"export AGENT_SAGA_SWITCH_STORE='([^']+)'", doc)
    monkeypatch.delenv("AGENT_SAGA_SWITCH_GRACE", raising=False)
    store = open_switch_store(url, warn=False)
    assert store.grace == 30.0  # type: ignore[attr-defined]
