"""`kubectl saga` through the real kubectl binary against the real API server: kubectl
finds the `kubectl-saga` plugin on PATH (a wrapper running `python -m agent_saga.kubectl`,
what the console script does), and the plugin acts as the kubeconfig's user (`--as`
impersonates, as kubectl's flag does), so RBAC and admission decide.

- halt makes the KillSwitch the operator projects (its spec, then the real operator's
  document in Redis and `status.engaged`), a real agent process refuses the tool and
  `status` shows it acknowledging; halting again finds it; resume deletes it, and leaves
  one applied from a manifest alone, naming how to lift it; the agent runs again once
  both are gone.
- `-A` (on a control plane of its own: it writes into every namespace) halts in each
  namespace and resume -A lifts them all.
- quarantine and drain make the objects their flags say; a combination the kill switch
  refuses never reaches the cluster.
- approvals: an approver (a Role like the chart's approver role) lists and approves as
  themselves (the approver is the user the API server authenticated); a user without the
  role gets a message naming the missing permission; the chart's admission policy refuses
  a decision naming someone else, and the message says so.
- status shows what is in force, and help lists the commands with examples.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, install_crds, poll
from fixtures.binaries import REPO_ROOT, require_asset
from fixtures.controlplane import ControlPlane, KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_approval_proof import POLICY, decide
from test_approval_proof import admission as chart_admission
from test_metrics_exported import sample
from test_plane_agents import PlaneAgent, plane_env, until_call

admission = chart_admission  # the chart's approver admission policy and roles, applied (a fixture)

pytestmark = pytest.mark.e2e
NS_PREFIX = "kplug"
DEADLINE = 20.0  # seconds: generous for a loaded 2-core machine


@pytest.fixture
def saga_env(crds: KubeCluster, tmp_path: Path) -> dict[str, str]:
    """PATH with the real kubectl and a `kubectl-saga` plugin; KUBECONFIG the cluster's."""
    return plugin_env(crds, tmp_path)


def plugin_env(kube: KubeCluster, tmp_path: Path) -> dict[str, str]:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    plugin = bindir / "kubectl-saga"
    plugin.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m agent_saga.kubectl "$@"\n')
    plugin.chmod(0o755)
    kubectl = require_asset("kubectl")
    path = os.pathsep.join([str(bindir), str(kubectl.parent), os.environ.get("PATH", "")])
    pythonpath = os.pathsep.join([str(REPO_ROOT / "runtime"), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PATH": path, "KUBECONFIG": str(kube.kubeconfig), "PYTHONPATH": pythonpath,
            "HOME": str(tmp_path)}


def saga(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    """`kubectl saga ARGS` through the kubectl binary (plugin discovery on PATH)."""
    return subprocess.run([str(require_asset("kubectl")), "saga", *args], env=env, capture_output=True, text=True,
                          timeout=90)


def co(kube: KubeCluster) -> Any:
    return client.CustomObjectsApi(kube.api_client())


def items(kube: KubeCluster, ns: str, plural: str) -> list[dict[str, Any]]:
    return list(co(kube).list_namespaced_custom_object(GROUP, VERSION, ns, plural)["items"])


def gone(kube: KubeCluster, ns: str, plural: str, name: str) -> bool:
    try:
        co(kube).get_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
    except ApiException as e:
        return e.status == 404
    return False


def whoami(kube: KubeCluster) -> str:
    return kube.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout.strip()


@pytest.fixture
def operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    op = OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--resync-interval", "2", "--retry-delay", "0.5",
                                     "--ack-interval", "0.5", "--health-host", "127.0.0.1"])
    op.start()
    try:
        op.wait_ready()
        yield op
    finally:
        op.stop()


