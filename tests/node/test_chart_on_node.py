"""`helm install` on a real node: the operator, the recovery fleet and the trial Redis
run as pods from this tree's images (built with buildah from the Dockerfile), nothing
pulled.

- every pod rolls out and passes its probes; the probe endpoints answer;
- the commands NOTES.txt prints work as printed (a kill switch engaged and lifted, an
  approval decided with the CLI);
- every container runs as its non-root user with a read-only root filesystem;
- the operator talks to the API server with its pod's own ServiceAccount token (the
  audit log names that account for its status writes), which may read its objects and not
  Secrets; an agent pod has no token, and a token minted for its account reads nothing;
- evicting recoveryd pods through the Eviction API honours the PodDisruptionBudget.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from e2e.chart_helpers import CHART
from fixtures.binaries import require_asset
from kubernetes import client
from kubernetes.client.rest import ApiException
from node_support import DEADLINE, Agents, Release, exec_python, notes_commands, pod_http, poll

PROBED = {"operator": ("startupProbe", "livenessProbe", "readinessProbe"),
          "recoveryd": ("startupProbe", "livenessProbe", "readinessProbe"),
          "redis": ("livenessProbe", "readinessProbe")}
IMAGE_OF = {"operator": "agent-saga-operator", "recoveryd": "payments-recoveryd", "redis": "redis"}


def test_install_rolls_out_and_passes_probes(ready_release: Release) -> None:
    rel = ready_release
    for component, replicas in (("operator", 1), ("recoveryd", 2), ("redis", 1)):
        pods = rel.component_pods(component)
        assert len(pods) == replicas, [p["metadata"]["name"] for p in pods]
        for pod in pods:
            conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
            assert conditions["Ready"] == "True", (pod["metadata"]["name"], conditions)
            (container,) = pod["spec"]["containers"]
            assert container["image"] == rel.images[IMAGE_OF[component]].ref
            assert container["imagePullPolicy"] == "Never"
            for probe in PROBED[component]:
                assert probe in container, f"{component} has no {probe}"
            (status,) = pod["status"]["containerStatuses"]
            assert status["ready"] and status["started"], status
    # The probes' endpoints, asked through the API server.
    (operator,) = rel.component_pods("operator")
    status, health = pod_http(rel.cluster, rel.namespace, operator["metadata"]["name"], "/healthz", port=8080)
    assert status == 200, health
    for pod in rel.component_pods("recoveryd"):
        for path in ("/livez", "/readyz"):
            status, body = pod_http(rel.cluster, rel.namespace, pod["metadata"]["name"], path, port=9102)
            assert status == 200, (pod["metadata"]["name"], path, body)
    # Every image was on the node already: the kubelet says so, and never pulled.
    events = json.loads(rel.kubectl("get", "events", "-o", "json").stdout)["items"]
    assert not [e for e in events if e["reason"] == "Pulling"]
    pulled = [e["message"] for e in events if e["reason"] == "Pulled"]
    assert pulled and all("already present on machine" in m for m in pulled), pulled


def test_notes_commands_work_as_printed(ready_release: Release, agents: Agents, tmp_path: Path) -> None:
    rel = ready_release
    commands = notes_commands(rel.notes)
    assert any("<<'EOF'" in c and "kind: KillSwitch" in c for c in commands), commands
    # Something for step 3 to decide: an agent's payout waiting for a human.
    pod = agents.pods()[0]
    saga = agents.http(pod, "/payout", {"amount": 500})["saga"]

    def approval_for_saga() -> str | None:
        items = json.loads(rel.kubectl("get", "approvals", "-o", "json").stdout)["items"]
        names = [a["metadata"]["name"] for a in items if a.get("spec", {}).get("sagaId") == saga]
        return names[0] if names else None

    approval = poll(approval_for_saga, what=f"the Approval of {saga}")
    # kubectl, and the agent-saga CLI of this environment (next to its python).
    path = [str(require_asset("kubectl").parent), str(Path(sys.executable).parent), os.environ.get("PATH", "")]
    with rel.redis() as (_, url):
        env = {"PATH": ":".join(path), "KUBECONFIG": str(rel.cluster.kubeconfig), "HOME": str(tmp_path),
               "AGENT_SAGA_APPROVAL_STORE": url}
        outputs: dict[str, str] = {}
        for command in commands:
            if command.lstrip().startswith("agent-saga approvals approve"):
                key = rel.signing_key(tmp_path / "KEY.pem")  # a trusted key (the operator's, for the test)
                command = command.replace(" ID ", f" {approval} ").replace("NAME", "notes@example.com") \
                    .replace("KEY.pem", str(key))
            if "get killswitches" in command:  # READY True once the operator projected it
                out = poll(lambda c=command: _ran(c, env) if " True " in _ran(c, env) else None,
                           what="the NOTES' kill switch READY True")
            else:
                out = _ran(command, env)
            outputs[command.strip().split("\n")[0]] = out
    printed = "\n".join(outputs)
    for expected in ("get pods", "logs -l", "apply -n", "wait --for=condition=Acknowledged", "get killswitches", "delete killswitch", "get approvals -A",
                     "agent-saga approvals approve", "apply --server-side -f crds/"):
        assert expected in printed, f"NOTES has no `{expected}` command: {commands}"
    pods_out = next(o for c, o in outputs.items() if "get pods" in c)
    for component in ("operator", "recoveryd", "redis"):
        assert f"{rel.name}-{component}" in pods_out and "Running" in pods_out
    assert approval in next(o for c, o in outputs.items() if "get approvals -A" in c)
    # The decision reached the agent: its payout went through.
    poll(lambda: agents.http(pod, "/payouts")[saga]["state"] == "done", what=f"payout {saga} approved and done")


def _ran(command: str, env: dict[str, str]) -> str:
    # In the chart's directory: "kubectl apply --server-side -f crds/" means the chart's crds/.
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, env=env, timeout=120, cwd=CHART)
    assert proc.returncode == 0, f"{command!r} exited {proc.returncode}:\n{proc.stderr}{proc.stdout}"
    return proc.stdout


WRITE_ROOT = """
import json, os
try:
    open("/probe", "w"); root = "writable"
