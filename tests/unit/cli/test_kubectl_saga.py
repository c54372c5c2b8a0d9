"""`kubectl saga` without a cluster: its help (every command with examples that parse),
its flags (kubectl's, before or after the command), the KillSwitch objects it would make
(checked against the operator's own model of the CRD), the decision patch, the rendering
of status and approvals, and the errors it gives before or instead of reaching a cluster."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from agent_saga.controls.killswitch import LeverAction
from agent_saga.errors import ConfigurationError
from agent_saga.kubectl import build_parser, main
from agent_saga.kubectl._approvals import BREAK_GLASS, decision_patch, render_approval
from agent_saga.kubectl._cluster import GROUP, PLURALS, VERSION, Cluster
from agent_saga.kubectl._status import render
from agent_saga.kubectl._switches import killswitch_body, parse_ttl, switch_name
from agent_saga_operator import models


def commands(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                key = f"{path} {name}".strip()
                out += [(key, sub), *commands(sub, key)]
    return out


ALL = commands(build_parser())


def test_the_commands_are_the_levers_approvals_and_status() -> None:
    assert {k for k, _ in ALL} == {"status", "halt", "drain", "quarantine", "resume", "approvals",
                                   "approvals list", "approvals approve", "approvals deny"}


def test_top_level_help_lists_every_command_with_examples() -> None:
    text = build_parser().format_help()
    assert "examples:" in text and "COMMAND --help" in text and "exit codes:" in text
    for key, _ in ALL:
        if " " not in key:
            assert f"\n    {key} " in text, key
    for verb in ("status", "halt", "drain", "quarantine", "resume", "approvals list", "approvals approve"):
        assert f"  kubectl saga {verb} " in text, verb


@pytest.mark.parametrize(("key", "sub"), ALL, ids=[k for k, _ in ALL])
def test_every_command_has_a_description_examples_that_parse_and_flag_help(
        key: str, sub: argparse.ArgumentParser) -> None:
    assert sub.description and len(sub.description) > 30, key
    undocumented = [a.option_strings or [a.dest] for a in sub._actions
                    if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert undocumented == [], f"kubectl saga {key}: flags without help: {undocumented}"
    lines = (sub.epilog or "").splitlines()
    assert lines and lines[0] == "examples:", key
    assert "examples:\n  kubectl saga " + key in sub.format_help()
    for example in (line.strip() for line in lines[1:] if line.strip()):
        argv = shlex.split(example.split(" #", 1)[0])
        assert argv[:2] == ["kubectl", "saga"] and " ".join(argv[2:]).startswith(key), example
        build_parser().parse_args(argv[2:])


def test_cluster_flags_go_before_or_after_the_command() -> None:
    p = build_parser()
    after = p.parse_args(["halt", "--reason", "r", "-n", "payments", "--context", "prod", "--as", "eve@corp"])
    assert (after.namespace, after.context, after.as_user) == ("payments", "prod", "eve@corp")
    before = p.parse_args(["-n", "payments", "-A", "status"])
    assert before.namespace == "payments" and before.all_namespaces is True
    # A flag given once is not reset by the other position's default.
    assert p.parse_args(["--kubeconfig", "k", "approvals", "list"]).kubeconfig == "k"
    assert not hasattr(p.parse_args(["status"]), "namespace")


def test_ttl_takes_seconds_or_durations_and_rounds_up() -> None:
    assert [parse_ttl(t) for t in ("600", "10m", "1h30m", "45s", "1.2", "1d")] == [600, 600, 5400, 45, 2, 86400]
    for bad in ("0", "-5", "ten", "1w"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_ttl(bad)


@pytest.mark.parametrize(("action", "scope", "spec_scope"), [
    (LeverAction.HALT, "tool:wire.send", {"tool": "wire.send"}),
    (LeverAction.HALT, "tool:stripe.*", {"tool": "stripe.*"}),
    (LeverAction.HALT, "global", None),
    (LeverAction.DRAIN, "tag:eu", {"tag": "eu"}),
    (LeverAction.QUARANTINE, "saga:saga-8f3c", {"sagaId": "saga-8f3c"}),
])
def test_the_killswitch_is_one_the_operator_reads(action: LeverAction, scope: str,
                                                  spec_scope: dict[str, str] | None) -> None:
    body = killswitch_body(action, scope, reason="fraud pattern", by="soc@corp", ttl=600)
    assert body["apiVersion"] == f"{GROUP}/{VERSION}" and body["kind"] == "KillSwitch"
    assert body["spec"] == {"action": action.value.capitalize(), "reason": "fraud pattern",
                            "requestedBy": "soc@corp", "ttlSeconds": 600,
                            **({"scope": spec_scope} if spec_scope else {})}
    # The operator's own model of the CRD accepts it (what it validates before projecting).
    ks = models.KillSwitch.model_validate({"spec": body["spec"]})
    assert ks.spec.action == action.value.capitalize()
    name = body["metadata"]["name"]
    assert name == switch_name(action, body_scope(body)) and len(name) <= 63
    assert body["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "kubectl-saga"}


def body_scope(body: dict[str, Any]) -> str:
    s = body["spec"].get("scope")
    if not s:
        return "global"
    (k, v), = s.items()
    return f"{ {'tool': 'tool', 'tag': 'tag', 'sagaId': 'saga'}[k]}:{v}"


def test_names_are_deterministic_per_action_and_scope() -> None:
    a = switch_name(LeverAction.HALT, "tool:wire.send")
    assert a == switch_name(LeverAction.HALT, "tool:wire.send")
    assert a.startswith("halt-tool-wire.send-")
    others = {switch_name(LeverAction.DRAIN, "tool:wire.send"), switch_name(LeverAction.HALT, "tool:wire.sen"),
              switch_name(LeverAction.HALT, "tool:wire-send"), switch_name(LeverAction.HALT, "tool:*.send")}
    assert a not in others and len(others) == 4
    assert switch_name(LeverAction.HALT, "global").startswith("halt-global-")


@pytest.mark.parametrize(("action", "scope", "words"), [
    (LeverAction.DRAIN, "tool:wire.send", "DRAIN"),
    (LeverAction.HALT, "saga:s-1", "quarantine it"),
    (LeverAction.HALT, "tool:wire send", "not a tool name"),
    (LeverAction.HALT, "team:payments", "not one of"),
])
def test_a_scope_the_action_cannot_have_is_refused_naming_it(action: LeverAction, scope: str, words: str) -> None:
    with pytest.raises(ConfigurationError, match=words):
        killswitch_body(action, scope, reason="r", by="b", ttl=None)


def test_a_bad_scope_exits_2_before_any_cluster_is_asked(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    # The kubeconfig does not exist: the scope is refused first.
    code = main(["halt", "--scope", "tool:wire send", "--reason", "r", "--kubeconfig", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 2 and "kubectl saga halt:" in err and "not a tool name or glob" in err


def test_no_kubeconfig_says_which_flag_to_pass(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["status", "--kubeconfig", str(tmp_path / "none")])
    err = capsys.readouterr().err
    assert code == 2 and "no usable kubeconfig" in err and "--kubeconfig FILE" in err


def test_an_unreachable_cluster_names_the_server_and_what_to_check(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "dead",
        "clusters": [{"name": "dead", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {"token": "t"}}],
        "contexts": [{"name": "dead", "context": {"cluster": "dead", "user": "u", "namespace": "payments"}}]}))
    run = subprocess.run([sys.executable, "-m", "agent_saga.kubectl", "status", "--kubeconfig", str(kubeconfig),
                          "--request-timeout", "5"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2, run.stderr
    assert f"cannot reach the Kubernetes API server at http://127.0.0.1:{port} (context dead)" in run.stderr
    assert "--context" in run.stderr and "Traceback" not in run.stderr


class _Refusal(Exception):
    """What the kubernetes client raises: status, reason and the API server's Status body."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, "x"
        self.body = json.dumps({"kind": "Status", "message": message})


