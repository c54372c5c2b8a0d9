"""The effector mode on a real node: examples/k8s/effector/ (an agent pod whose proxy,
`agent-saga mcp` as a native sidecar, is the only holder of the payments server's bearer
token and of the policy plane's Redis credential), attacked from inside the application
container with `kubectl exec ... python`: code the agent could run.

Every row runs twice: against the example as shipped (the attack fails), and against a
LEAKY copy of it with the protections removed (the secret mounted into the app, the Redis
URL in its environment, the process namespace shared, the proxy's UID) where the same probe
must find what it looks for — so no row passes because its probe is blind. The table is
printed at the end (and is docs/threat-model.md's "The effector mode on a real node").
"""

from __future__ import annotations

import json
import secrets
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from effector_probes import LOOK, MCP, REDIS, SEE
from fixtures.binaries import require_asset
from fixtures.known_secrets import secret
from node_support import DEADLINE, REPO_ROOT, Release, exec_python, poll

EXAMPLE = REPO_ROOT / "examples" / "k8s" / "effector"
TOKEN = secret("effector-node-token", "pt")  # a shape nothing else in the pod has
CREDS = "/var/run/secrets/agent-saga/credentials"
PROXY = "http://127.0.0.1:8931/mcp"
UPSTREAM = "http://payments-mcp:8000/mcp"
SESSION_IDLE = 6
ROWS: dict[str, tuple[str, str]] = {}  # attack -> (as shipped, leaky copy)
IDLE = ["python", "-c", "import signal, sys; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); signal.pause()"]


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLE / name).read_text()) if d]


def agent_manifest(rel: Release, name: str, leaky: bool, shared: bool = False) -> list[dict[str, Any]]:
    """examples/k8s/effector/agent.yaml on this tree's images (the app: python and nothing
    else, idle: the tests exec into it); `leaky` removes every protection, `shared` only
    shares the process namespace (the UIDs stay apart)."""
    out = []
    for d in _docs("agent.yaml"):
        if d["kind"] == "Deployment":
            d["metadata"]["name"] = name
            d["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] = name
            d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"] = name
            pod = d["spec"]["template"]["spec"]
            pod["terminationGracePeriodSeconds"] = 2
            (proxy,), (app,) = pod["initContainers"], pod["containers"]
            proxy["image"], proxy["imagePullPolicy"] = rel.images["agent-saga-recoveryd"].ref, "Never"
            proxy["command"] = [a if not a.startswith("--session-idle=") else f"--session-idle={SESSION_IDLE}"
                             for a in proxy["command"]]
            app["image"], app["imagePullPolicy"], app["command"] = rel.images["debian-python"].ref, "Never", IDLE
            if leaky or shared:
                pod["shareProcessNamespace"] = True
            if leaky:
                app["securityContext"]["runAsUser"] = app["securityContext"]["runAsGroup"] = 65532
                app["volumeMounts"].append({"name": "agent-saga-credentials", "mountPath": CREDS, "readOnly": True})
                app["env"] += [e for e in proxy["env"] if e["name"] in ("REDIS_AGENT_PASSWORD", "AGENT_SAGA_REDIS_URL")]
        out.append(d)
    return out


def server_manifest(rel: Release) -> list[dict[str, Any]]:
    out = [{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "payments-mcp-token"},
            "stringData": {"token": TOKEN}}]
    for d in _docs("payments-mcp.yaml") + _docs("policy.yaml"):
        if d["kind"] == "Deployment":
            c = d["spec"]["template"]["spec"]["containers"][0]
            c["image"], c["imagePullPolicy"] = rel.images["payments-mcp"].ref, "Never"
        out.append(d)
    return out


class Pod:
    def __init__(self, rel: Release, deployment: str) -> None:
        self.rel, self.deployment = rel, deployment

    @property
    def name(self) -> str:
        pods = self.rel.pods(f"app.kubernetes.io/name={self.deployment}")
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return str(pods[0]["metadata"]["name"])

    def run(self, script: str, **params: Any) -> dict[str, Any]:
        return exec_python(self.rel, self.name, script, stdin=json.dumps(params), container="app")

    def mcp(self, *calls: tuple[str, dict[str, Any]], **params: Any) -> dict[str, Any]:
        return self.run(MCP, calls=list(calls), **params)