# --------------------------------------------------------------------------- help
def test_kubectl_finds_the_plugin_and_its_help_lists_commands_with_examples(saga_env: dict[str, str]) -> None:
    listed = subprocess.run([str(require_asset("kubectl")), "plugin", "list"], env=saga_env, capture_output=True,
                            text=True, timeout=60)
    assert "kubectl-saga" in listed.stdout, listed.stdout + listed.stderr
    top = saga(saga_env, "--help")
    assert top.returncode == 0, top.stderr
    for command in ("status", "halt", "drain", "quarantine", "resume", "approvals"):
        assert f"\n    {command} " in top.stdout, command
    assert "examples:\n  kubectl saga status -n payments" in top.stdout
    sub = saga(saga_env, "approvals", "approve", "--help")
    assert sub.returncode == 0 and "examples:\n  kubectl saga approvals approve af83c011" in sub.stdout


# --------------------------------------------------------------------------- kill switch
@pytest.fixture
def agent(fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[PlaneAgent]:
    """A real agent process wired by AGENT_SAGA_REDIS_URL for ``ns`` (no Kubernetes access),
    keeping a heartbeat the operator counts."""
    a = PlaneAgent(plane_env(fresh_redis.url, ns, "payments-agent", "pod-1"), tmp_path / "agent")
    try:
        yield a
    finally:
        a.close()


def test_halt_makes_the_killswitch_the_operator_projects_and_resume_deletes_it(
    crds: KubeCluster, ns: str, saga_env: dict[str, str], operator: OperatorProcess, fresh_redis: RedisServer,
    agent: PlaneAgent,
) -> None:
    r = redis.Redis.from_url(fresh_redis.url, decode_responses=True)
    try:
        assert agent.call("wire.send")["ok"]
        run = saga(saga_env, "halt", "--scope", "tool:wire.send", "--reason", "fraud pattern", "--ttl", "10m",
                   "-n", ns)
        assert run.returncode == 0, run.stderr
        assert f"engaged HALT tool:wire.send in namespace {ns} by {whoami(crds)}" in run.stdout
        (obj,) = items(crds, ns, "killswitches")
        name = obj["metadata"]["name"]
        assert obj["spec"] == {"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "fraud pattern",
                               "requestedBy": whoami(crds), "ttlSeconds": 600}
        assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "kubectl-saga"}
        # The operator read it: the lever is in the policy plane, as agents read it.
        doc = json.loads(poll(lambda: r.get(f"agentsaga:v1:killswitch:{ns}/{name}"), timeout=DEADLINE,
                              what="the KillSwitch projected into Redis"))
        assert (doc["action"], doc["scope"], doc["requestedBy"], doc["ttl"]) == ("Halt", "tool:wire.send",
                                                                                 whoami(crds), 600)
        poll(lambda: (co(crds).get_namespaced_custom_object(GROUP, VERSION, ns, "killswitches", name)
                      .get("status") or {}).get("engaged"), timeout=DEADLINE, what="status.engaged")
        # The agent obeys it, and status says so (from the agent's heartbeat, via the operator).
        refused = until_call(agent, False, "wire.send")
        assert "fraud pattern" in refused["error"], refused
        assert agent.call("search_docs")["ok"]
        acked = poll(lambda: (lambda out: out if "agents 1/1 acknowledged" in out else None)(
            saga(saga_env, "status", "-n", ns).stdout), timeout=DEADLINE, what="status: the agent acknowledges")
        assert f"{name}: HALT tool:wire.send engaged" in acked

        again = saga(saga_env, "halt", "--scope", "tool:wire.send", "--reason", "twice", "-n", ns)
        assert again.returncode == 1 and f"already engaged: HALT tool:wire.send in namespace {ns}" in again.stdout
        assert len(items(crds, ns, "killswitches")) == 1

        status = saga(saga_env, "status", "-n", ns)
        assert status.returncode == 0, status.stderr
        assert f"{name}: HALT tool:wire.send engaged" in status.stdout and "fraud pattern" in status.stdout

        # One on the same scope applied from a manifest: resume deletes only its own.
        manual = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "KillSwitch", "metadata": {"name": "from-git"},
                  "spec": {"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "reviewed halt",
                           "requestedBy": "soc@corp"}}
        crds.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps(manual))
        resumed = saga(saga_env, "resume", "--scope", "tool:wire.send", "-n", ns)
        assert resumed.returncode == 1, resumed.stderr
        assert f"lifted HALT tool:wire.send in namespace {ns}" in resumed.stdout
        assert f"kubectl saga resume --name from-git -n {ns}" in resumed.stdout
        poll(lambda: gone(crds, ns, "killswitches", name), timeout=DEADLINE, what="the KillSwitch deleted")
        poll(lambda: r.get(f"agentsaga:v1:killswitch:{ns}/{name}") is None, timeout=DEADLINE,
             what="the lever removed from Redis")
        assert not gone(crds, ns, "killswitches", "from-git")

        assert not agent.call("wire.send")["ok"]  # from-git still halts
        by_name = saga(saga_env, "resume", "--name", "from-git", "-n", ns)
        assert by_name.returncode == 0 and "lifted HALT tool:wire.send" in by_name.stdout, by_name.stderr
        poll(lambda: gone(crds, ns, "killswitches", "from-git"), timeout=DEADLINE, what="from-git deleted")
        until_call(agent, True, "wire.send")
        nothing = saga(saga_env, "resume", "--scope", "tool:wire.send", "-n", ns)
        assert nothing.returncode == 1 and "no KillSwitch on scope tool:wire.send" in nothing.stdout
    finally:
        r.close()