except OSError as e:
    root = e.strerror
open("/tmp/probe", "w").write("ok")
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "root": root}))
"""


def test_containers_run_non_root_with_a_read_only_root(ready_release: Release) -> None:
    rel = ready_release
    for component in ("operator", "recoveryd"):
        for pod in rel.component_pods(component):
            out = exec_python(rel, pod["metadata"]["name"], WRITE_ROOT)
            assert out == {"uid": 65532, "gid": 65532, "root": "Read-only file system"}, (component, out)
    (redis_pod,) = rel.component_pods("redis")
    out = rel.kubectl("exec", redis_pod["metadata"]["name"], "--", "sh", "-c",
                      "id -u; id -g; touch /probe 2>&1 || true").stdout.split("\n")
    assert out[0] == "999" and out[1] == "1000" and "Read-only file system" in out[2], out


# Run inside a recoveryd pod: open a PostgresWAL fleet log (nothing listens on the port).
OPEN_POSTGRES_WAL = """
import json
from agent_saga.recovery.targets import open_fleet_wal
try:
    open_fleet_wal("postgresql://recoveryd@127.0.0.1:9/saga?table=saga_wal")
    print(json.dumps({"error": None}))
except Exception as exc:
    print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
"""


def test_the_recoveryd_image_can_open_a_postgres_log(ready_release: Release) -> None:
    # psycopg is in the image: opening the log gets as far as connecting to the server.
    pod = ready_release.component_pods("recoveryd")[0]["metadata"]["name"]
    error = exec_python(ready_release, pod, OPEN_POSTGRES_WAL)["error"]
    assert error is not None and "Connection refused" in error and "psycopg" not in error, error


# Run inside a pod: the API through the `kubernetes` Service, with the pod's mounted token,
# or with {"token", "ca", "namespace"} given on stdin (a pod that has none mounted).
SA_CALLS = """
import json, os, ssl, sys, urllib.request, urllib.error
d = "/var/run/secrets/kubernetes.io/serviceaccount/"
if os.path.isdir(d):
    token, ns, ca = open(d + "token").read(), open(d + "namespace").read(), d + "ca.crt"
else:
    given = json.load(sys.stdin)
    token, ns, ca = given["token"], given["namespace"], "/tmp/ca.crt"
    open(ca, "w").write(given["ca"])