@pytest.fixture(scope="module")
def effector(release: Release) -> Iterator[tuple[Pod, Pod]]:
    """The example's agent pod and its leaky copy (a third, sharing only the process
    namespace, is reached with Pod(rel, "effector-shared"))."""
    rel = release
    objs = server_manifest(rel) + agent_manifest(rel, "effector-agent", False) + agent_manifest(rel, "effector-leaky", True)
    objs += agent_manifest(rel, "effector-shared", False, shared=True)[1:]  # (the ConfigMap once)
    text = yaml.safe_dump_all(objs)
    rel.kubectl("apply", "-f", "-", input=text)
    try:
        for d in ("payments-mcp", "effector-agent", "effector-leaky", "effector-shared"):
            out = rel.kubectl("rollout", "status", f"deployment/{d}", f"--timeout={int(DEADLINE)}s",
                              timeout=DEADLINE + 10, check=False)
            assert out.returncode == 0, f"{d} not rolled out: {out.stderr}\n{diagnose(rel, d)}"
        safe, leaky = Pod(rel, "effector-agent"), Pod(rel, "effector-leaky")
        # The operator has projected the SagaPolicy: until then the proxy refuses every call.
        poll(lambda: safe.mcp(("balance", {}))["calls"][0]["value"] is not None, what="the SagaPolicy in force")
        yield safe, leaky
    finally:
        rel.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=true", input=text, timeout=DEADLINE)


def diagnose(rel: Release, deployment: str) -> str:
    """What a Deployment's pods say: their status and every container's log."""
    out = [rel.kubectl("describe", "pods", "-l", f"app.kubernetes.io/name={deployment}", check=False).stdout[-6000:]]
    for c in ("agent-saga-mcp", "app", "payments-mcp"):
        logs = rel.kubectl("logs", f"deployment/{deployment}", "-c", c, "--tail=60", check=False)
        out.append(f"--- {c}:\n{logs.stdout}{logs.stderr}")
    return "\n".join(out)


def ledger(rel: Release) -> list[dict[str, Any]]:
    """The payments server's own record of what it executed (its log)."""
    out = rel.kubectl("logs", "deployment/payments-mcp", "--tail=-1").stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"payments"')]


def refused(call: dict[str, Any]) -> str | None:
    err = call.get("error")
    return str(err.get("message")) if isinstance(err, dict) and err.get("code") == -32001 else None


def leaked_token(leaky: Pod) -> str:
    """The upstream's token, as the leaky copy's app reads it from the mount it was given."""
    return str(leaky.run(f"import json; print(json.dumps({{'t': open('{CREDS}/payments-token').read()}}))")["t"])


def redis_password(rel: Release) -> str:
    import base64
    secret = json.loads(rel.kubectl("get", "secret", rel.component("redis"), "-o", "json").stdout)
    return base64.b64decode(secret["data"]["agent-password"]).decode()


def test_the_credentials_are_nowhere_the_app_can_read(effector: tuple[Pod, Pod]) -> None:
    safe, leaky = effector
    wanted = [TOKEN, redis_password(safe.rel)]
    seen = safe.run(LOOK, secrets=wanted)
    assert seen["files_read"] > 1000, seen["files_read"]  # it did walk a filesystem
    assert (seen["env"], seen["files"], seen["proc"]) == ([], [], []), seen
    bad = leaky.run(LOOK, secrets=wanted)
    assert bad["env"] and bad["files"] and bad["proc"], bad
    ROWS["read the upstream's token or the Redis password: environment, every file, every visible /proc/*/environ and cmdline"] = (
        f"found nowhere ({seen['files_read']} files read, {len(seen['pids'])} other processes visible)",
        f"found: env {sorted(bad['env'])}, files {bad['files']}, {bad['proc']}")