def test_quarantine_and_drain_make_what_their_flags_say(crds: KubeCluster, ns: str,
                                                        saga_env: dict[str, str]) -> None:
    q = saga(saga_env, "quarantine", "saga-8f3c", "--reason", "suspected duplicate charges", "--by", "soc@corp",
             "-n", ns)
    assert q.returncode == 0, q.stderr
    d = saga(saga_env, "drain", "--scope", "tag:eu", "--reason", "EU maintenance", "--ttl", "90", "-n", ns)
    assert d.returncode == 0, d.stderr
    specs = {o["spec"]["action"]: o["spec"] for o in items(crds, ns, "killswitches")}
    assert specs == {
        "Quarantine": {"action": "Quarantine", "scope": {"sagaId": "saga-8f3c"},
                       "reason": "suspected duplicate charges", "requestedBy": "soc@corp"},
        "Drain": {"action": "Drain", "scope": {"tag": "eu"}, "reason": "EU maintenance",
                  "requestedBy": whoami(crds), "ttlSeconds": 90},
    }
    # A drain by tool is refused before anything reaches the cluster.
    bad = saga(saga_env, "drain", "--scope", "tool:wire.send", "--reason", "x", "-n", ns)
    assert bad.returncode == 2 and "DRAIN" in bad.stderr and "Traceback" not in bad.stderr
    assert len(items(crds, ns, "killswitches")) == 2
    lifted = saga(saga_env, "resume", "--scope", "saga:saga-8f3c", "-n", ns)
    assert lifted.returncode == 0 and "lifted QUARANTINE saga:saga-8f3c" in lifted.stdout, lifted.stderr
    assert [o["spec"]["action"] for o in items(crds, ns, "killswitches")] == ["Drain"]


@pytest.fixture(scope="module")
def own_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    """A control plane for `-A` alone: it writes into every namespace, which the shared
    cluster's other tests must never see."""
    cp = ControlPlane(tmp_path_factory.mktemp("kplug-all"))
    try:
        cp.start()
        kube = cp.cluster()
        install_crds(kube.kubectl, kube.api_client())
        yield kube
        kube.close()
    finally:
        cp.stop()


