"""Honest status from agent heartbeats: each test named after a sentence of the spec.

``status.agents`` (matched, acknowledged, the names still lagging), the ACKED column and
an ``Acknowledged`` condition on KillSwitch, BudgetLimit, SagaPolicy and ModelRoute; each
is Ready only when an agent it governs applies it (a ModelRoute: an agent's router routes
by it); an object in a namespace no agent reads says so, and names the namespaces the
live agents read.
"""

from __future__ import annotations

import json

from agent_saga.heartbeat import AppliedRef, Heartbeat, RefusalCount
from agent_saga_operator.acks import ACKNOWLEDGED, Fleet, Tracked, desired_status, tally
from agent_saga_operator.conditions import READY
from agent_saga_operator.refusals import RefusalBook, RefusalTotal

KS = Tracked("KillSwitch", "payments", "halt-wires", "uid-1", 2, reason="Engaged", text="Halt: tool:wire.send")
SP = Tracked("SagaPolicy", "payments", "payments-agent", "uid-9", 1, applies_to=("payments-*",), text="Enforce")


def beat(agent: str, pod: str, *, ks: tuple[AppliedRef, ...] | None = (), policies: tuple[AppliedRef, ...] | None = (),
         ns: str = "payments", pid: int = 1, routes: tuple[AppliedRef, ...] | None = None,
         limits: tuple[AppliedRef, ...] | None = ()) -> Heartbeat:
    return Heartbeat(ns, agent, pod, pid, ts=1000.0, ttl=6.0, namespaces=(ns,), killswitches=ks, policies=policies,
                     routes=routes, limits=limits)


HALT = AppliedRef("payments/halt-wires", "uid-1", 2)
POLICY = AppliedRef("payments/payments-agent", "uid-9", 1)


def conds(t: Tracked, fleet: Fleet | None) -> dict[str, tuple[str, str, str]]:
    _, cs = desired_status(t, fleet)
    return {c.type: (c.status, c.reason, c.message) for c in cs}


def test_every_agent_that_applies_the_switch_acknowledges_it() -> None:
    fleet = Fleet((beat("payments-agent", "p-1", ks=(HALT,)), beat("payments-agent", "p-2", ks=(HALT,))), 1000.0)
    fields, _ = desired_status(KS, fleet)
    assert fields == {"agents": {"matched": 2, "acknowledged": 2, "lagging": []}, "acked": "2/2"}
    status, reason, message = conds(KS, fleet)[ACKNOWLEDGED]
    assert (status, reason) == ("True", "Acknowledged")
    assert "all 2 agent(s) that read namespace payments apply generation 2" in message


def test_an_agent_that_has_not_applied_this_generation_is_named_as_lagging() -> None:
    old = AppliedRef("payments/halt-wires", "uid-1", 1)
    fleet = Fleet((beat("payments-agent", "p-1", ks=(HALT,)), beat("payments-agent", "p-2", ks=(old,))), 1000.0)
    fields, _ = desired_status(KS, fleet)
    assert fields["agents"] == {"matched": 2, "acknowledged": 1, "lagging": ["payments-agent@p-2"]}
    assert fields["acked"] == "1/2"
    status, reason, message = conds(KS, fleet)[ACKNOWLEDGED]
    assert (status, reason) == ("False", "Lagging") and "lagging: payments-agent@p-2" in message


def test_a_recreated_switch_is_not_acknowledged_by_its_predecessors_uid() -> None:
    fleet = Fleet((beat("a", "p-1", ks=(AppliedRef("payments/halt-wires", "uid-0", 2),)),), 1000.0)
    assert tally(fleet, KS).acknowledged == 0


def test_an_agent_without_a_kill_switch_does_not_obey_and_says_so() -> None:
    fleet = Fleet((beat("payments-agent", "p-1", ks=None),), 1000.0)
    fields, _ = desired_status(KS, fleet)
    assert fields["agents"]["lagging"] == ["payments-agent@p-1 (no kill switch)"]
    assert conds(KS, fleet)[ACKNOWLEDGED][:2] == ("False", "Lagging")


def test_a_killswitch_in_a_namespace_no_agent_reads_says_so_and_names_the_namespaces_agents_read() -> None:
    fleet = Fleet((beat("billing-agent", "b-1", ns="billing"), beat("billing-agent", "b-2", ns="billing"),
                   beat("ops-agent", "o-1", ns="ops")), 1000.0)
    status, reason, message = conds(KS, fleet)[ACKNOWLEDGED]
    assert (status, reason) == ("False", "NoAgents")
    assert "no live agent reads namespace payments (live agents read billing (2), ops (1))" in message
    assert "nothing applies it" in message