def test_the_proxy_is_invisible_from_the_app(effector: tuple[Pod, Pod]) -> None:
    safe, leaky = effector
    paths = [f"{CREDS}/payments-token", "/etc/agent-saga/mcp-upstreams.json"]
    seen = safe.run(SEE, paths=paths)
    assert not [c for c in seen["procs"].values() if c and "agent-saga" in c], seen
    assert seen["opened"] == [], seen
    bad = leaky.run(SEE, paths=paths)
    assert [c for c in bad["procs"].values() if c and "agent-saga mcp" in c], bad
    assert [p for p in bad["opened"] if p.startswith("/proc/") and p.endswith("payments-token")], bad
    ROWS["see the proxy's processes, open its files (directly or through /proc/PID/root)"] = (
        f"no proxy process among {len(seen['procs'])} visible; nothing opens",
        f"sees `agent-saga mcp`; opens {bad['opened']}")


def test_another_uid_cannot_read_the_proxy_through_a_shared_process_namespace(effector: tuple[Pod, Pod]) -> None:
    safe, _ = effector
    shared = Pod(safe.rel, "effector-shared")
    seen = shared.run(SEE, paths=[f"{CREDS}/payments-token", "/etc/agent-saga/mcp-upstreams.json"])
    assert [c for c in seen["procs"].values() if c and "agent-saga mcp" in c], seen  # visible...
    assert seen["opened"] == [], seen  # ...but its root is not the app's to open
    looked = shared.run(LOOK, secrets=[TOKEN, redis_password(safe.rel)])
    assert (looked["env"], looked["files"], looked["proc"]) == ([], [], []), looked
    assert looked["unreadable_proc"] > 0, looked  # the proxy's environ was there, and refused
    ROWS["the same, with `shareProcessNamespace: true` but the app on its own UID"] = (
        f"sees `agent-saga mcp`, but its environ and /proc/PID/root refuse ({looked['unreadable_proc']} refused)",
        "same UID (the leaky copy): read, as above")


def test_redis_refuses_the_app(effector: tuple[Pod, Pod]) -> None:
    safe, leaky = effector
    host = {"host": safe.rel.component("redis"), "port": 6379}
    seen = safe.run(REDIS, **host)
    # The chart's Redis has no password-less default user: every command needs AUTH.
    assert all(r.startswith("-NOAUTH") for r in seen["anonymous"]), seen
    assert seen["default_empty"][0].startswith("-WRONGPASS") and seen["default_empty"][1].startswith("-NOAUTH"), seen
    assert seen["agent_guess"][0].startswith("-WRONGPASS"), seen
    assert "with_env" not in seen, seen  # nothing in the app's environment to try
    bad = leaky.run(REDIS, **host)
    assert bad["with_env"] == ["+OK", "+PONG"], bad
    ROWS["talk to the policy plane's Redis (reset a budget, lift a kill switch)"] = (
        f"`PING` → {seen['anonymous'][0]}; `AUTH default \"\"` → {seen['default_empty'][0].split(' ')[0]}; "
        "no credential to use",
        f"`AUTH` with the URL from its environment → {bad['with_env']}")


def test_the_upstream_refuses_a_direct_call(effector: tuple[Pod, Pod]) -> None:
    safe, leaky = effector
    direct = safe.mcp(("charge", {"amount": 1}), url=UPSTREAM)
    guessed = safe.mcp(("charge", {"amount": 1}), url=UPSTREAM, headers={"Authorization": "Bearer guess"})
    assert direct["init"] == guessed["init"] == 401, (direct, guessed)
    through = safe.mcp(("charge", {"amount": 1}))
    assert through["init"] == 200 and through["calls"][0]["value"]["amount"] == 1, through
    token = leaked_token(leaky)
    bad = leaky.mcp(("charge", {"amount": 1}), url=UPSTREAM, headers={"Authorization": f"Bearer {token}"})
    assert bad["init"] == 200 and bad["calls"][0]["value"]["amount"] == 1, bad
    ROWS["call the payments server directly, around the proxy"] = (
        "HTTP 401 (no token; a guessed one too); through the proxy the call is made",
        "with the mounted token: HTTP 200, the charge is made ungoverned")