def test_all_namespaces_halts_in_each_and_resume_lifts_them_all(own_cluster: KubeCluster, tmp_path: Path) -> None:
    kube = own_cluster
    for name in ("payments", "refunds"):
        kube.kubectl("create", "namespace", name)
    env = plugin_env(kube, tmp_path)
    run = saga(env, "halt", "--scope", "tag:eu", "--reason", "EU bank outage", "-A")
    assert run.returncode == 0, run.stderr
    namespaces = {n.metadata.name for n in client.CoreV1Api(kube.api_client()).list_namespace().items}
    assert {"payments", "refunds", "default"} <= namespaces

    def everywhere() -> dict[str, dict[str, Any]]:
        out = co(kube).list_cluster_custom_object(GROUP, VERSION, "killswitches")["items"]
        return {o["metadata"]["namespace"]: o for o in out}
    made = everywhere()
    assert set(made) == namespaces
    assert {(o["metadata"]["name"], json.dumps(o["spec"], sort_keys=True)) for o in made.values()} == {
        (made["payments"]["metadata"]["name"], json.dumps({"action": "Halt", "scope": {"tag": "eu"},
                                                          "reason": "EU bank outage", "requestedBy": whoami(kube)},
                                                         sort_keys=True))}
    status = saga(env, "status", "-A")
    assert f"payments/{made['payments']['metadata']['name']}: HALT tag:eu" in status.stdout, status.stdout

    lifted = saga(env, "resume", "--scope", "tag:eu", "-A")
    assert lifted.returncode == 0 and lifted.stdout.count("lifted HALT tag:eu") == len(namespaces), lifted.stderr
    assert everywhere() == {}


def test_a_user_without_the_role_is_told_what_is_missing(crds: KubeCluster, ns: str,
                                                         saga_env: dict[str, str]) -> None:
    run = saga(saga_env, "halt", "--reason", "stop", "-n", ns, "--as", "eve@corp")
    assert run.returncode == 1, run.stderr
    assert f"forbidden: you cannot create killswitches in namespace {ns}" in run.stderr
    assert "RoleBinding" in run.stderr and "Traceback" not in run.stderr
    assert items(crds, ns, "killswitches") == []
    # status shows what the user may read and names what they may not.
    grant_approver(crds, ns, "eve@corp")
    status = saga(saga_env, "status", "-n", ns, "--as", "eve@corp")
    assert status.returncode == 1, status.stderr
    assert f"kill switches: cannot be read: forbidden: you cannot list killswitches in namespace {ns}" in status.stdout
    assert "approvals: 0 pending, 0 decided or expired" in status.stdout


# --------------------------------------------------------------------------- approvals
def make_approval(kube: KubeCluster, ns: str, name: str, **spec: Any) -> None:
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Approval", "metadata": {"name": name},
            "spec": {"requestId": name, "tool": "wire.send", "sagaId": "s-1", "stepId": "s-1/0", "rule": "irreversible",
                     "reason": "Action cannot be undone", "display": {"amount": "80000"},
                     "argumentsDigest": "sha256:" + "a" * 64, "requestedAt": "2026-01-01T00:00:00Z",
                     "deadline": "2036-01-01T00:00:00Z", **spec}}
    co(kube).create_namespaced_custom_object(GROUP, VERSION, ns, "approvals", body)


def grant_approver(kube: KubeCluster, ns: str, user: str) -> None:
    """What the chart's <release>-approver ClusterRole grants, as a Role in ``ns``."""
    rbac = client.RbacAuthorizationV1Api(kube.api_client())
    rbac.create_namespaced_role(ns, client.V1Role(
        metadata=client.V1ObjectMeta(name="approver"),
        rules=[client.V1PolicyRule(api_groups=[GROUP], resources=["approvals"],
                                   verbs=["get", "list", "watch", "patch", "update"])]))
    rbac.create_namespaced_role_binding(ns, client.V1RoleBinding(
        metadata=client.V1ObjectMeta(name="approver"),
        role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="approver"),
        subjects=[client.RbacV1Subject(kind="User", name=user, api_group="rbac.authorization.k8s.io")]))


def spec_of(kube: KubeCluster, ns: str, name: str) -> dict[str, Any]:
    return dict(co(kube).get_namespaced_custom_object(GROUP, VERSION, ns, "approvals", name)["spec"])