def test_a_killswitch_no_agent_applies_is_not_ready_whatever_the_policy_plane_holds() -> None:
    ready = conds(KS, Fleet((), 1000.0))[READY]
    assert ready[:2] == ("False", "NoConsumer") and "no live agent heartbeat in the policy plane" in ready[2]
    assert desired_status(KS, Fleet((), 1000.0))[0]["acked"] == "0/0"
    fleet = Fleet((beat("payments-agent", "p-1", ks=(HALT,)), beat("payments-agent", "p-2")), 1000.0)
    ready = conds(KS, fleet)[READY]
    assert ready[:2] == ("True", "Engaged")
    assert ready[2].startswith("Halt: tool:wire.send; applied by 1 of 2 agent(s): payments-agent@p-1")


def test_a_budgetlimit_is_acknowledged_like_every_other_lever() -> None:
    bl = Tracked("BudgetLimit", "payments", "daily", "uid-5", 3, text="at most 50 of amount per 1d")
    ref = AppliedRef("payments/daily", "uid-5", 3)
    fleet = Fleet((beat("payments-agent", "p-1", limits=(ref,)), beat("payments-agent", "p-2", limits=None)), 1000.0)
    fields, _ = desired_status(bl, fleet)
    assert fields["acked"] == "1/2" and fields["agents"]["lagging"] == ["payments-agent@p-2 (no limit reader)"]
    assert conds(bl, fleet)[ACKNOWLEDGED][:2] == ("False", "Lagging")
    assert conds(bl, fleet)[READY][:2] == ("True", "Enforced")


def test_before_any_heartbeat_is_read_acknowledgement_is_unknown() -> None:
    assert conds(KS, None)[ACKNOWLEDGED][:2] == ("Unknown", "AgentsUnknown")
    assert conds(SP, None)[READY][:2] == ("Unknown", "AgentsUnknown")


def test_an_expired_switch_has_nothing_to_acknowledge() -> None:
    t = Tracked("KillSwitch", "payments", "halt-wires", "uid-1", 2, engaged=False)
    assert conds(t, Fleet((beat("a", "p-1", ks=()),), 1000.0))[ACKNOWLEDGED][:2] == ("False", "NotEngaged")


def test_two_processes_of_one_pod_are_told_apart_by_pid() -> None:
    fleet = Fleet((beat("a", "p-1", pid=7, ks=()), beat("a", "p-1", pid=8, ks=())), 1000.0)
    assert tally(fleet, KS).lagging == ("a@p-1.7", "a@p-1.8")


def test_a_sagapolicy_is_ready_only_when_an_agent_enforces_it() -> None:
    fleet = Fleet((beat("payments-agent", "p-1", policies=(POLICY,)), beat("payments-agent", "p-2")), 1000.0)
    fields, _ = desired_status(SP, fleet)
    assert fields["enforcedBy"] == ["payments-agent@p-1"] and fields["acked"] == "1/2"
    status, reason, message = conds(SP, fleet)[READY]
    assert (status, reason) == ("True", "Enforced")
    assert message.startswith("Enforce; applied by 1 of 2 agent(s): payments-agent@p-1; lagging: payments-agent@p-2")
    assert conds(SP, fleet)[ACKNOWLEDGED][:2] == ("False", "Lagging")


def test_a_sagapolicy_no_agent_applied_is_not_ready() -> None:
    fleet = Fleet((beat("payments-agent", "p-1"),), 1000.0)
    assert conds(SP, fleet)[READY][:2] == ("False", "NotApplied")


def test_a_sagapolicy_whose_applies_to_matches_no_live_agent_has_no_consumer() -> None:
    fleet = Fleet((beat("billing-agent", "b-1", policies=(POLICY,)),), 1000.0)
    status, reason, message = conds(SP, fleet)[READY]
    assert (status, reason) == ("False", "NoConsumer")
    assert "no live agent matching payments-* reads namespace payments (live agents read payments (1))" in message


def test_an_observe_mode_policy_is_observed_not_enforced() -> None:
    t = Tracked("SagaPolicy", "payments", "payments-agent", "uid-9", 1, reason="Observing")
    fleet = Fleet((beat("x", "p-1", policies=(POLICY,)),), 1000.0)
    assert conds(t, fleet)[READY][:2] == ("True", "Observing")


ROUTE = AppliedRef("payments/default", "uid-3", 1)
MR = Tracked("ModelRoute", "payments", "default", "uid-3", 1, reason="Routed", text="routes to local-7b first")


def test_a_modelroute_is_ready_once_a_router_routes_by_it() -> None:
    fleet = Fleet((beat("payments-agent", "p-1", routes=(ROUTE,)), beat("payments-agent", "p-2", routes=())), 1000.0)
    status, reason, message = conds(MR, fleet)[READY]
    assert (status, reason) == ("True", "Routed")
    assert message == ("routes to local-7b first; applied by 1 of 2 agent(s): payments-agent@p-1; "
                       "lagging: payments-agent@p-2")
    assert desired_status(MR, fleet)[0]["acked"] == "1/2"