def test_a_kill_switch_refuses_calls_through_the_proxy(effector: tuple[Pod, Pod]) -> None:
    safe, leaky = effector
    rel = safe.rel
    ks = {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "KillSwitch", "metadata": {"name": "effector-halt-charge"},
          "spec": {"action": "Halt", "scope": {"tool": "charge"}, "reason": "charges halted by the SOC",
                   "requestedBy": "soc@corp"}}
    before = len(ledger(rel))
    rel.kubectl("apply", "-f", "-", input=yaml.safe_dump(ks))
    try:
        msg = poll(lambda: refused(safe.mcp(("charge", {"amount": 2}))["calls"][0]), what="the kill switch refusing charge")
        assert "charges halted by the SOC" in msg, msg
        executed = [e for e in ledger(rel)[before:] if e["payments"] == "charge" and e["amount"] == 2]
        token = leaked_token(leaky)
        bad = leaky.mcp(("charge", {"amount": 3}), url=UPSTREAM, headers={"Authorization": f"Bearer {token}"})
        assert bad["calls"][0]["value"]["amount"] == 3, bad
        # Refused calls never reached the server (a charge of 2 made before the switch took hold may have).
        again = safe.mcp(("charge", {"amount": 2}))
        assert refused(again["calls"][0]), again
        assert [e for e in ledger(rel)[before:] if e["payments"] == "charge" and e["amount"] == 2] == executed
    finally:
        rel.kubectl("delete", "-f", "-", "--wait=true", input=yaml.safe_dump(ks))
    poll(lambda: not refused(safe.mcp(("charge", {"amount": 2}))["calls"][0]), what="charges through the proxy again")
    ROWS["charge while a KillSwitch halts `charge` (`kubectl apply -f`)"] = (
        f"-32001 `{msg[:90]}`; the server never sees it", "direct call with the token: charged despite the switch")