def test_an_approver_decides_as_themselves_and_others_are_refused(crds: KubeCluster, ns: str,
                                                                  saga_env: dict[str, str]) -> None:
    grant_approver(crds, ns, "risk@corp")
    make_approval(crds, ns, "af83c011" + "0" * 24)
    make_approval(crds, ns, "b7d2e900" + "0" * 24)
    make_approval(crds, ns, "c0ffee00" + "0" * 24, passkeyRequired=True)

    listed = saga(saga_env, "approvals", "list", "-n", ns, "--as", "risk@corp")
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.count("[PENDING] wire.send -- Action cannot be undone") == 3
    assert "amount: 80000" in listed.stdout and "agent-saga approvals sign c0ffee00" in listed.stdout

    # A unique prefix is enough; the approver defaults to the user the API server authenticated.
    ok = saga(saga_env, "approvals", "approve", "af83c0", "--note", "verified by phone", "-n", ns, "--as", "risk@corp")
    assert ok.returncode == 0, ok.stderr
    assert f"approved approval {ns}/af83c011" in ok.stdout and "as risk@corp" in ok.stdout
    spec = spec_of(crds, ns, "af83c011" + "0" * 24)
    assert (spec["decision"], spec["approver"], spec["note"]) == ("Approved", "risk@corp", "verified by phone")

    again = saga(saga_env, "approvals", "deny", "af83c011", "-n", ns, "--as", "risk@corp")
    assert again.returncode == 1 and "already decided: Approved by risk@corp" in again.stdout
    passkey = saga(saga_env, "approvals", "approve", "c0ffee00", "-n", ns, "--as", "risk@corp")
    assert passkey.returncode == 1 and "agent-saga approvals sign" in passkey.stderr
    assert "decision" not in spec_of(crds, ns, "c0ffee00" + "0" * 24)

    # No approver role: RBAC refuses, and the message names what is missing.
    eve = saga(saga_env, "approvals", "approve", "b7d2e900", "-n", ns, "--as", "eve@corp")
    assert eve.returncode == 1, eve.stderr
    assert f"forbidden: you cannot get approval b7d2e900 in namespace {ns}" in eve.stderr
    assert "RoleBinding" in eve.stderr and "Traceback" not in eve.stderr
    assert "decision" not in spec_of(crds, ns, "b7d2e900" + "0" * 24)

    denied = saga(saga_env, "approvals", "deny", "b7d2e900", "--note", "not this one", "-n", ns, "--as", "risk@corp")
    assert denied.returncode == 0, denied.stderr
    assert spec_of(crds, ns, "b7d2e900" + "0" * 24)["decision"] == "Denied"
    missing = saga(saga_env, "approvals", "approve", "ffff", "-n", ns, "--as", "risk@corp")
    assert missing.returncode == 1 and "no Approval 'ffff'" in missing.stderr

    status = saga(saga_env, "status", "-n", ns)
    assert "approvals: 1 pending, 2 decided or expired" in status.stdout, status.stdout


def test_the_admission_policy_refuses_a_decision_naming_someone_else(ns: str, saga_env: dict[str, str],
                                                                      request: pytest.FixtureRequest) -> None:
    """The chart's approver admission policy, as rendered: `--approver cfo@corp` by another
    approver is refused with the policy's sentence; the default (yourself) is admitted."""
    admission: KubeCluster = request.getfixturevalue("admission")
    grant_approver(admission, ns, "mallory@corp")
    name = "d00d0000" + "0" * 24
    make_approval(admission, ns, name)

    def refused() -> ApiException | None:
        e = decide(admission, ns, name, as_user="mallory@corp", approver="cfo@corp", dry_run=True)
        return e if e is not None and e.status == 403 and POLICY in str(e.body) else None
    poll(refused, timeout=DEADLINE, what="the admission policy in force")

    run = saga(saga_env, "approvals", "approve", "d00d", "--approver", "cfo@corp", "-n", ns, "--as", "mallory@corp")
    assert run.returncode == 1, run.stderr
    assert "refused by the cluster's admission policy" in run.stderr
    assert "spec.approver must be the user making the decision (mallory@corp)" in run.stderr
    assert "decision" not in spec_of(admission, ns, name)
    ok = saga(saga_env, "approvals", "approve", "d00d", "-n", ns, "--as", "mallory@corp")
    assert ok.returncode == 0, ok.stderr
    assert spec_of(admission, ns, name)["approver"] == "mallory@corp"


