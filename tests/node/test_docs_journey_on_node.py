"""docs/install.md's "On this machine: make cluster" on a real node, run as written.

The commands are read from the page when the test runs (the parser of the docs journey,
tests/e2e/test_docs_journey.py): every command of that section, in order, each with bash
in one shell state (a variable a command exports, `POD`, `ID`, is there for the next),
with the node's kubectl and helm and the `kubectl saga` plugin on PATH. `make cluster`
itself is the one step not run: the session's node stands in for it, and the values file
and agent manifest are written by hack/cluster.py's own code (``write_values``) and named
as its `env` names them. Then the page's "Uninstall" steps 1 and 2 (the CRDs stay: the
rest of the node suite uses them).

Between commands the test checks what a reader would look at: the kill switch obeyed by
all three agents; the example budgets and policy refusing nothing of the agents' own
traffic; the charge over budget refused and counted in the BudgetLimit's status; each
payout's Approval pending, then approved (by kubectl, then by the plugin) and paid; the
agent force-deleted mid-saga and its charge refunded once by recoveryd; the effector
example applied as shipped and governed (its app's call through the proxy answered, the
same server called directly 401, the payments server's log showing only the proxy's
call); and after the uninstall nothing stuck on a finalizer and nothing of the release
left.

It runs first among the node tests (tests/node/conftest.py): it installs the release
"agent-saga" the session's `release` fixture installs later, and uninstalls it.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import os
import shlex
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from e2e.test_docs_journey import INSTALL, _plugin_fallback, install_steps
from fixtures import known_secrets
from fixtures.binaries import REPO_ROOT, Image, require_asset
from fixtures.controlplane import KubeCluster
from fixtures.known_secrets import register_secret
from node_support import DEADLINE, Release, bank, elapsed, pod_http, poll

NS = "agent-saga"
SECTION = "On this machine: `make cluster`"
#: The steps the node stands in for (their effect: the cluster, and cluster.py's env).
REPLACED = ("make cluster", 'eval "$(PYTHONPATH=tests .venv/bin/python hack/cluster.py env)"')
#: The prose of the section names this step before "Uninstall" (the example agents first).
AGENT_DELETE = 'kubectl -n agent-saga delete -f "$AGENT_SAGA_CLUSTER_AGENT"'
EFFECTOR_DELETE = ("kubectl -n agent-saga delete -f examples/k8s/effector/",
                   "kubectl -n agent-saga delete secret payments-mcp-token")
DONE = "{agent-saga}:recovery:done"


def bare(command: str) -> str:
    """A command without its trailing comments."""
    return command.split(" #", 1)[0].strip()


def cluster_script() -> Any:
    spec = importlib.util.spec_from_file_location("agent_saga_hack_cluster", REPO_ROOT / "hack" / "cluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Shell:
    """bash, one command at a time, keeping the exported variables between commands."""

    def __init__(self, work: Path, env: dict[str, str]) -> None:
        self.work, self.env = work, env
        self.state = work / "state.sh"
        self.state.write_text("")

    def run(self, source: str, command: str, timeout: float = DEADLINE + 60) -> str:
        script = f"set -eo pipefail\nsource {shlex.quote(str(self.state))}\n{command}\n" \
                 f"export -p > {shlex.quote(str(self.state))}\n"
        proc = subprocess.run(["bash", "-c", script], cwd=self.work, env=self.env, capture_output=True, text=True,
                              timeout=timeout)
        assert proc.returncode == 0, (
            f"{source}: `{command}` exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
        return proc.stdout

    def var(self, name: str) -> str:
        return self.run("test", f'printf %s "${name}"')


def test_make_cluster_install_guide_on_a_node(node: KubeCluster, images: dict[str, Image], tmp_path: Path) -> None:
    t0 = time.monotonic()
    steps = [s for s in install_steps() if s.section == SECTION]
    assert [bare(s.command or "") for s in steps[:2]] == list(REPLACED), steps[:2]
    assert all(s.skipped and "test_docs_journey_on_node" in s.skipped for s in steps), steps
    assert all(f"`{c}`" in INSTALL.read_text() for c in (AGENT_DELETE, *EFFECTOR_DELETE))
    uninstall = [s for s in install_steps() if s.section == "Uninstall" and s.command and not s.skipped]
    assert [s.command for s in uninstall][:2] == [
        "kubectl delete approvals,killswitches,budgetlimits,sagapolicies,modelroutes --all -A",
        "helm uninstall agent-saga -n agent-saga --wait"], uninstall

    # What `make cluster` leaves: the values file and the agent manifest, and the exports.
    cl = cluster_script()
    cl.VALUES, cl.AGENT, cl.EFFECTOR = tmp_path / "values.yaml", tmp_path / "payments-agent.yaml", tmp_path / "effector"
    cl.write_values(images)
    work = tmp_path / "work"
    work.mkdir()
    for name in ("charts", "crds", "examples"):
        (work / name).symlink_to(REPO_ROOT / name)
    home = tmp_path / "home"
    paths = [str(require_asset("kubectl").parent), str(require_asset("helm").parent),
             str(REPO_ROOT / ".venv" / "bin"), str(_plugin_fallback(home)), "/usr/local/bin", "/usr/bin", "/bin"]
    env = {"PATH": os.pathsep.join(paths), "HOME": str(home), "KUBECONFIG": str(node.kubeconfig),
           "HELM_CACHE_HOME": str(home / "helm-cache"), "HELM_CONFIG_HOME": str(home / "helm-config"),
           "HELM_DATA_HOME": str(home / "helm-data"),
           "AGENT_SAGA_CLUSTER_VALUES": str(cl.VALUES), "AGENT_SAGA_CLUSTER_AGENT": str(cl.AGENT),
           "AGENT_SAGA_CLUSTER_EFFECTOR": str(cl.EFFECTOR)}
    sh = Shell(work, env)
    # A handle on the release the docs install (its Redis, through a port-forward).
    rel = Release(node, images, tmp_path / "release-handle", name="agent-saga", namespace=NS)
    seen: dict[str, Any] = {}

    def obj(kind: str, name: str) -> dict[str, Any]:
        return dict(json.loads(node.kubectl("get", kind, name, "-n", NS, "-o", "json").stdout))

    def stats(pod: str) -> dict[str, Any]:
        status, out = pod_http(node, NS, pod, "/stats")
        assert status == 200, out
        return dict(out)

    def agent_pods() -> list[str]:
        out = json.loads(node.kubectl("get", "pods", "-n", NS, "-l", "app.kubernetes.io/name=payments-agent",
                                      "-o", "json").stdout)["items"]
        return sorted(p["metadata"]["name"] for p in out if not p["metadata"].get("deletionTimestamp")
                      and all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}]))

    def pending() -> list[str]:
        out = json.loads(node.kubectl("get", "approvals", "-n", NS, "-o", "json").stdout)["items"]
        return [a["metadata"]["name"] for a in out if (a.get("status") or {}).get("phase") == "Pending"]

    def refusals(kind: str, name: str) -> dict[str, Any]:
        return dict((obj(kind, name).get("status") or {}).get("refusals") or {})

    def halted() -> None:
        ks = obj("killswitch", "halt-wire-send")
        assert ks["status"]["acked"] == "3/3", ks["status"]
        pods = agent_pods()
        before = {p: stats(p)["refused"] for p in pods}
        for p in pods:  # each agent's own payments are refused at wire.send
            poll(lambda p=p: stats(p)["refused"] > before[p], what=f"{p} refusing wire.send")

    def budgets_let_traffic_through() -> None:
        for kind, name in (("budgetlimit", "daily-spend"), ("budgetlimit", "per-customer"),
                           ("budgetlimit", "velocity"), ("budgetlimit", "wire-ceiling"),
                           ("sagapolicy", "payments-agent")):
            o = obj(kind, name)
            assert o["status"]["acked"] == "3/3", (name, o["status"])
        pods = agent_pods()
        start = {p: stats(p) for p in pods}
        for p in pods:
            poll(lambda p=p: stats(p)["ok"] >= start[p]["ok"] + 5, what=f"{p}: 5 more payments through")
        assert {p: stats(p)["refused"] for p in pods} == {p: start[p]["refused"] for p in pods}
        for kind, name in (("budgetlimit", "daily-spend"), ("budgetlimit", "per-customer"),
                           ("budgetlimit", "velocity"), ("sagapolicy", "payments-agent")):
            assert refusals(kind, name).get("refused") == 0, (name, refusals(kind, name))

    def over_budget_refused(out: str) -> None:
        answer = json.loads(out)
        assert not answer["ok"] and answer["kind"] == "GateBlocked" and f"{NS}.per-customer" in answer["error"], answer
        got = poll(lambda: refusals("budgetlimit", "per-customer") if refusals(
            "budgetlimit", "per-customer").get("refused") == 1 else None, what="the refusal in per-customer's status")
        assert got["last"]["by"] == f"limit:{NS}.per-customer" and got["last"]["tool"] == "payments.charge", got

    def payout_asked(out: str) -> None:
        seen.setdefault("payouts", []).append(json.loads(out)["saga"])

    def one_pending() -> None:
        poll(lambda: len(pending()) == 1, what="the payout's Approval pending")

    def payout_paid() -> None:
        saga, pod = seen["payouts"][-1], sh.var("POD")

        def state() -> str | None:
            status, out = pod_http(node, NS, pod, "/payouts")
            return out.get(saga, {}).get("state") if status == 200 and out.get(saga, {}).get("state") != "waiting" \
                else None
        assert poll(state, what=f"payout {saga} decided") == "done"

    def both_held_counted() -> None:
        poll(lambda: refusals("sagapolicy", "payments-agent").get("heldForHuman") == 2,
             what="two payouts held for a human, in the SagaPolicy's status")

    def held_charge(out: str) -> None:
        answer = json.loads(out)
        assert answer["ok"] and answer["refund_key"], answer
        seen["held"] = answer

    def refunded_once() -> None:
        key = seen["held"]["refund_key"]
        with rel.redis() as (r, _):
            poll(lambda: r.hexists(DONE, key), what="recoveryd refunding the charge of the deleted pod")
            assert r.hget(bank.REFUNDS, key) and r.hget(bank.CALLS, key) == "1"
            assert r.hget(bank.CALLERS, key).startswith("agent-saga-recoveryd-")

    def effector_governed(out: str) -> None:
        assert "through the proxy (http://127.0.0.1:8931/mcp): balance -> " in out, out
        assert "straight to the server (http://payments-mcp:8000/mcp): HTTP 401" in out, out
        assert out.rstrip().endswith("the effector shape holds"), out
        # one MCP session reached the server, the proxy's: the direct call was refused before one began
        logs = node.kubectl("logs", "deployment/payments-mcp", "-n", NS, "--tail=-1").stdout
        assert logs.count("Created new transport with session ID") == 1, logs
        token = node.kubectl("get", "secret", "payments-mcp-token", "-n", NS, "-o",
                             "jsonpath={.data.token}").stdout
        register_secret(base64.b64decode(token).decode())  # the suite's secret scan looks for it too
        assert base64.b64decode(token).decode() not in out

    # Checks before, and after, the command containing the key (after: given its output).
    before: dict[str, Callable[[], None]] = {"export ID=": one_pending}
    after: dict[str, Callable[[str], None]] = {
        "kubectl wait --for=condition=Acknowledged killswitch/": lambda _: halted(),
        "kubectl get budgetlimits,sagapolicies": lambda _: budgets_let_traffic_through(),
        '"customer_id": "cus-big"': over_budget_refused,
        "proxy/payout": payout_asked,
        "kubectl patch approval": lambda _: payout_paid(),
        "kubectl saga approvals approve": lambda _: (payout_paid(), both_held_counted()),
        '"hold": true': held_charge,
        "delete pod": lambda _: refunded_once(),
        "effector_check.py": effector_governed,
    }
    ran: list[str] = []
    try:
        for step in steps[len(REPLACED):]:
            assert step.command is not None
            command = bare(step.command)
            for key, check in before.items():
                if key in command:
                    check()
            out = sh.run(step.source, command)
            ran.append(command)
            for key, then in after.items():
                if key in command:
                    then(out)
        # Before the namespace (and its Events) goes: the suite's secrets, the token included.
        known_secrets.scan_cluster(node.kubectl, "the node's API server")
        # Uninstall: the example agents, then the page's steps 1 and 2; nothing may hang.
        sh.run("docs/install.md (On this machine)", AGENT_DELETE)
        for command in EFFECTOR_DELETE:
            sh.run("docs/install.md (On this machine)", command)
        for step in uninstall[:2]:
            assert step.command is not None
            sh.run(step.source, step.command)
            ran.append(step.command)
        left = node.kubectl("get", "approvals,killswitches,budgetlimits,sagapolicies,modelroutes", "-A",
                            "-o", "name").stdout.split()
        assert left == [], left
        poll(lambda: not json.loads(node.kubectl("get", "pods", "-n", NS, "-o", "json").stdout)["items"],
             what="every pod of the release and of the example stopped")
        assert node.kubectl("get", "rolebindings,deployments,services,secrets", "-n", NS, "-l",
                            "app.kubernetes.io/instance=agent-saga", "-o", "name").stdout.strip() == ""
    finally:
        print(f"docs journey on the node: {len(ran)} commands in {elapsed(t0):.0f}s:\n  " + "\n  ".join(ran))
        # Whatever a failure left: the objects while the operator still runs, the release, and
        # the namespace, gone before the next node test installs the session's release there.
        node.kubectl("delete", "approvals,killswitches,budgetlimits,sagapolicies,modelroutes", "--all", "-n", NS,
                     f"--timeout={int(DEADLINE)}s", timeout=DEADLINE + 10, check=False)
        rel.helm.run("uninstall", "agent-saga", "--namespace", NS, "--ignore-not-found", "--wait", check=False)
        node.kubectl("delete", "namespace", NS, "--ignore-not-found", f"--timeout={int(DEADLINE)}s",
                     timeout=DEADLINE + 10, check=False)