@pytest.mark.parametrize(("status", "message", "words", "code"), [
    (403, 'killswitches.agentsaga.dev is forbidden: User "eve@corp" cannot create resource "killswitches"',
     ["forbidden: you cannot create killswitches", "RoleBinding", "kubectl auth can-i"], 1),
    (403, "ValidatingAdmissionPolicy 'x' denied request: spec.approver must be the user making the decision",
     ["admission policy", "spec.approver must be the user"], 1),
    (404, "the server could not find the requested resource",
     ["CustomResourceDefinitions are not installed", "helm install"], 1),
    (404, 'killswitches.agentsaga.dev "x" not found', ["not found", "-n NAMESPACE"], 1),
    (422, "spec.reason: Invalid value", ["refused the object", "spec.reason"], 1),
    (401, "Unauthorized", ["credentials"], 2),
])
def test_refusals_say_what_to_do(status: int, message: str, words: list[str], code: int) -> None:
    cluster = Cluster(api=None, namespace="payments", all_namespaces=False, server="https://k", context="c")
    err = cluster.explain(_Refusal(status, message), "create killswitches in namespace payments")
    for w in words:
        assert w in err.message, (w, err.message)
    assert err.code == code


def test_the_plurals_and_group_are_the_operators() -> None:
    assert {m.info.kind: m.info.plural for m in models.KINDS} == PLURALS
    assert (models.GROUP, models.VERSION) == (GROUP, VERSION)