# --------------------------------------------------------------------------- load shedding
class SheddingLevel:
    """API Priority and Fairness set up to refuse one user's requests on demand, for real.

    A FlowSchema sends the user's configmaps and agentsaga.dev requests to a priority level
    with no seats of its own (`nominalConcurrencyShares: 0`, nothing lent or borrowed,
    `Reject`). The API server still admits one request at a time there; `hold()` makes that
    request a list of a few megabytes of ConfigMaps whose response nobody reads, so the API
    server blocks writing it and keeps executing it, and every other request of the user is
    refused with 429 and `Retry-After` until `release()` closes the connection.
    """

    def __init__(self, kube: KubeCluster, ns: str, user: str) -> None:
        self.kube, self.ns, self.user, self.name = kube, ns, user, f"saga-shed-{ns}"
        self._held: Any = None  # the unread response that keeps executing, and its client
        self._api: Any = None

    def __enter__(self) -> SheddingLevel:
        flow = client.FlowcontrolApiserverV1Api(self.kube.api_client())
        flow.create_priority_level_configuration(client.V1PriorityLevelConfiguration(
            metadata=client.V1ObjectMeta(name=self.name),
            spec=client.V1PriorityLevelConfigurationSpec(type="Limited", limited=client.V1LimitedPriorityLevelConfiguration(
                nominal_concurrency_shares=0, lendable_percent=0, borrowing_limit_percent=0,
                limit_response=client.V1LimitResponse(type="Reject")))))
        every = {"verbs": ["*"], "namespaces": ["*"], "cluster_scope": True}
        flow.create_flow_schema(client.V1FlowSchema(
            metadata=client.V1ObjectMeta(name=self.name),
            spec=client.V1FlowSchemaSpec(
                priority_level_configuration=client.V1PriorityLevelConfigurationReference(name=self.name),
                matching_precedence=50, distinguisher_method=client.V1FlowDistinguisherMethod(type="ByUser"),
                rules=[client.V1PolicyRulesWithSubjects(
                    subjects=[client.FlowcontrolV1Subject(kind="User", user=client.V1UserSubject(name=self.user))],
                    resource_rules=[client.V1ResourcePolicyRule(api_groups=[""], resources=["configmaps"], **every),
                                    client.V1ResourcePolicyRule(api_groups=[GROUP], resources=["*"], **every)])])))
        core = client.CoreV1Api(self.kube.api_client())
        for i in range(12):  # ~11 MB: more than both ends' socket buffers hold
            core.create_namespaced_config_map(self.ns, client.V1ConfigMap(
                metadata=client.V1ObjectMeta(name=f"bulk-{i}"), data={"bulk": "x" * 900_000}))
        rbac = client.RbacAuthorizationV1Api(self.kube.api_client())
        rbac.create_namespaced_role(self.ns, client.V1Role(
            metadata=client.V1ObjectMeta(name="bulk-reader"),
            rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"], verbs=["list"])]))
        rbac.create_namespaced_role_binding(self.ns, client.V1RoleBinding(
            metadata=client.V1ObjectMeta(name="bulk-reader"),
            role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role", name="bulk-reader"),
            subjects=[client.RbacV1Subject(kind="User", name=self.user, api_group="rbac.authorization.k8s.io")]))
        # The API server reads FlowSchemas from an informer: wait until it classifies by ours.
        as_user = client.CustomObjectsApi(self.kube.api_client(user=self.user))

        def classified() -> bool:
            as_user.list_namespaced_custom_object(GROUP, VERSION, self.ns, "approvals")
            return self.counter("dispatched_requests_total") is not None

        poll(classified, timeout=DEADLINE, what="the API server to classify the user's requests by the FlowSchema")
        return self

    def counter(self, name: str) -> int | None:
        """The API server's ``apiserver_flowcontrol_<name>`` for this priority level."""
        value = sample(self.kube.kubectl("get", "--raw", "/metrics").stdout, f"apiserver_flowcontrol_{name}",
                       priority_level=self.name)
        return None if value is None else int(value)

    def hold(self) -> None:
        """Take the level's one place to execute and keep it (the response is never read)."""
        from kubernetes import config

        configuration = client.Configuration()
        config.load_kube_config(config_file=str(self.kube.kubeconfig), client_configuration=configuration)
        configuration.socket_options = [(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)]  # a small window
        self._api = client.ApiClient(configuration)
        self._api.set_default_header("Impersonate-User", self.user)
        self._held = client.CoreV1Api(self._api).list_namespaced_config_map(self.ns, _preload_content=False)
        # Requests, not seats: once the API server's storage statistics (refreshed about once a
        # minute) have seen ConfigMaps this big, it estimates the list at up to 10 seats (a level
        # that rejects has no smaller cap), and admits it anyway because nothing else executes.
        poll(lambda: self.counter("current_executing_requests") == 1, timeout=DEADLINE,
             what="the held list to keep executing in the priority level")

    def release(self) -> None:
        if self._held is not None:
            self._held.close()
            self._api.close()
            self._held = self._api = None

    def __exit__(self, *exc: object) -> None:
        self.release()
        flow = client.FlowcontrolApiserverV1Api(self.kube.api_client())
        flow.delete_flow_schema(self.name)
        flow.delete_priority_level_configuration(self.name)
        client.CoreV1Api(self.kube.api_client()).delete_collection_namespaced_config_map(self.ns)


def test_a_read_the_api_server_sheds_is_asked_again_when_it_says(crds: KubeCluster, ns: str,
                                                                 saga_env: dict[str, str]) -> None:
    """As kubectl: a 429 with Retry-After is not the answer; the read is asked again, up to
    10 times, after the wait the API server names."""
    user = f"busy-{ns}@corp"
    grant_approver(crds, ns, user)
    make_approval(crds, ns, "af83c011" + "1" * 24)
    with SheddingLevel(crds, ns, user) as level:
        level.hold()
        before = level.counter("rejected_requests_total") or 0
        run = subprocess.Popen([str(require_asset("kubectl")), "saga", "approvals", "list", "-n", ns, "--as", user],
                               env=saga_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            # Five refusals: one more than urllib3's own default would wait out (3 retries).
            poll(lambda: (level.counter("rejected_requests_total") or 0) >= before + 5, timeout=DEADLINE,
                 what="the API server to refuse the plugin's list five times")
            assert run.poll() is None, run.communicate()  # refused, and still waiting to ask again
            level.release()
            out, err = run.communicate(timeout=60)
        finally:
            run.kill()
    assert run.returncode == 0, err
    assert "[PENDING] wire.send" in out and "af83c011" in out


def test_a_read_refused_every_time_fails_after_ten_waits_and_says_what_to_do(
        crds: KubeCluster, ns: str, saga_env: dict[str, str]) -> None:
    user = f"busy-{ns}@corp"
    grant_approver(crds, ns, user)
    with SheddingLevel(crds, ns, user) as level:
        level.hold()
        before = level.counter("rejected_requests_total") or 0
        run = saga(saga_env, "approvals", "list", "-n", ns, "--as", user)
        refused = (level.counter("rejected_requests_total") or 0) - before
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert refused == 11, refused  # the list, then 10 more times after the wait the server named
    assert f"the API server is shedding load: it refused to list approvals in namespace {ns} (HTTP 429" in run.stderr
    assert "kubectl get flowschemas,prioritylevelconfigurations" in run.stderr and "Traceback" not in run.stderr