def test_a_modelroute_no_router_reads_is_not_ready() -> None:
    fleet = Fleet((beat("payments-agent", "p-1"),), 1000.0)  # routes None: this process has no router
    status, reason, message = conds(MR, fleet)[READY]
    assert (status, reason) == ("False", "NotApplied")
    assert "none applies generation 1 yet (an agent routes by one ModelRoute" in message
    assert conds(MR, fleet)[ACKNOWLEDGED][:2] == ("False", "Lagging")
    assert "payments-agent@p-1 (no router)" in conds(MR, fleet)[ACKNOWLEDGED][2]


def test_a_modelroute_with_no_live_agent_has_no_consumer() -> None:
    status, reason, message = conds(MR, Fleet((), 1000.0))[READY]
    assert (status, reason) == ("False", "NoConsumer") and "nothing applies it yet" in message


def test_a_modelroute_before_any_heartbeat_is_read_is_unknown() -> None:
    assert conds(MR, None)[READY][:2] == ("Unknown", "AgentsUnknown")


def test_more_than_twenty_lagging_agents_are_counted_not_listed() -> None:
    fleet = Fleet(tuple(beat("a", f"p-{i:02}") for i in range(25)), 1000.0)
    lagging = desired_status(KS, fleet)[0]["agents"]["lagging"]
    assert len(lagging) == 21 and lagging[-1] == "... and 5 more"


# ---------------------------------------------------------------- refusal counts
def counted(refused: int, held: int, at: float, by: str = "limit:payments.daily-spend") -> RefusalCount:
    return RefusalCount("payments/daily-spend", "uid-b", refused, held,
                        {"outcome": "refused", "tool": "payments.charge", "saga": "s-1", "by": by, "at": at})


def with_refusals(pod: str, *counts: RefusalCount, pid: int = 1) -> Heartbeat:
    return Heartbeat("payments", "payments-agent", pod, pid, ts=1000.0, ttl=6.0, namespaces=("payments",),
                     limits=(), refusals=counts)


def test_a_heartbeat_carries_its_refusal_counts_and_reads_them_back() -> None:
    hb = with_refusals("p-1", counted(3, 1, 999.5))
    back = Heartbeat.from_doc(json.loads(hb.to_json()))
    assert back.refusals == hb.refusals
    assert "refusals" not in hb.applied()  # a count is reported at the next beat, not notified
    assert Heartbeat.from_doc({**hb.to_doc(), "refusals": None}).refusals is None


def test_status_adds_the_processes_up_and_a_process_seen_again_is_not_counted_twice() -> None:
    book = RefusalBook()
    book.fold([with_refusals("p-1", counted(2, 0, 10.0)), with_refusals("p-2", counted(1, 1, 20.0))])
    totals = book.fold([with_refusals("p-1", counted(3, 0, 30.0)), with_refusals("p-2", counted(1, 1, 20.0))])
    assert (totals["uid-b"].refused, totals["uid-b"].held) == (4, 1)
    status = totals["uid-b"].to_status()
    assert status["last"]["agent"] == "payments-agent@p-1" and status["last"]["outcome"] == "Refused"
    assert status["last"]["at"] == "1970-01-01T00:00:30Z"


def test_an_agent_that_stopped_still_counts() -> None:
    book = RefusalBook()
    book.fold([with_refusals("p-1", counted(2, 0, 10.0)), with_refusals("p-2", counted(1, 0, 11.0))])
    totals = book.fold([with_refusals("p-2", counted(1, 0, 11.0))])  # p-1 deleted: its heartbeat is gone
    assert totals["uid-b"].refused == 3


def test_a_budget_and_a_policy_show_their_counts_and_other_kinds_do_not() -> None:
    bl = Tracked("BudgetLimit", "payments", "daily-spend", "uid-b", 1, text="Budget")
    fleet = Fleet((beat("payments-agent", "p-1"),), 1000.0, refusals={"uid-b": RefusalTotal(5, 2)})
    assert desired_status(bl, fleet)[0]["refusals"] == {"refused": 5, "heldForHuman": 2}
    assert desired_status(SP, fleet)[0]["refusals"] == {"refused": 0, "heldForHuman": 0}  # nothing reported for it
    assert "refusals" not in desired_status(KS, fleet)[0]


def test_the_gate_counts_only_what_a_document_decided() -> None:
    from agent_saga.heartbeat import AppliedRef, RefusalLedger

    ledger = RefusalLedger()
    ref = AppliedRef("payments/daily-spend", "uid-b", 1)
    ledger.note(ref, "refused", tool="payments.charge", saga="s-1", by="limit:payments.daily-spend")
    ledger.note(ref, "held", tool="payments.charge", saga="s-2", by="limit:payments.daily-spend")
    ledger.note(AppliedRef("a/file-policy", "", 0), "refused", tool="x", saga="s-3", by="policy:a/file-policy")
    (only,) = ledger.snapshot()  # a document without a uid (a file) is nobody's status
    assert (only.refused, only.held, only.last["saga"]) == (1, 1, "s-2")  # type: ignore[index]