APPROVAL = {
    "metadata": {"name": "af83c011aa", "namespace": "payments", "resourceVersion": "42"},
    "spec": {"requestId": "af83c011aa", "tool": "wire.send", "sagaId": "saga-8f3c", "stepId": "saga-8f3c/3",
             "rule": "irreversible", "reason": "Action cannot be undone", "display": {"amount": "80000"},
             "deadline": "2026-07-01T12:15:00Z"},
}


def test_a_decision_is_guarded_by_the_version_that_was_shown() -> None:
    patch = decision_patch(APPROVAL, "Approved", "risk@corp", "verified by phone", False)
    assert patch == {"metadata": {"resourceVersion": "42"},
                     "spec": {"decision": "Approved", "approver": "risk@corp", "note": "verified by phone"}}
    glass = decision_patch(APPROVAL, "Approved", "cfo@corp", "system down", True)
    assert glass["metadata"]["annotations"] == {BREAK_GLASS: "true"}
    with pytest.raises(ConfigurationError, match="--note is blank"):
        decision_patch(APPROVAL, "Denied", "risk@corp", "  ", False)


def test_an_approval_shows_what_is_asked_and_until_when() -> None:
    now = datetime(2026, 7, 1, 12, 5, tzinfo=UTC)
    lines = render_approval(APPROVAL, now=now, with_namespace=True)
    assert lines[0] == ("[PENDING] wire.send -- Action cannot be undone (rule irreversible, saga saga-8f3c, "
                        "id payments/af83c011aa)")
    assert "      amount: 80000" in lines and any("in 10m" in line for line in lines)
    passkey = {**APPROVAL, "spec": {**APPROVAL["spec"], "passkeyRequired": True}}
    assert any("agent-saga approvals sign af83c011aa" in line for line in render_approval(passkey, now=now,
                                                                                          with_namespace=False))
    done = {**APPROVAL, "spec": {**APPROVAL["spec"], "decision": "Approved", "approver": "risk@corp"},
            "status": {"phase": "Approved", "approver": "risk@corp", "signedBy": "3f2a9c0d1e2b4a5c"}}
    text = "\n".join(render_approval(done, now=now, with_namespace=False))
    assert "[APPROVED]" in text and "approved by risk@corp" in text and "signed by key 3f2a9c0d1e2b4a5c" in text