def test_an_exhausted_budget_refuses_calls_through_the_proxy(effector: tuple[Pod, Pod]) -> None:
    safe, leaky = effector
    rel = safe.rel
    name = "effector-budget-" + secrets.token_hex(3)
    limit = {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "BudgetLimit", "metadata": {"name": name},
             "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 100, "window": "1h", "tools": ["charge"]}}
    rel.kubectl("apply", "-f", "-", input=yaml.safe_dump(limit))
    try:
        # In force once a charge over the whole budget is refused.
        msg = poll(lambda: refused(safe.mcp(("charge", {"amount": 1000}))["calls"][0]), what=f"{name} in force")
        out = safe.mcp(*[("charge", {"amount": 40})] * 4)
        made = [c for c in out["calls"] if c["value"]]
        stopped = [refused(c) for c in out["calls"] if not c["value"]]
        assert 1 <= len(made) <= 2 and stopped and all(stopped), out
        assert all(name in m or "limit" in m.lower() or "budget" in m.lower() for m in stopped), stopped  # type: ignore[operator]
        around = leaky.mcp(("charge", {"amount": 40}), url=UPSTREAM, headers={"Authorization": f"Bearer {leaked_token(leaky)}"})
        assert around["calls"][0]["value"]["amount"] == 40, around  # the exhausted budget does not see it
    finally:
        rel.kubectl("delete", "-f", "-", "--wait=true", input=yaml.safe_dump(limit))
    ROWS["spend past a BudgetLimit (maxTotal 100), or reset it"] = (
        f"{len(made)} charges of 40 made, then -32001 `{str(stopped[0])[:80]}`; no Redis credential to reset it",
        "direct call with the token: charged past the exhausted budget")
    del msg


def test_an_irreversible_call_waits_for_an_approval_and_lands_once(effector: tuple[Pod, Pod], tmp_path: Path
                                                                    ) -> None:
    safe, leaky = effector
    rel = safe.rel
    to = "acct_" + secrets.token_hex(4)
    known = {a["metadata"]["name"] for a in json.loads(rel.kubectl("get", "approvals", "-o", "json").stdout)["items"]}
    params = tmp_path / "wire.json"
    params.write_text(json.dumps({"calls": [["wire", {"amount": 5, "to": to}]]}))
    with open(params) as stdin, open(tmp_path / "wire.out", "w+") as stdout:
        call = subprocess.Popen(
            [str(require_asset("kubectl")), "--kubeconfig", str(rel.cluster.kubeconfig), "-n", rel.namespace, "exec",
             "-i", safe.name, "-c", "app", "--", "python", "-c", MCP], stdin=stdin, stdout=stdout,
            stderr=subprocess.STDOUT, text=True)
        try:
            def pending() -> str | None:
                items = json.loads(rel.kubectl("get", "approvals", "-o", "json").stdout)["items"]
                new = [a["metadata"]["name"] for a in items if a["metadata"]["name"] not in known
                       and a["spec"].get("tool") == "wire"]
                return new[0] if new else None

            approval = poll(pending, what="the Approval of the wire")
            assert call.poll() is None, "the call returned before anyone decided"
            assert not [e for e in ledger(rel) if e["payments"] == "wire" and e["to"] == to]
            rel.kubectl("patch", "approval", approval, "--type=merge", "-p", json.dumps(
                {"spec": {"decision": "Approved", "approver": rel.whoami(), "note": "effector node test"}}))
            call.wait(timeout=DEADLINE)
        finally:
            if call.poll() is None:
                call.kill()
                call.wait()
        stdout.seek(0)
        out = stdout.read()
    result = json.loads(out.strip().splitlines()[-1])
    assert result["calls"][0]["value"]["to"] == to, result
    wires = [e for e in ledger(rel) if e["payments"] == "wire" and e["to"] == to]
    assert len(wires) == 1 and wires[0]["id"] == result["calls"][0]["value"]["id"], wires
    known = {a["metadata"]["name"] for a in json.loads(rel.kubectl("get", "approvals", "-o", "json").stdout)["items"]}
    around = leaky.mcp(("wire", {"amount": 5, "to": to + "-direct"}), url=UPSTREAM,
                       headers={"Authorization": f"Bearer {leaked_token(leaky)}"})
    assert around["calls"][0]["value"]["to"] == to + "-direct", around  # sent at once
    assert pending() is None  # and nobody was asked
    ROWS["send an IRREVERSIBLE wire"] = (
        f"held until the Approval {approval} was approved (`kubectl patch`), then executed once",
        "direct call with the token: sent at once, no Approval asked for")


def test_a_dropped_session_is_compensated(effector: tuple[Pod, Pod]) -> None:
    safe, leaky = effector
    rel = safe.rel
    # First a charge around the proxy, abandoned too: it has had longer than the other when that one is refunded.
    around = leaky.mcp(("charge", {"amount": 8}), url=UPSTREAM, drop=True,
                       headers={"Authorization": f"Bearer {leaked_token(leaky)}"})["calls"][0]["value"]["id"]
    out = safe.mcp(("charge", {"amount": 7}), drop=True)
    charge = out["calls"][0]["value"]["id"]
    refunds = poll(lambda: [e for e in ledger(rel) if e["payments"] == "refund" and e["charge"] == charge],
                   what=f"the proxy refunding {charge} after the session dropped")
    assert len(refunds) == 1 and refunds[0]["already"] is False, refunds
    assert not [e for e in ledger(rel) if e["payments"] == "refund" and e["charge"] == around]
    ROWS["charge, then abandon the session (crash, hang)"] = (
        f"after {SESSION_IDLE} s idle the proxy refunds the charge, once",
        "a charge made around the proxy and abandoned earlier: never refunded")


def test_zz_print_the_attack_table(effector: tuple[Pod, Pod], capsys: pytest.CaptureFixture[str]) -> None:
    assert len(ROWS) == 9, sorted(ROWS)
    lines = ["| attack from the application container | the example as shipped | with the protections removed |",
             "|---|---|---|", *[f"| {a} | {s} | {b} |" for a, (s, b) in ROWS.items()]]
    with capsys.disabled():
        print("\n" + "\n".join(lines))