ctx = ssl.create_default_context(cafile=ca)
def call(method, path, body=None):
    req = urllib.request.Request("https://kubernetes.default.svc" + path, method=method,
                                 data=json.dumps(body).encode() if body else None,
                                 headers={"Authorization": "Bearer " + token, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=20) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, None
_, me = call("POST", "/apis/authentication.k8s.io/v1/selfsubjectreviews",
             {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"})
_, rules = call("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview", "spec": {"namespace": ns}})
paths = {"killswitches": f"/apis/agentsaga.dev/v1alpha1/namespaces/{ns}/killswitches",
         "approvals": f"/apis/agentsaga.dev/v1alpha1/namespaces/{ns}/approvals",
         "secrets": f"/api/v1/namespaces/{ns}/secrets", "configmaps": f"/api/v1/namespaces/{ns}/configmaps",
         "pods": f"/api/v1/namespaces/{ns}/pods", "services": f"/api/v1/namespaces/{ns}/services",
         "namespaces": "/api/v1/namespaces", "nodes": "/api/v1/nodes",
         "cluster-killswitches": "/apis/agentsaga.dev/v1alpha1/killswitches"}
print(json.dumps({"user": me["status"]["userInfo"]["username"],
                  "resources": sorted({r for rule in rules["status"]["resourceRules"] for r in rule.get("resources", [])}),
                  **{k: call("GET", p)[0] for k, p in paths.items()}}))
"""
# What any authenticated account may do (RBAC's system:basic-user and friends).
BASELINE = {"selfsubjectaccessreviews", "selfsubjectrulesreviews", "selfsubjectreviews"}


def test_operator_uses_its_own_service_account_token(ready_release: Release) -> None:
    rel = ready_release
    account = f"system:serviceaccount:{rel.namespace}:{rel.name}-operator"
    (pod,) = rel.component_pods("operator")
    out = exec_python(rel, pod["metadata"]["name"], SA_CALLS)
    assert out["user"] == account
    assert out["killswitches"] == out["approvals"] == 200, out
    # (namespaces: listed and watched in namespaced mode, docs/install.md's RBAC table)
    for denied in ("secrets", "configmaps", "pods", "services", "nodes", "cluster-killswitches"):
        assert out[denied] == 403, (denied, out)
    # The operator reconciles with that token: its status writes are that account's.
    name = "sa-proof"
    rel.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "agentsaga.dev/v1alpha1", "kind": "KillSwitch", "metadata": {"name": name},
        "spec": {"action": "Halt", "scope": {"tool": "sa.proof"}, "reason": "token test", "requestedBy": "e2e"}}))
    try:
        poll(lambda: _ready(rel, name), what=f"KillSwitch {name} Ready")
        node = rel.cluster.node
        if node is not None:
            writers = {e["user"]["username"] for e in _audit(node.audit_log)
                       if e["objectRef"].get("resource") == "killswitches" and e["objectRef"].get("name") == name
                       and e["objectRef"].get("subresource") == "status" and e["verb"] == "patch"
                       and e["responseStatus"]["code"] < 300}
            assert writers == {account}, writers
    finally:
        rel.kubectl("delete", "killswitch", name, "--wait=true", f"--timeout={int(DEADLINE)}s", timeout=DEADLINE)


def test_agent_pod_token_reads_nothing(ready_release: Release, agents: Agents) -> None:
    rel = ready_release
    pod = agents.pods()[0]
    # No token in the pod at all (the chart's agent ServiceAccount does not mount one) ...
    listing = rel.kubectl("exec", pod, "--", "ls", "/var/run/secrets/kubernetes.io/serviceaccount", check=False)
    assert listing.returncode != 0 and "No such file or directory" in listing.stderr, listing
    # ... and one minted for its account, bound to the pod, used from inside it, reads nothing.
    token = rel.kubectl("create", "token", f"{rel.name}-agent", "--bound-object-kind=Pod",
                        f"--bound-object-name={pod}", "--duration=10m").stdout.strip()
    ca = json.loads(rel.kubectl("get", "configmap", "kube-root-ca.crt", "-o", "json").stdout)["data"]["ca.crt"]
    out = exec_python(rel, pod, SA_CALLS, stdin=json.dumps({"token": token, "ca": ca, "namespace": rel.namespace}))
    assert out["user"] == f"system:serviceaccount:{rel.namespace}:{rel.name}-agent"
    for resource in ("killswitches", "approvals", "secrets", "configmaps", "pods", "services", "namespaces",
                     "nodes", "cluster-killswitches"):
        assert out[resource] == 403, (resource, out)
    assert set(out["resources"]) <= BASELINE, out["resources"]


def _ready(rel: Release, name: str) -> bool:
    obj = json.loads(rel.kubectl("get", "killswitch", name, "-o", "json").stdout)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in obj.get("status", {}).get("conditions", []))


def _audit(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_eviction_honours_the_pod_disruption_budget(ready_release: Release) -> None:
    rel = ready_release
    core = client.CoreV1Api(rel.cluster.api_client())
    pdb = f"{rel.name}-recoveryd"

    def allowed() -> int:
        return int(json.loads(rel.kubectl("get", "pdb", pdb, "-o", "json").stdout)["status"].get("disruptionsAllowed", 0))

    poll(lambda: allowed() == 1, what="the PDB to allow one disruption")
    first, second = sorted(p["metadata"]["name"] for p in rel.component_pods("recoveryd"))

    def evict(pod: str) -> None:
        core.create_namespaced_pod_eviction(pod, rel.namespace, client.V1Eviction(
            metadata=client.V1ObjectMeta(name=pod, namespace=rel.namespace)))

    evict(first)
    with pytest.raises(ApiException) as refused:
        evict(second)
    assert refused.value.status == 429 and "disruption budget" in str(refused.value.body), refused.value.body
    # Once the replacement is ready, the budget allows one again.
    poll(lambda: len([p for p in rel.component_pods("recoveryd") if p["metadata"]["name"] != first
                      and all(c["ready"] for c in p["status"].get("containerStatuses", [{"ready": False}]))]) == 2
         and allowed() == 1, what="a ready replacement for the evicted recoveryd pod")
    evict(second)
    rel.wait_ready()