def test_status_says_which_agents_apply_what() -> None:
    ks = {"metadata": {"name": "halt-wire", "namespace": "payments"},
          "spec": {"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "fraud", "requestedBy": "soc@corp"},
          "status": {"engaged": True, "agents": {"matched": 3, "acknowledged": 2, "lagging": ["pay-2@pod-b"]},
                     "conditions": [{"type": "Ready", "status": "True", "reason": "Engaged", "message": "m"}]}}
    sp = {"metadata": {"name": "payments", "namespace": "payments"},
          "spec": {"mode": "Enforce", "tools": {"a": {}, "b": {}}},
          "status": {"agents": {"matched": 1, "acknowledged": 1, "lagging": []}, "enforcedBy": ["pay-1@pod-a"],
                     "conditions": [{"type": "Ready", "status": "True", "reason": "Enforced", "message": ""}]}}
    mr = {"metadata": {"name": "route", "namespace": "payments"}, "spec": {"hosts": [{"name": "h"}]},
          "status": {"agents": {"matched": 0, "acknowledged": 0, "lagging": []},
                     "conditions": [{"type": "Ready", "status": "False", "reason": "NoConsumer",
                                     "message": "no live agent reads payments"}]}}
    bl = {"metadata": {"name": "daily", "namespace": "payments"},
          "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 50000, "window": "24h"},
          "status": {"max": 50000, "used": 1200, "refusals": {
              "refused": 2, "heldForHuman": 0, "last": {
                  "outcome": "Refused", "tool": "payments.charge", "saga": "s-1", "by": "limit:payments.daily",
                  "agent": "pay-1@pod-a", "at": "2026-07-01T12:04:00Z"}}}}
    text = "\n".join(render({"KillSwitch": [ks], "SagaPolicy": [sp], "ModelRoute": [mr], "BudgetLimit": [bl],
                             "Approval": [APPROVAL]}, where="namespace payments", with_ns=False,
                            now=datetime(2026, 7, 1, 12, 5, tzinfo=UTC)))
    assert "halt-wire: HALT tool:wire.send engaged, by soc@corp: fraud" in text
    assert "agents 2/3 acknowledged; lagging: pay-2@pod-b" in text
    assert "enforced by: pay-1@pod-a" in text
    assert "route: 1 hosts" in text and "none reads this namespace" in text
    assert "Ready=False (NoConsumer: no live agent reads payments)" in text
    assert "daily: Budget amount 1200 of 50000 per 24h" in text
    assert ("refused 2, held for a human 0; last: payments.charge refused by limit:payments.daily "
            "(pay-1@pod-a, 2026-07-01T12:04:00Z)") in text
    assert "approvals: 1 pending, 0 decided or expired" in text and "[PENDING] wire.send" in text
    # Nothing made yet: the section says none, and an unreconciled object says why.
    bare = "\n".join(render({"KillSwitch": [{**ks, "status": {}}]}, where="w", with_ns=True,
                            now=datetime.now(UTC)))
    assert "budget limits: none" in bare and "is the operator running" in bare and "payments/halt-wire" in bare


def test_a_credential_pasted_into_the_reason_is_not_stored() -> None:
    body = killswitch_body(LeverAction.HALT, "global", reason="key sk_live_4eC39HqLyjWDarjtT1zdp7dc leaked",
                           by="soc@corp", ttl=None)
    assert body["spec"]["reason"] == "key [REDACTED] leaked"


def test_status_names_a_kind_it_may_not_read_and_shows_the_rest() -> None:
    text = "\n".join(render({"Approval": []}, where="namespace payments", with_ns=False, now=datetime.now(UTC),
                            refused={"KillSwitch": "forbidden: you cannot list killswitches"}))
    assert "kill switches: cannot be read: forbidden: you cannot list killswitches" in text
    assert "approvals: 0 pending" in text
