"""Policy-plane documents built from specs: pure, deterministic, in the documented shape."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from agent_saga.controls import BudgetLimit, RateLimit, by_arg, by_tool, combine, global_scope
from agent_saga.controls.policy import parse_policy, policies_from_documents
from agent_saga_operator.documents import (
    Identity,
    InvalidSpec,
    approval_decision_doc,
    budget_limit_doc,
    duration_seconds,
    killswitch_doc,
    killswitch_scope,
    limit_name,
    model_route_doc,
    runtime_limit,
    saga_policy_doc,
)
from agent_saga_operator.models import (
    ApprovalSpec,
    BudgetLimitSpec,
    KillSwitchSpec,
    ModelRouteSpec,
    SagaPolicySpec,
)
from agent_saga_operator.projection import Keys, limits_from_documents, scope_from_name
from pydantic import ValidationError

WHO = Identity("payments", "x", "uid-1", 4, datetime(2026, 7, 1, 12, 0, tzinfo=UTC))
ENVELOPE = {"v": 1, "id": "payments/x", "namespace": "payments", "name": "x", "uid": "uid-1", "generation": 4}


def ks(**kw: object) -> KillSwitchSpec:
    return KillSwitchSpec.model_validate({"action": "Halt", "reason": "r", "requestedBy": "soc@corp", **kw})


def test_killswitch_scopes_and_document() -> None:
    assert killswitch_scope(ks()) == "global"
    # An empty scope is refused, never read as a global halt (one blank field must not stop
    # the fleet; a global switch omits scope).
    with pytest.raises(ValidationError, match="exactly one of tool, tag or sagaId"):
        ks(scope={})
    assert killswitch_scope(ks(scope={"tool": "stripe.*"})) == "tool:stripe.*"
    assert killswitch_scope(ks(scope={"tag": "eu"})) == "tag:eu"
    assert killswitch_scope(ks(action="Quarantine", scope={"sagaId": "saga-8f3c"})) == "saga:saga-8f3c"
    doc = killswitch_doc(ks(scope={"tool": "wire.send"}, ttlSeconds=600), WHO)
    assert doc == {**ENVELOPE, "kind": "KillSwitch", "action": "Halt", "scope": "tool:wire.send", "reason": "r",
                   "requestedBy": "soc@corp", "ttl": 600, "engagedAt": "2026-07-01T12:00:00Z",
                   "expiresAt": "2026-07-01T12:10:00Z"}
    assert killswitch_doc(ks(), WHO)["expiresAt"] is None
    assert killswitch_doc(ks(), WHO) == killswitch_doc(ks(), WHO)  # no clock inside


def test_a_secret_pasted_into_a_killswitch_reason_never_reaches_the_policy_plane() -> None:
    leaked = "sk_live_" + "4eC39HqLyjWDarjtT1zdp7dc"
    doc = killswitch_doc(ks(reason=f"key {leaked} leaked; password=hunter2"), WHO)
    assert doc["reason"] == "key [REDACTED] leaked; password=[REDACTED]"


@pytest.mark.parametrize(("text", "seconds"), [("24h", 86400), ("1h30m", 5400), ("60s", 60), ("2m5s", 125), ("1d", 86400), ("7d", 604800), ("1d12h", 129600)])
def test_durations(text: str, seconds: int) -> None:
    assert duration_seconds(text) == seconds


def test_zero_duration_is_invalid() -> None:
    with pytest.raises(InvalidSpec):
        duration_seconds("0s")


def test_limit_names_are_namespaced_and_bounded() -> None:
    assert limit_name(WHO) == "payments.x"
    long = Identity("n" * 63, "m" * 40, "u", 1, WHO.created)
    with pytest.raises(InvalidSpec, match="allows 100"):
        limit_name(long)


def test_budget_limits_become_the_runtime_objects() -> None:
    budget = BudgetLimitSpec.model_validate({"kind": "Budget", "arg": "amount", "maxTotal": 50000, "window": "24h",
                                             "scope": {"byTool": True, "byArgs": ["customer_id"]},
                                             "tools": ["stripe.*"], "escalateToHuman": True})
    lim = runtime_limit(budget, WHO)
    assert lim == BudgetLimit("payments.x", arg="amount", max_total=50000, window=86400,
                              scope=combine(by_tool, by_arg("customer_id")), escalate_to_human=True,
                              tools=("stripe.*",))
    doc = budget_limit_doc(budget, WHO)
    assert doc["limit"] == {"v": 1, "name": "payments.x", "kind": "budget", "arg": "amount", "max_total": 50000.0,
                            "window": 86400.0, "scope": "tool+arg:customer_id", "escalate_to_human": True,
                            "tools": ["stripe.*"]}
    rate = BudgetLimitSpec.model_validate({"kind": "Rate", "maxCalls": 20, "window": "1m"})
    assert runtime_limit(rate, WHO) == RateLimit("payments.x", max_calls=20, window=60)
    # And back: what a reader builds from the documents is the same object.
    assert limits_from_documents([doc, budget_limit_doc(rate, WHO)]) == [lim, runtime_limit(rate, WHO)]


@pytest.mark.parametrize(("name", "scope"), [
    ("global", global_scope), ("tool", by_tool), ("arg:customer_id", by_arg("customer_id")),
    ("tool+arg:a+arg:b", combine(by_tool, by_arg("a"), by_arg("b"))),
])
def test_scope_names_round_trip(name: str, scope: object) -> None:
    assert scope_from_name(name) == scope
    assert scope_from_name(name).name == name


def test_unknown_scope_name_is_refused() -> None:
    with pytest.raises(ValueError, match="not global"):
        scope_from_name("tenant")


def test_saga_policy_document_is_the_runtimes_canonical_policy() -> None:
    spec = SagaPolicySpec.model_validate({
        "tools": {
            "stripe__create_charge": {"semantics": "COMPENSABLE",
                                      "compensate": {"tool": "stripe__create_refund", "args": {"charge": "$.id"}},
                                      "policyArgs": {"amount": "$.amount"}},
            "search_docs": {"semantics": "REVERSIBLE"},
        },
        "rules": [{"name": "big", "argExceeds": {"arg": "amount", "threshold": 10000}}],
    })
    doc = saga_policy_doc(spec, WHO)
    assert doc["policy"] == {
        "mode": "Enforce",
        "undeclaredTools": "Refuse",
        "tools": {
            "search_docs": {"semantics": "REVERSIBLE"},
            "stripe__create_charge": {"semantics": "COMPENSABLE",
                                      "compensate": {"tool": "stripe__create_refund", "args": {"charge": "$.id"}},
                                      "policyArgs": {"amount": "$.amount"}},
        },
        "rules": [{"name": "big", "verdict": "RequireApproval", "argExceeds": {"arg": "amount", "threshold": 10000.0}}],
    }
    assert doc["appliesTo"] is None
    assert parse_policy(doc["policy"]) == parse_policy(spec.to_json_doc())


def test_the_runtime_reads_the_operators_saga_policy_documents_and_skips_what_it_cannot() -> None:
    spec = SagaPolicySpec.model_validate({"tools": {"search_docs": {"semantics": "REVERSIBLE"}}})
    good = {"rev": 4, **saga_policy_doc(spec, WHO)}
    newer = {**good, "id": "payments/newer", "v": 2}
    broken = {**good, "id": "payments/broken", "policy": {"mode": "Audit"}}
    policies, problems = policies_from_documents([good, newer, broken])
    assert [(p.id, p.uid, p.generation) for p in policies] == [(WHO.id, WHO.uid, WHO.generation)]
    assert policies[0].policy == parse_policy(spec.to_json_doc())
    assert problems == ["payments/newer: document v=2 is not supported (skipped)",
                        "payments/broken: unreadable SagaPolicy (policy.mode: 'Audit' is not one of Enforce, "
                        "Observe) (skipped)"]


def test_model_route_preference_defaults_to_host_order() -> None:
    host = {"endpoint": "http://127.0.0.1:8080/v1", "model": "m", "capabilities": {"contextTokens": 2048}}
    spec = ModelRouteSpec.model_validate({"hosts": [{"name": "a", **host}, {"name": "b", **host}],
                                          "preference": ["b"]})
    doc = model_route_doc(spec, WHO)
    assert doc["preference"] == ["b", "a"]
    assert doc["hosts"][0]["capabilities"] == {"contextTokens": 2048, "tools": False, "jsonMode": False,
                                               "costClass": "Medium"}


def test_approval_decision_documents() -> None:
    spec = ApprovalSpec.model_validate({
        "requestId": "af83c011", "tool": "wire.send", "sagaId": "s", "stepId": "1", "rule": "irreversible",
        "argumentsDigest": "sha256:" + "0" * 64, "requestedAt": "2026-07-01T12:00:00Z",
        "deadline": "2026-07-01T12:15:00Z", "decision": "Approved", "approver": "risk@corp", "note": "ok"})
    doc = approval_decision_doc(spec, WHO, decided_at=WHO.created, expired=False)
    assert (doc["decision"], doc["approver"], doc["note"], doc["decidedAt"]) == (
        "approved", "risk@corp", "ok", "2026-07-01T12:00:00Z")
    assert approval_decision_doc(spec, WHO, decided_at=WHO.created, expired=True)["decision"] == "expired"


def test_key_schema() -> None:
    k = Keys()
    assert k.doc("killswitch", "payments/x") == "agentsaga:v1:killswitch:payments/x"
    assert k.index("killswitch") == "agentsaga:v1:killswitch:index"
    assert (k.rev, k.channel) == ("agentsaga:v1:rev", "agentsaga:v1:events")
    assert k.decision("af83c011") == "agentsaga:v1:approval:decision:af83c011"
    assert Keys("{agentsaga}").rev == "{agentsaga}:v1:rev"  # one Redis Cluster slot
