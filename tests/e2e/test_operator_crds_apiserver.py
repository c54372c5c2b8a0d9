"""The generated CRDs on a real API server: established, enforced, printed.

Every rule DESIGN.md §5 puts in the schema is checked against kube-apiserver itself:
bad objects are refused by ``kubectl apply`` with a message naming the field, an
Approval's decision cannot be changed once made, and ``kubectl get`` answers the
operator's question with printer columns.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga_operator.models import API_VERSION, GROUP, KINDS, VERSION
from e2e_namespaces import namespace
from fixtures.controlplane import KubeCluster
from kubernetes import client
from kubernetes.client.rest import ApiException


@pytest.fixture(scope="module")
def ns(crds: KubeCluster) -> Iterator[str]:
    with namespace(crds, "crds") as name:
        yield name


def obj(kind: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": kind, "metadata": {"name": name}, "spec": spec}


def apply(kube: KubeCluster, ns: str, body: dict[str, Any], check: bool = True) -> Any:
    return kube.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(body), check=check)


GOOD_KS = {"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "fraud pattern", "requestedBy": "soc@corp"}
GOOD_BUDGET = {"kind": "Budget", "arg": "amount", "maxTotal": 50000, "window": "24h"}
DIGEST = "sha256:" + "ab" * 32


def approval_spec(**extra: Any) -> dict[str, Any]:
    spec = {
        "requestId": "af83c011", "tool": "wire.send", "sagaId": "saga-1", "stepId": "s1",
        "rule": "irreversible", "argumentsDigest": DIGEST, "display": {"amount": "80000", "to": "acct_9"},
        "requestedAt": "2026-07-01T12:00:00Z", "deadline": "2026-07-01T12:15:00Z",
    }
    spec.update(extra)
    return spec


def test_every_crd_is_established_with_names_and_status_subresource(crds: KubeCluster) -> None:
    ext = client.ApiextensionsV1Api(crds.api_client())
    for model in KINDS:
        crd = ext.read_custom_resource_definition(model.info.crd_name)
        conds = {c.type: c.status for c in crd.status.conditions}
        assert conds.get("Established") == "True", (model.info.kind, conds)
        assert conds.get("NamesAccepted") == "True"
        assert crd.spec.names.short_names == list(model.info.short_names)
        assert "agentsaga" in crd.spec.names.categories
        (version,) = crd.spec.versions
        assert version.name == VERSION and version.subresources.status == {}
    # Short names and the category resolve through discovery.
    for short in ("ks", "bl", "sp", "appr", "mr"):
        crds.kubectl("get", short, "-A")
    crds.kubectl("get", "agentsaga", "-A")


# (kind, spec, substrings the refusal must contain: the field, and why)
INVALID: list[tuple[str, str, dict[str, Any], tuple[str, ...]]] = [
    ("bad-enum", "KillSwitch", {**GOOD_KS, "action": "Stop"}, ("spec.action", "Unsupported value", "Halt")),
    ("missing-reason", "KillSwitch", {k: v for k, v in GOOD_KS.items() if k != "reason"},
     ("spec.reason", "Required value")),
    ("blank-reason", "KillSwitch", {**GOOD_KS, "reason": "   "}, ("spec.reason", "sentence saying why, not blank")),
    ("missing-requested-by", "KillSwitch", {k: v for k, v in GOOD_KS.items() if k != "requestedBy"},
     ("spec.requestedBy", "Required value")),
    ("malformed-glob", "KillSwitch", {**GOOD_KS, "scope": {"tool": "wire send"}},
     ("spec.scope.tool", '"wire send"', "must be a tool name or glob", "no spaces", "e.g. wire.send")),
    ("bracket-glob", "KillSwitch", {**GOOD_KS, "scope": {"tool": "wire.[ab"}}, ("spec.scope.tool", "no spaces or brackets")),
    ("two-scopes", "KillSwitch", {**GOOD_KS, "scope": {"tool": "wire.send", "tag": "eu"}},
     ("spec.scope", "more than one of tool, tag and sagaId", "keep exactly one")),
    # A blank scope is not a global halt: one empty field must not stop the fleet.
    ("empty-scope", "KillSwitch", {**GOOD_KS, "scope": {}},
     ("spec.scope", "scope is empty", "remove scope entirely for a global switch")),
    ("blank-tool-scope", "KillSwitch", {**GOOD_KS, "scope": {"tool": None}},
     ("spec.scope", "scope is empty", "set one of them")),
    ("empty-string-tool-scope", "KillSwitch", {**GOOD_KS, "scope": {"tool": ""}}, ("spec.scope.tool", "at least 1")),
    ("quarantine-no-saga", "KillSwitch", {**GOOD_KS, "action": "Quarantine"},
     ("spec.scope", "set scope.sagaId")),
    ("halt-with-saga", "KillSwitch", {**GOOD_KS, "scope": {"sagaId": "saga-1"}},
     ("spec.scope.sagaId", "only for action Quarantine")),
    ("drain-by-tool", "KillSwitch", {**GOOD_KS, "action": "Drain"}, ("spec.scope.tool", "Drain")),
    ("zero-ttl", "KillSwitch", {**GOOD_KS, "ttlSeconds": 0}, ("spec.ttlSeconds",)),
    ("negative-max-total", "BudgetLimit", {**GOOD_BUDGET, "maxTotal": -5}, ("spec.maxTotal", "greater than 0")),
    ("budget-without-arg", "BudgetLimit", {k: v for k, v in GOOD_BUDGET.items() if k != "arg"},
     ("spec.arg", "set arg")),
    ("budget-with-max-calls", "BudgetLimit", {**GOOD_BUDGET, "maxCalls": 3}, ("spec.maxCalls", "kind Rate")),
    ("rate-without-max-calls", "BudgetLimit", {"kind": "Rate", "window": "60s"}, ("spec.maxCalls", "maxCalls")),
    ("rate-with-max-total", "BudgetLimit", {"kind": "Rate", "window": "60s", "maxCalls": 20, "maxTotal": 5},
     ("spec.maxTotal", "kind Budget")),
    ("rate-escalates", "BudgetLimit", {"kind": "Rate", "window": "60s", "maxCalls": 20, "escalateToHuman": True},
     ("spec.escalateToHuman",)),
    ("bad-window", "BudgetLimit", {**GOOD_BUDGET, "window": "1 day"},
     ("spec.window", '"1 day"', "d, h, m and s", "e.g. 1d, 24h, 1h30m or 60s")),
    ("ms-window", "BudgetLimit", {**GOOD_BUDGET, "window": "500ms"}, ("spec.window", '"500ms"', "ms is not supported")),
    ("zero-window", "BudgetLimit", {**GOOD_BUDGET, "window": "0s"}, ("spec.window", "at least 1s")),
    ("bad-kind", "BudgetLimit", {**GOOD_BUDGET, "kind": "Spend"}, ("spec.kind", "Unsupported value")),
    ("malformed-limit-glob", "BudgetLimit", {**GOOD_BUDGET, "tools": ["stripe *"]},
     ("spec.tools[0]", '"stripe *"', "tool name or glob")),
    ("malformed-by-arg", "BudgetLimit", {**GOOD_BUDGET, "scope": {"byArgs": ["customer id"]}},
     ("spec.scope.byArgs[0]", "argument name", "e.g. amount or customer_id")),
    ("compensable-without-inverse", "SagaPolicy", {"tools": {"stripe__create_charge": {"semantics": "COMPENSABLE"}}},
     ("spec.tools[stripe__create_charge].compensate", "must declare its inverse")),
    ("irreversible-with-inverse", "SagaPolicy",
     {"tools": {"wire.send": {"semantics": "IRREVERSIBLE", "compensate": {"tool": "wire.recall"}}}},
     ("compensate", "no automated undo")),
    ("bad-semantics", "SagaPolicy", {"tools": {"search_docs": {"semantics": "UNDOABLE"}}},
     ("semantics", "Unsupported value")),
    ("glob-as-tool-name", "SagaPolicy", {"tools": {"stripe.*": {"semantics": "REVERSIBLE"}}},
     ("spec.tools", "exact names")),
    ("bad-json-path", "SagaPolicy",
     {"tools": {"c": {"semantics": "COMPENSABLE", "compensate": {"tool": "r", "args": {"charge": "id"}}}}},
     ("spec.tools[c].compensate.args[charge]", '"id"', "a path starting at $", "e.g. $.id")),
    ("bad-policy-arg-path", "SagaPolicy", {"tools": {"c": {"semantics": "REVERSIBLE", "policyArgs": {"amount": "amount"}}}},
     ("spec.tools[c].policyArgs[amount]", "a path starting at $")),
    ("bad-handler", "SagaPolicy",
     {"tools": {"c": {"semantics": "COMPENSABLE", "compensate": {"handler": "stripe refund"}}}},
     ("spec.tools[c].compensate.handler", "@compensator", "e.g. stripe.refund")),
    ("rule-two-conditions", "SagaPolicy",
     {"rules": [{"name": "r", "tagged": "eu", "toolMatches": ["wire.*"]}]}, ("spec.rules[0]", "exactly one condition")),
    ("undeclared-forward", "SagaPolicy", {"undeclaredTools": "Forward"}, ("spec.undeclaredTools", "Unsupported value")),
    ("inverse-arg-from-call-and-result", "SagaPolicy",
     {"tools": {"g": {"semantics": "COMPENSABLE", "compensate": {
         "tool": "git_reset", "callArgs": {"repo_path": "$.repo_path"}, "args": {"repo_path": "$.path"}}}}},
     ("spec.tools[g].compensate.callArgs", "named in both args and callArgs", "keep it in one of them")),
    ("bad-call-arg-path", "SagaPolicy",
     {"tools": {"g": {"semantics": "COMPENSABLE", "compensate": {"tool": "r", "callArgs": {"repo": "repo_path"}}}}},
     ("spec.tools[g].compensate.callArgs[repo]", "a path starting at $")),
    ("inverse-tool-and-handler", "SagaPolicy",
     {"tools": {"c": {"semantics": "COMPENSABLE", "compensate": {"tool": "r", "handler": "stripe.refund"}}}},
     ("spec.tools[c].compensate", "exactly one inverse")),
    ("decision-without-approver", "Approval", approval_spec(decision="Approved"),
     ("spec.approver", "needs an approver")),
    ("bad-digest", "Approval", approval_spec(argumentsDigest="md5:00"), ("spec.argumentsDigest",)),
    ("blank-approver", "Approval", approval_spec(decision="Approved", approver=" risk@corp"),
     ("spec.approver", "starting with a non-blank character")),
    ("unknown-preferred-host", "ModelRoute",
     {"hosts": [{"name": "local-7b", "endpoint": "http://127.0.0.1:8080/v1", "model": "m",
                 "capabilities": {"contextTokens": 2048}}], "preference": ["frontier"]},
     ("spec.preference", "preference names frontier", "not the name of a host in hosts", "add that host")),
    ("bad-credential-ref", "ModelRoute",
     {"hosts": [{"name": "h", "endpoint": "http://a.example", "model": "m", "capabilities": {"contextTokens": 1},
                 "credentialRef": "sk-Live_Key"}]},
     ("spec.hosts[0].credentialRef", "name of a Secret", "never the key itself")),
    ("duplicate-host", "ModelRoute",
     {"hosts": [{"name": "h", "endpoint": "http://a", "model": "m", "capabilities": {"contextTokens": 1}},
                {"name": "h", "endpoint": "http://b", "model": "m", "capabilities": {"contextTokens": 1}}]},
     ("spec.hosts[1]", "Duplicate value")),
    ("approver-without-decision", "Approval", approval_spec(approver="risk@corp"),
     ("spec.decision", "together with decision")),
    ("bad-endpoint", "ModelRoute",
     {"hosts": [{"name": "h", "endpoint": "ftp://x", "model": "m", "capabilities": {"contextTokens": 1}}]},
     ("spec.hosts[0].endpoint", '"ftp://x"', "http:// or https://")),
]


@pytest.mark.parametrize(("case", "kind", "spec", "expect"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_objects_are_refused_naming_the_field(
    crds: KubeCluster, ns: str, case: str, kind: str, spec: dict[str, Any], expect: tuple[str, ...]
) -> None:
    proc = apply(crds, ns, obj(kind, case, spec), check=False)
    assert proc.returncode != 0, f"{case} was accepted:\n{proc.stdout}"
    for text in expect:
        assert text in proc.stderr, f"{case}: {text!r} not in:\n{proc.stderr}"


def test_valid_objects_are_accepted_and_defaulted(crds: KubeCluster, ns: str) -> None:
    api = client.CustomObjectsApi(crds.api_client())
    apply(crds, ns, obj("KillSwitch", "halt-wires", GOOD_KS))
    apply(crds, ns, obj("KillSwitch", "q", {**GOOD_KS, "action": "Quarantine", "scope": {"sagaId": "saga-8f3c"}}))
    apply(crds, ns, obj("KillSwitch", "drain", {**GOOD_KS, "action": "Drain", "scope": {"tag": "eu"}, "ttlSeconds": 600}))
    apply(crds, ns, obj("BudgetLimit", "daily", GOOD_BUDGET))
    apply(crds, ns, obj("BudgetLimit", "weekly", {**GOOD_BUDGET, "window": "7d"}))
    apply(crds, ns, obj("BudgetLimit", "mixed", {**GOOD_BUDGET, "window": "1d12h"}))
    got = api.get_namespaced_custom_object(GROUP, VERSION, ns, "budgetlimits", "daily")
    assert got["spec"]["escalateToHuman"] is False  # defaulted by the API server
    apply(crds, ns, obj("BudgetLimit", "velocity", {"kind": "Rate", "maxCalls": 20, "window": "1m",
                                                   "scope": {"byTool": True}}))
    apply(crds, ns, obj("SagaPolicy", "p", {"tools": {"search_docs": {"semantics": "REVERSIBLE"}}}))
    got = api.get_namespaced_custom_object(GROUP, VERSION, ns, "sagapolicies", "p")
    assert got["spec"]["undeclaredTools"] == "Refuse" and got["spec"]["mode"] == "Enforce"
    values = {"s": "mixed", "n": 1.5, "b": False, "l": [1, "a", None], "o": {"k": [None]}}
    apply(crds, ns, obj("SagaPolicy", "inverse", {"tools": {"git_add": {"semantics": "COMPENSABLE", "compensate": {
        "tool": "git_reset", "callArgs": {"repo_path": "$.repo_path"}, "values": values}}}}))
    got = api.get_namespaced_custom_object(GROUP, VERSION, ns, "sagapolicies", "inverse")
    assert got["spec"]["tools"]["git_add"]["compensate"]["values"] == values  # every JSON value kept as written


def test_the_reviewed_example_policies_are_valid_resources(crds: KubeCluster, ns: str) -> None:
    for path in sorted((Path(__file__).resolve().parents[2] / "examples" / "policies").glob("*.yaml")):
        proc = crds.kubectl("apply", "-n", ns, "-f", str(path), check=False)
        assert proc.returncode == 0, f"{path.name}: {proc.stderr}"


def test_approval_decision_is_immutable_once_made(crds: KubeCluster, ns: str) -> None:
    api = client.CustomObjectsApi(crds.api_client())
    args = (GROUP, VERSION, ns, "approvals")
    api.create_namespaced_custom_object(*args, obj("Approval", "af83c011", approval_spec()))

    # The request itself cannot be swapped under the approver.
    with pytest.raises(ApiException) as exc:
        api.patch_namespaced_custom_object(*args, "af83c011", {"spec": {"tool": "wire.other"}})
    assert exc.value.status == 422 and "spec.tool" in exc.value.body and "immutable" in exc.value.body

    api.patch_namespaced_custom_object(
        *args, "af83c011", {"spec": {"decision": "Approved", "approver": "risk@corp", "note": "verified by phone"}}
    )
    for change, field in (
        ({"decision": "Denied"}, "spec.decision"),
        ({"approver": "someone@else"}, "spec.approver"),
        ({"note": "changed my mind"}, "spec.note"),
        ({"decision": None, "approver": None}, "spec.decision"),
    ):
        with pytest.raises(ApiException) as exc:
            api.patch_namespaced_custom_object(*args, "af83c011", {"spec": change})
        assert exc.value.status == 422, change
        assert field in exc.value.body and "immutable" in exc.value.body, exc.value.body
    # kubectl says the same, naming the field.
    proc = crds.kubectl("patch", "-n", ns, "approval", "af83c011", "--type=merge",
                        "-p", json.dumps({"spec": {"decision": "Denied"}}), check=False)
    assert proc.returncode != 0 and "spec.decision" in proc.stderr and "immutable" in proc.stderr
    got = api.get_namespaced_custom_object(*args, "af83c011")
    assert got["spec"]["decision"] == "Approved" and got["spec"]["approver"] == "risk@corp"


def test_a_passkey_request_can_only_be_denied_with_kubectl(crds: KubeCluster, ns: str) -> None:
    api = client.CustomObjectsApi(crds.api_client())
    args = (GROUP, VERSION, ns, "approvals")
    api.create_namespaced_custom_object(*args, obj("Approval", "pk-approve", approval_spec(passkeyRequired=True)))
    # An approval needs the approver's passkey signature, which kubectl cannot carry.
    proc = crds.kubectl("patch", "-n", ns, "approval", "pk-approve", "--type=merge",
                        "-p", json.dumps({"spec": {"decision": "Approved", "approver": "risk@corp"}}), check=False)
    assert proc.returncode != 0 and "spec.decision" in proc.stderr, proc.stderr
    assert "needs the approver's passkey" in proc.stderr and "agent-saga approvals sign" in proc.stderr
    # Nor can the requirement be dropped first, then approved.
    with pytest.raises(ApiException) as exc:
        api.patch_namespaced_custom_object(*args, "pk-approve", {"spec": {"passkeyRequired": None}})
    assert exc.value.status == 422 and "spec.passkeyRequired" in exc.value.body and "immutable" in exc.value.body
    with pytest.raises(ApiException) as exc:
        api.patch_namespaced_custom_object(*args, "pk-approve", {"spec": {"passkeyRequired": False}})
    assert exc.value.status == 422 and "immutable" in exc.value.body
    got = api.get_namespaced_custom_object(*args, "pk-approve")
    assert got["spec"]["passkeyRequired"] is True and "decision" not in got["spec"]
    # A denial needs no signature: it is the safe direction.
    api.patch_namespaced_custom_object(*args, "pk-approve", {"spec": {"decision": "Denied", "approver": "risk@corp"}})
    assert api.get_namespaced_custom_object(*args, "pk-approve")["spec"]["decision"] == "Denied"


def test_printer_columns(crds: KubeCluster, ns: str) -> None:
    api = client.CustomObjectsApi(crds.api_client())
    apply(crds, ns, obj("KillSwitch", "cols", GOOD_KS))
    api.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "killswitches", "cols", {"status": {
        "engaged": True, "scope": "tool:wire.send", "observedGeneration": 1, "acked": "2/3",
        "agents": {"matched": 3, "acknowledged": 2, "lagging": ["payments-agent@p-2"]},
        "conditions": [{"type": "Ready", "status": "True", "reason": "Engaged",
                        "message": "agents refuse tool:wire.send", "lastTransitionTime": "2026-07-01T12:00:00Z"}],
    }})
    out = crds.kubectl("get", "killswitches", "-n", ns, "cols").stdout
    header, row = out.splitlines()[:2]
    assert header.split() == ["NAME", "ACTION", "SCOPE", "ENGAGED", "ACKED", "EXPIRES", "READY", "AGE"]
    # EXPIRES is blank without a TTL.
    assert row.split()[:6] == ["cols", "Halt", "tool:wire.send", "true", "2/3", "True"]
    # A TTL's expiry prints as the time it lifts (a "date" column would show a future
    # time as <invalid>).
    api.patch_namespaced_custom_object_status(GROUP, VERSION, ns, "killswitches", "cols", {"status": {
        "expiresAt": "2099-07-01T12:00:00Z"}})
    row = crds.kubectl("get", "killswitches", "-n", ns, "cols").stdout.splitlines()[1]
    assert row.split()[5] == "2099-07-01T12:00:00Z", row
    wide = crds.kubectl("get", "ks", "-n", ns, "cols", "-o", "wide").stdout
    assert "REASON" in wide and "fraud pattern" in wide and "agents refuse tool:wire.send" in wide

    apply(crds, ns, obj("BudgetLimit", "cols", GOOD_BUDGET))
    apply(crds, ns, obj("SagaPolicy", "cols", {}))
    apply(crds, ns, obj("Approval", "cols", approval_spec(requestId="cols")))
    apply(crds, ns, obj("ModelRoute", "cols", {"hosts": [{
        "name": "local-7b", "endpoint": "http://127.0.0.1:8080/v1", "model": "m",
        "capabilities": {"contextTokens": 2048}}]}))
    for plural, cols in (
        ("budgetlimits", ["NAME", "KIND", "MAX", "USED", "REMAINING", "WINDOW", "ACKED", "REFUSED", "HELD", "READY",
                          "AGE"]),
        ("sagapolicies", ["NAME", "MODE", "UNDECLARED", "TOOLS", "RULES", "ACKED", "REFUSED", "HELD", "READY", "AGE"]),
        ("approvals", ["NAME", "TOOL", "SAGA", "PHASE", "APPROVER", "DEADLINE", "READY", "AGE"]),
        ("modelroutes", ["NAME", "HOSTS", "PREFERRED", "ACKED", "READY", "AGE"]),
    ):
        header = crds.kubectl("get", plural, "-n", ns, "cols").stdout.splitlines()[0]
        assert header.split() == cols, (plural, header)
    # The deadline prints as written, future or past.
    row = crds.kubectl("get", "approvals", "-n", ns, "cols").stdout.splitlines()[1]
    assert "2026-07-01T12:15:00Z" in row.split(), row
