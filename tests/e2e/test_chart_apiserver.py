"""The chart in front of a real kube-apiserver (the local control plane, RBAC on).

- Every rendered object, CRDs included, is accepted by ``kubectl apply --dry-run=server``,
  for the default values and every file in charts/agent-saga/ci/; every pod template is
  admitted as a Pod in a namespace enforcing the ``restricted`` Pod Security Standard.
- ``helm install`` creates every object, ``helm upgrade`` changes what a changed value
  changes (and removes what it no longer renders), ``helm uninstall`` leaves nothing but
  the CRDs.
- RBAC, asked of the API server's authorizer: the operator's ServiceAccount can do
  exactly the verbs it needs and nothing else; recoveryd's and the agents' nothing.
- The operator, run locally with a token the API server minted for the chart's
  ServiceAccount and with the chart's own arguments and environment (expanded as the
  kubelet would), reconciles a KillSwitch, mirrors an agent's approval request into an
  Approval and shows a decision made with the CLI; a standby replica takes over when the
  leader stops. That is the proof that the RBAC the chart grants is sufficient.
- recoveryd, started the same way with no Kubernetes credentials at all, becomes ready;
  the in-chart trial Redis's command and probe work and require its password.

Pods never run here (no scheduler, no kubelet): what the API server can prove is proven;
the ServiceMonitor kind needs the Prometheus Operator's CRDs, which this server does not
have, so ServiceMonitors are validated client-side (test_chart_render.py) and sent to
the server only when their CRD exists.
"""

from __future__ import annotations

import base64
import ctypes
import json
import os
import re
import secrets
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from agent_saga.plane import acl_rules, acl_setuser
from agent_saga_operator.testing import OperatorProcess, install_crds, poll
from chart_helpers import (
    CHART,
    CHART_CRDS,
    CI_PRIORITY_CLASS,
    CI_VALUES,
    CI_WATCH_NAMESPACES,
    Helm,
    container_env,
    crd_plurals,
    docs,
    dump,
    expand,
    labelled,
    of_kind,
    pod_specs,
)
from fixtures.binaries import REPO_ROOT, require_redis_server
from fixtures.controlplane import KubeCluster
from fixtures.procs import free_port
from fixtures.redis_server import RedisServer
from kubernetes import client
from kubernetes.client.rest import ApiException
from redis.backoff import NoBackoff
from redis.retry import Retry

DEADLINE = 30.0  # seconds; typical waits here are well under a second
VALUE_SETS: list[tuple[str, list[Path]]] = [("default", [])] + [(p.stem, [p]) for p in CI_VALUES]
CR_PLURALS = sorted(crd_plurals()["agentsaga.dev"])
# A denial by the authorizer, as kopf logs it (a 403 for a terminating namespace is not one).
RBAC_DENIAL = re.compile(r'forbidden: User \\?"system:serviceaccount:|Not enough permissions', re.I)


# --------------------------------------------------------------------------- fixtures
@pytest.fixture(scope="module")
def cluster(kube: KubeCluster) -> Iterator[KubeCluster]:
    """The cluster with the chart's CRDs installed (validated by a server dry run first),
    the namespaces ci/full-values.yaml watches and the PriorityClass it names."""
    out = kube.kubectl("apply", "--dry-run=server", "--server-side", "--force-conflicts", "-f", str(CHART_CRDS))
    assert out.stdout.count("(server dry run)") == len(docs_in(CHART_CRDS)), out.stdout
    install_crds(kube.kubectl, kube.api_client(), crd_dir=CHART_CRDS)
    kube.kubectl("wait", "--for=condition=Established", "crd/clusterkopfpeerings.kopf.dev",
                 "crd/kopfpeerings.kopf.dev", "--timeout=60s")
    core = client.CoreV1Api(kube.api_client())
    for ns in CI_WATCH_NAMESPACES:
        try:
            core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        except ApiException as e:
            if e.status != 409:
                raise
    sched = client.SchedulingV1Api(kube.api_client())
    try:
        sched.create_priority_class(client.V1PriorityClass(
            metadata=client.V1ObjectMeta(name=CI_PRIORITY_CLASS), value=1000))
    except ApiException as e:
        if e.status != 409:
            raise
    yield kube
    sched.delete_priority_class(CI_PRIORITY_CLASS)


@pytest.fixture
def helm(cluster: KubeCluster, tmp_path: Path) -> Helm:
    return Helm(tmp_path / "helm", cluster.kubeconfig)


def _die_with_parent() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


def docs_in(directory: Path) -> list[dict[str, Any]]:
    return [d for p in sorted(directory.glob("*.yaml")) for d in docs(p.read_text())]


def release_name() -> str:
    # Cluster-scoped names (ClusterRole, ClusterKopfPeering) carry the release name.
    return f"agent-saga-{secrets.token_hex(3)}"


def has_crd(kube: KubeCluster, name: str) -> bool:
    return kube.kubectl("get", "crd", name, "--ignore-not-found", "-o", "name").stdout.strip() != ""


def server_dry_run(kube: KubeCluster, objs: list[dict[str, Any]]) -> str:
    proc = kube.kubectl("apply", "--dry-run=server", "-f", "-", input=dump(objs))
    assert proc.stdout.count("(server dry run)") == len(objs), proc.stdout
    # Deprecations and Pod Security violations come back as warnings: there must be none.
    assert "Warning" not in proc.stderr, proc.stderr
    return proc.stdout


# --------------------------------------------------------------------------- accepted
@pytest.mark.parametrize(("name", "values"), VALUE_SETS, ids=[n for n, _ in VALUE_SETS])
def test_every_rendered_object_is_accepted_by_the_api_server(
    cluster: KubeCluster, helm: Helm, kube_namespace: str, name: str, values: list[Path]
) -> None:
    objs = helm.render(release_name(), kube_namespace, values)
    monitors = of_kind(objs, "ServiceMonitor")
    if monitors and not has_crd(cluster, "servicemonitors.monitoring.coreos.com"):
        # The Prometheus Operator's CRD is not on the local control plane: ServiceMonitors
        # are checked client-side in test_chart_render.py instead of here.
        objs = [o for o in objs if o["kind"] != "ServiceMonitor"]
    server_dry_run(cluster, objs)


@pytest.mark.parametrize(("name", "values"), VALUE_SETS, ids=[n for n, _ in VALUE_SETS])
def test_every_pod_passes_the_restricted_pod_security_standard(
    cluster: KubeCluster, helm: Helm, name: str, values: list[Path]
) -> None:
    core = client.CoreV1Api(cluster.api_client())
    ns = f"psa-{secrets.token_hex(4)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(
        name=ns, labels={"pod-security.kubernetes.io/enforce": "restricted",
                         "pod-security.kubernetes.io/enforce-version": "latest"})))
    try:
        pods = [{"apiVersion": "v1", "kind": "Pod",
                 "metadata": {"name": workload, "namespace": ns}, "spec": spec}
                for workload, spec in pod_specs(helm.render("rel", ns, values))]
        # PodSecurity admission enforces on Pods (a Deployment only warns): these are the
        # pods the Deployments and StatefulSets would create.
        server_dry_run(cluster, pods)
    finally:
        core.delete_namespace(ns)


def test_notes_tell_the_next_commands(cluster: KubeCluster, helm: Helm, kube_namespace: str) -> None:
    out = helm.run("install", release_name(), str(CHART), "--dry-run=server", "--namespace", kube_namespace).stdout
    notes = out.split("NOTES:", 1)[1]
    assert "kind: KillSwitch" in notes and f"kubectl apply -n {kube_namespace} -f -" in notes
    assert "kubectl get approvals -A" in notes and "agent-saga approvals approve" in notes
    assert "kubectl apply --server-side -f crds/" in notes
    assert "without a password" in notes  # the default values have no Redis secret
    # One setting wires an agent pod: the env block agents copy (tests/e2e/test_plane_agents.py runs it).
    for line in ("- name: AGENT_SAGA_REDIS_URL", "- name: AGENT_SAGA_NAMESPACE",
                 "valueFrom: {fieldRef: {fieldPath: metadata.namespace}}", "- name: AGENT_SAGA_AGENT",
                 "- name: AGENT_SAGA_WAL_STREAM"):
        assert line in notes, line
    assert f"kubectl -n {kube_namespace} wait --for=condition=Acknowledged killswitch/halt-wire-send" in notes
    trial = helm.run("install", release_name(), str(CHART), "--dry-run=server", "--namespace", kube_namespace,
                     "--values", str(CHART / "ci" / "inchart-redis-values.yaml")).stdout
    assert "NOT FOR PRODUCTION" in trial.split("NOTES:", 1)[1]
    # Asked for ServiceMonitors on a cluster without the Prometheus Operator: none are
    # created (the install would fail on the unknown kind) and NOTES say why.
    monitored = helm.run("install", release_name(), str(CHART), "--dry-run=server", "--namespace", kube_namespace,
                         "--set", "metrics.serviceMonitor.enabled=true").stdout
    manifest, notes = monitored.split("NOTES:", 1)
    assert "kind: ServiceMonitor" not in manifest
    assert "no ServiceMonitor was created" in " ".join(notes.split())


# --------------------------------------------------------------------------- lifecycle
def _existing(kube: KubeCluster, manifest: str) -> list[str]:
    return kube.kubectl("get", "-f", "-", "--ignore-not-found", "-o", "name", input=manifest).stdout.split()


def test_install_upgrade_uninstall(cluster: KubeCluster, helm: Helm, kube_namespace: str) -> None:
    ns, rel = kube_namespace, release_name()
    apps = client.AppsV1Api(cluster.api_client())
    core = client.CoreV1Api(cluster.api_client())

    helm.run("install", rel, str(CHART), "--namespace", ns)
    manifest = helm.run("get", "manifest", rel, "--namespace", ns).stdout
    expected = helm.render(rel, ns)
    created = _existing(cluster, manifest)
    assert len(created) == len(expected) == len(docs(manifest)), created
    assert sorted(labelled(cluster, rel)) == sorted(created)

    # A changed value changes the object; a value that drops an object deletes it.
    helm.run("upgrade", rel, str(CHART), "--namespace", ns, "--reuse-values",
             "--set", "recoveryd.replicas=3", "--set", "operator.logLevel=DEBUG",
             "--set", "agentServiceAccount.create=false")
    assert apps.read_namespaced_deployment(f"{rel}-recoveryd", ns).spec.replicas == 3
    op = apps.read_namespaced_deployment(f"{rel}-operator", ns).spec.template.spec.containers[0]
    assert "--log-level=DEBUG" in op.args and "--log-level=INFO" not in op.args
    with pytest.raises(ApiException) as exc:
        core.read_namespaced_service_account(f"{rel}-agent", ns)
    assert exc.value.status == 404
    assert "STATUS: deployed" in helm.run("status", rel, "--namespace", ns).stdout

    uninstall(helm, cluster, rel, ns)
    assert _existing(cluster, manifest) == []
    assert labelled(cluster, rel) == []
    assert helm.run("list", "--namespace", ns, "--all", "-q").stdout.split() == []
    # The CRDs stay, as Helm documents (crds/ is never deleted by helm).
    for crd in docs_in(CHART_CRDS):
        assert has_crd(cluster, crd["metadata"]["name"]), crd["metadata"]["name"]


def test_in_chart_redis_password_survives_an_upgrade(cluster: KubeCluster, helm: Helm, kube_namespace: str) -> None:
    ns, rel = kube_namespace, release_name()
    core = client.CoreV1Api(cluster.api_client())
    values = str(CHART / "ci" / "inchart-redis-values.yaml")
    helm.run("install", rel, str(CHART), "--namespace", ns, "--values", values)
    before = core.read_namespaced_secret(f"{rel}-redis", ns).data["redis-password"]
    signing = core.read_namespaced_secret(f"{rel}-approval-signing", ns).data["signing-key.pem"]
    helm.run("upgrade", rel, str(CHART), "--namespace", ns, "--values", values, "--set", "recoveryd.replicas=2")
    assert core.read_namespaced_secret(f"{rel}-redis", ns).data["redis-password"] == before
    # The operator's approval signing key too: agents keep trusting the same key.
    assert core.read_namespaced_secret(f"{rel}-approval-signing", ns).data["signing-key.pem"] == signing
    uninstall(helm, cluster, rel, ns)
    assert labelled(cluster, rel) == []


# --------------------------------------------------------------------------- RBAC
Rule = tuple[str, str, str, str]  # api group, resource[/subresource], resource name ("" any), verb


def _rules(kube: KubeCluster, user: str, namespace: str) -> set[Rule]:
    """What ``user`` may do in ``namespace`` (cluster-wide grants included), per the
    API server: a SelfSubjectRulesReview made while impersonating it."""
    authz = client.AuthorizationV1Api(kube.api_client(user=user))
    review = authz.create_self_subject_rules_review(client.V1SelfSubjectRulesReview(
        spec=client.V1SelfSubjectRulesReviewSpec(namespace=namespace)))
    out: set[Rule] = set()
    for r in review.status.resource_rules:
        for g in r.api_groups or [""]:
            for res in r.resources or []:
                for name in r.resource_names or [""]:
                    for verb in r.verbs:
                        out.add((g, res, name, verb))
    return out


def _allowed(kube: KubeCluster, user: str, verb: str, group: str, resource: str, namespace: str = "",
             name: str = "", subresource: str = "") -> bool:
    sa_ns = user.split(":")[2]
    review = client.V1SubjectAccessReview(spec=client.V1SubjectAccessReviewSpec(
        user=user, groups=["system:serviceaccounts", f"system:serviceaccounts:{sa_ns}", "system:authenticated"],
        resource_attributes=client.V1ResourceAttributes(
            verb=verb, group=group, resource=resource, subresource=subresource or None,
            namespace=namespace or None, name=name or None)))
    return bool(client.AuthorizationV1Api(kube.api_client()).create_subject_access_review(review).status.allowed)


def _wait_allowed(kube: KubeCluster, user: str, *args: str) -> None:
    # The authorizer reads RBAC from an informer: give a fresh binding a moment.
    poll(lambda: _allowed(kube, user, *args), timeout=DEADLINE, what=f"{user} allowed {args}")


def _baseline(kube: KubeCluster, namespace: str) -> set[Rule]:
    """What any authenticated ServiceAccount may do (discovery, self reviews)."""
    return _rules(kube, f"system:serviceaccount:{namespace}:nobody-{secrets.token_hex(3)}", namespace)


def admission_reads(rel: str) -> set[Rule]:
    """The operator reads the approver admission policy and its binding (by name only)."""
    return {("admissionregistration.k8s.io", r, f"{rel}-approver-is-requester", "get")
            for r in ("validatingadmissionpolicies", "validatingadmissionpolicybindings")}


def uninstall(helm: Helm, kube: KubeCluster, rel: str, ns: str, *, check: bool = True) -> None:
    """``helm uninstall``, then wait until the API server stops enforcing the release's
    cluster-wide approver admission policy (a dry-run decision naming someone else by the
    admin is admitted again), so later tests deciding as the admin are not refused."""
    helm.run("uninstall", rel, "--namespace", ns, "--wait", "--timeout", "60s", check=check)
    body = {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "Approval", "metadata": {"name": "uninstall-probe"},
            "spec": {"requestId": "uninstall-probe", "tool": "t", "sagaId": "s", "stepId": "s/0", "rule": "r",
                     "argumentsDigest": "sha256:" + "0" * 64, "requestedAt": "2026-01-01T00:00:00Z",
                     "deadline": "2036-01-01T00:00:00Z", "decision": "Approved", "approver": "probe@corp"}}
    custom = client.CustomObjectsApi(kube.api_client())

    def admitted() -> bool:
        custom.create_namespaced_custom_object("agentsaga.dev", "v1alpha1", ns, "approvals", body, dry_run="All")
        return True
    poll(admitted, timeout=DEADLINE, what=f"the approver admission policy of {rel} no longer enforced")


# The kinds the operator reads one object of (see templates/_operator-rbac.tpl).
READ_BACK = ("killswitches", "sagapolicies", "approvals", "modelroutes")


def operator_needs(peering: str, peering_kind: str) -> set[Rule]:
    """The operator's needs, one rule per verb (see templates/_operator-rbac.tpl)."""
    need: set[Rule] = set()
    for plural in CR_PLURALS:
        need |= {("agentsaga.dev", plural, "", v) for v in ("list", "watch", "patch")}
        need.add(("agentsaga.dev", f"{plural}/status", "", "patch"))
    # The approval bridge mirrors requests into Approvals and re-reads one to reflect a
    # decision; the acknowledgement writer re-reads what it patches from heartbeats.
    need |= {("agentsaga.dev", plural, "", "get") for plural in READ_BACK}
    need.add(("agentsaga.dev", "approvals", "", "create"))
    need.add(("", "events", "", "create"))
    need |= {("kopf.dev", peering_kind, "", v) for v in ("list", "watch")}
    need.add(("kopf.dev", peering_kind, peering, "patch"))
    return need


def _assert_operator_denied_the_dangerous(kube: KubeCluster, user: str, ns: str) -> None:
    for verb, group, resource, namespace, sub in [
        ("get", "", "secrets", ns, ""), ("list", "", "secrets", "", ""), ("list", "", "secrets", ns, ""),
        ("watch", "", "secrets", "", ""),
        ("get", "", "pods", ns, ""), ("list", "", "pods", "", ""), ("create", "", "pods", ns, ""),
        ("delete", "", "pods", ns, ""), ("create", "", "pods", ns, "exec"), ("get", "", "pods", ns, "log"),
        ("get", "", "configmaps", ns, ""), ("create", "", "serviceaccounts", ns, "token"),
        ("get", "coordination.k8s.io", "leases", ns, ""), ("create", "coordination.k8s.io", "leases", ns, ""),
        ("create", "agentsaga.dev", "killswitches", ns, ""), ("delete", "agentsaga.dev", "killswitches", ns, ""),
        ("update", "agentsaga.dev", "killswitches", ns, ""), ("update", "agentsaga.dev", "approvals", ns, "status"),
        ("create", "agentsaga.dev", "budgetlimits", ns, ""), ("get", "agentsaga.dev", "budgetlimits", ns, ""),
        ("delete", "agentsaga.dev", "approvals", ns, ""), ("update", "agentsaga.dev", "approvals", ns, ""),
        ("delete", "", "events", ns, ""), ("list", "", "events", ns, ""),
        ("create", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
        ("update", "apiextensions.k8s.io", "customresourcedefinitions", "", ""),
        ("create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""),
        ("impersonate", "", "users", "", ""), ("create", "apps", "deployments", ns, ""),
    ]:
        assert not _allowed(kube, user, verb, group, resource, namespace, subresource=sub), \
            f"{user} may {verb} {group}/{resource}{'/' + sub if sub else ''} in {namespace or 'the cluster'}"


def test_rbac_cluster_wide_operator_can_exactly_what_it_needs(
    cluster: KubeCluster, helm: Helm, kube_namespace: str
) -> None:
    ns, rel = kube_namespace, release_name()
    helm.run("install", rel, str(CHART), "--namespace", ns)
    try:
        op = f"system:serviceaccount:{ns}:{rel}-operator"
        _wait_allowed(cluster, op, "list", "agentsaga.dev", "killswitches")
        other = f"elsewhere-{secrets.token_hex(3)}"  # any namespace: the grants are cluster-wide
        need = operator_needs(rel, "clusterkopfpeerings")
        need |= {("apiextensions.k8s.io", "customresourcedefinitions", "", v) for v in ("list", "watch")}
        need |= admission_reads(rel)
        assert _rules(cluster, op, other) - _baseline(cluster, other) == need

        # Each need, asked one by one of the authorizer (cluster scope and one namespace).
        for plural in CR_PLURALS:
            for verb in ("list", "watch"):
                assert _allowed(cluster, op, verb, "agentsaga.dev", plural)
            assert _allowed(cluster, op, "patch", "agentsaga.dev", plural, other, name="x")
            assert _allowed(cluster, op, "patch", "agentsaga.dev", plural, other, name="x", subresource="status")
            assert _allowed(cluster, op, "get", "agentsaga.dev", plural, other, name="x") is (plural in READ_BACK)
            mirrored = plural == "approvals"  # only the approval bridge creates
            assert _allowed(cluster, op, "create", "agentsaga.dev", plural, other) is mirrored
        assert _allowed(cluster, op, "create", "", "events", other)
        assert _allowed(cluster, op, "patch", "kopf.dev", "clusterkopfpeerings", name=rel)
        assert not _allowed(cluster, op, "patch", "kopf.dev", "clusterkopfpeerings", name="someone-else")
        assert not _allowed(cluster, op, "list", "", "namespaces")
        _assert_operator_denied_the_dangerous(cluster, op, other)

        # recoveryd and the agents' account: nothing beyond what every account has.
        for sa in (f"{rel}-recoveryd", f"{rel}-agent"):
            user = f"system:serviceaccount:{ns}:{sa}"
            assert _rules(cluster, user, ns) == _baseline(cluster, ns), sa
            for verb, group, resource in [("get", "", "secrets"), ("list", "", "pods"),
                                          ("list", "agentsaga.dev", "killswitches"), ("create", "", "events"),
                                          ("get", "coordination.k8s.io", "leases")]:
                assert not _allowed(cluster, user, verb, group, resource, ns), (sa, verb, resource)
    finally:
        uninstall(helm, cluster, rel, ns)


def test_rbac_namespaced_operator_is_confined_to_its_namespaces(
    cluster: KubeCluster, helm: Helm, kube_namespace: str
) -> None:
    ns, rel = kube_namespace, release_name()
    watched, unwatched = CI_WATCH_NAMESPACES
    helm.run("install", rel, str(CHART), "--namespace", ns, "--set", f"operator.watchNamespaces={{{watched}}}")
    try:
        op = f"system:serviceaccount:{ns}:{rel}-operator"
        _wait_allowed(cluster, op, "list", "agentsaga.dev", "killswitches", watched)
        cluster_reads = {("apiextensions.k8s.io", "customresourcedefinitions", "", v) for v in ("list", "watch")}
        cluster_reads |= {("", "namespaces", "", v) for v in ("list", "watch")}
        cluster_reads |= admission_reads(rel)
        assert _rules(cluster, op, watched) - _baseline(cluster, watched) == \
            operator_needs(rel, "kopfpeerings") | cluster_reads
        assert _rules(cluster, op, unwatched) - _baseline(cluster, unwatched) == cluster_reads
        assert not _allowed(cluster, op, "list", "agentsaga.dev", "killswitches")  # cluster-wide
        assert not _allowed(cluster, op, "patch", "kopf.dev", "clusterkopfpeerings", name=rel)
        _assert_operator_denied_the_dangerous(cluster, op, watched)
        peering = cluster.kubectl("get", "kopfpeering", rel, "-n", watched, "-o", "name").stdout.strip()
        assert peering == f"kopfpeering.kopf.dev/{rel}"
    finally:
        uninstall(helm, cluster, rel, ns)


# --------------------------------------------------------------------------- the operator
def _kubelet_view(kube: KubeCluster, ns: str, container: dict[str, Any], pod: str, index: int,
                  volumes: list[dict[str, Any]] | None = None,
                  root: Path = Path("/nonexistent")) -> tuple[list[str], dict[str, str]]:
    """(args, env) the kubelet would start ``container`` with in pod ``pod``: Secrets read
    from the API server, downward-API fields from the pod's name and index; with the pod's
    ``volumes``, its Secret volumes written under ``root`` (the args point there)."""
    core = client.CoreV1Api(kube.api_client())

    class Secrets(dict[tuple[str, str], str]):
        def __missing__(self, ref: tuple[str, str]) -> str:
            return base64.b64decode(core.read_namespaced_secret(ref[0], ns).data[ref[1]]).decode()

    env = container_env(container, Secrets(), {
        "metadata.name": pod, "metadata.labels['apps.kubernetes.io/pod-index']": str(index)})
    args = [expand(a, env) for a in container["args"]]
    if volumes is None:
        return args, env
    # Secret volumes: their files, written where the container mounts them (under ``root``).
    by_name = {v["name"]: v for v in volumes}
    for mount in container.get("volumeMounts") or ():
        secret = by_name[mount["name"]].get("secret")
        if secret is None:
            continue
        local = root / mount["mountPath"].lstrip("/")
        local.mkdir(parents=True, exist_ok=True)
        for key, value in (core.read_namespaced_secret(secret["secretName"], ns).data or {}).items():
            (local / key).write_bytes(base64.b64decode(value))
            (local / key).chmod(0o400)
        args = [a.replace(mount["mountPath"], str(local)) for a in args]
    return args, env


def _token_kubeconfig(kube: KubeCluster, ns: str, sa: str, path: Path) -> Path:
    """A kubeconfig authenticating with a token the API server mints for ``ns/sa``."""
    token = kube.kubectl("create", "token", sa, "-n", ns, "--duration=3600s").stdout.strip()
    kc = yaml.safe_load(kube.kubeconfig.read_text())
    ctx = next(c for c in kc["contexts"] if c["name"] == kc["current-context"])
    kc["users"] = [{"name": "chart-operator", "user": {"token": token}}]
    ctx["context"]["user"] = "chart-operator"
    path.write_text(json.dumps(kc))
    path.chmod(0o600)
    who = kube.kubectl("--kubeconfig", str(path), "auth", "whoami", "-o", "json").stdout
    assert json.loads(who)["status"]["userInfo"]["username"] == f"system:serviceaccount:{ns}:{sa}"
    return path


def _request_approval(url: str, namespace: str) -> str:
    """An approval request as an agent's ApprovalGateway writes it (RedisApprovalStore)."""
    from agent_saga.controls import ApprovalRequest, RedisApprovalStore
    from agent_saga.controls.approvals import action_digest

    store = RedisApprovalStore(url)
    now = time.time()
    request = ApprovalRequest(
        id=secrets.token_hex(16), saga_id="saga-chart", step_id="saga-chart/0", tool="wire.send",
        rule="irreversible", reason="chart e2e", arguments_digest=action_digest("wire.send", {"amount": 5}, "1"),
        policy_version="1", requested_at=now, deadline=now + 300, display={"amount": "5"}, namespace=namespace,
        agent="chart-e2e", arguments={"amount": 5})
    try:
        _, created = store.create(request)
        assert created
    finally:
        store.close()
    return request.id


def _logs_clean(*ops: OperatorProcess) -> None:
    for op in ops:
        text = op.log_path.read_text(errors="replace")
        bad = [line for line in text.splitlines() if RBAC_DENIAL.search(line)]
        assert not bad, "RBAC denials in the operator log:\n" + "\n".join(bad[:10])


def test_operator_with_the_chart_service_account_reconciles_a_killswitch(
    cluster: KubeCluster, helm: Helm, kube_namespace: str, redis_server_factory: Any, tmp_path: Path
) -> None:
    ns, rel = kube_namespace, release_name()
    core = client.CoreV1Api(cluster.api_client())
    custom = client.CustomObjectsApi(cluster.api_client())
    # The policy plane behind a password, kept in a Secret as the chart requires.
    password = secrets.token_hex(16)
    server: RedisServer = redis_server_factory()
    assert server.command("CONFIG", "SET", "requirepass", password).startswith(b"+OK")
    core.create_namespaced_secret(ns, client.V1Secret(
        metadata=client.V1ObjectMeta(name="policy-plane"), string_data={"redis-password": password}))
    # Two operator replicas: a StatefulSet whose pods take priority -<index>.
    helm.run("install", rel, str(CHART), "--namespace", ns, "--set", "operator.replicas=2",
             "--set", "redis.host=127.0.0.1", "--set", f"redis.port={server.port}",
             "--set", "redis.auth.existingSecret=policy-plane")
    sts = json.loads(cluster.kubectl("get", "statefulset", f"{rel}-operator", "-n", ns, "-o", "json").stdout)
    pod = sts["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert container["command"] == ["python", "-m", "agent_saga_operator"]
    kubeconfig = _token_kubeconfig(cluster, ns, pod["serviceAccountName"], tmp_path / "operator.kubeconfig")

    def replica(index: int) -> OperatorProcess:
        args, env = _kubelet_view(cluster, ns, container, f"{rel}-operator-{index}", index, pod["volumes"],
                                  tmp_path / f"pod-{index}")
        assert f"--priority=-{index}" in args and f"--peering={rel}" in args  # "-0" parses as 0
        args = [a for a in args if not a.startswith(("--health-port=", "--metrics-port="))]  # free ports instead
        return OperatorProcess(kubeconfig, env["AGENT_SAGA_REDIS_URL"], tmp_path / f"operator-{index}.log",
                               extra_args=[*args, "--health-host", "127.0.0.1", "--retry-delay", "0.5"],
                               env={**os.environ, **env})

    leader, standby = replica(0), replica(1)
    demo = f"demo-{secrets.token_hex(3)}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=demo)))
    r = redis.Redis.from_url(leader.env["AGENT_SAGA_REDIS_URL"], decode_responses=True)
    try:
        leader.start().wait_ready()
        standby.start().wait_ready()
        poll(lambda: "Pausing operations in favour of" in standby.log_path.read_text(), timeout=DEADLINE,
             what="the standby (priority -1) pauses in favour of the leader")
        peers = poll(lambda: (s := custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", rel)
                              .get("status") or {}) and len(s) == 2 and s, timeout=DEADLINE,
                     what="both replicas' keep-alives in the chart's ClusterKopfPeering")
        assert {p["priority"] for p in peers.values()} == {0, -1}
        assert set(peers) == {f"{rel}-operator-0", f"{rel}-operator-1"}  # POD_ID from the pod name

        ks = {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "KillSwitch", "metadata": {"name": "halt-wires"},
              "spec": {"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "chart e2e",
                       "requestedBy": "ci@example.com"}}
        custom.create_namespaced_custom_object("agentsaga.dev", "v1alpha1", demo, "killswitches", ks)

        def ready(name: str) -> dict[str, Any] | None:
            obj = custom.get_namespaced_custom_object("agentsaga.dev", "v1alpha1", demo, "killswitches", name)
            conds = {c["type"]: c for c in (obj.get("status") or {}).get("conditions") or ()}
            # Projected; no agent runs here, so nothing applies it: Ready=False, NoConsumer.
            return obj if conds.get("Ready", {}).get("reason") == "NoConsumer" else None

        try:
            obj = poll(lambda: ready("halt-wires"), timeout=DEADLINE, what="KillSwitch projected, NoConsumer")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- leader log ---\n{leader.log()}") from None
        assert obj["status"]["engaged"] is True and obj["status"]["observedGeneration"] == 1
        key = f"agentsaga:v1:killswitch:{demo}/halt-wires"
        assert json.loads(r.get(key))["scope"] == "tool:wire.send"  # type: ignore[arg-type]
        # kopf posts Events from a queue, after the status patch: wait for it, as a user would.
        poll(lambda: ("Normal", "NoConsumer") in {
            (e.type, e.reason)
            for e in core.list_namespaced_event(demo, field_selector="involvedObject.name=halt-wires").items},
            timeout=DEADLINE, what="the Normal NoConsumer Event on the KillSwitch")

        # The approval bridge: a request an agent wrote to Redis becomes an Approval (create),
        # and a decision made with the CLI shows on it (get + status patch).
        request_id = _request_approval(leader.env["AGENT_SAGA_REDIS_URL"], demo)

        def approval(phase: str | None) -> dict[str, Any] | None:
            try:
                obj = custom.get_namespaced_custom_object("agentsaga.dev", "v1alpha1", demo, "approvals", request_id)
            except ApiException as e:
                if e.status == 404:
                    return None
                raise
            return obj if phase is None or (obj.get("status") or {}).get("phase") == phase else None

        try:
            mirrored = poll(lambda: approval(None), timeout=DEADLINE, what="the request mirrored as an Approval")
            assert mirrored["spec"]["tool"] == "wire.send"
            # A denial: the chart's operator publishes its signing key, so the CLI refuses an
            # unsigned approval (agents would ignore it); a denial needs no signature.
            cli = subprocess.run(
                [sys.executable, "-m", "agent_saga.cli", "approvals", "deny", request_id, "--approver", "risk@corp"],
                capture_output=True, text=True, timeout=60,
                env={**os.environ, "AGENT_SAGA_APPROVAL_STORE": leader.env["AGENT_SAGA_REDIS_URL"]})
            assert cli.returncode == 0, cli.stderr
            decided = poll(lambda: approval("Denied"), timeout=DEADLINE, what="the CLI's decision on the Approval")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- leader log ---\n{leader.log()}") from None
        assert decided["status"]["approver"] == "risk@corp"

        # The leader stops (and removes its keep-alive): the standby resumes and handles
        # the deletion, removing the document and its finalizer.
        leader.stop()
        poll(lambda: "Resuming operations after the pause" in standby.log_path.read_text(), timeout=DEADLINE,
             what="the standby resumes when the leader is gone")
        custom.delete_namespaced_custom_object("agentsaga.dev", "v1alpha1", demo, "killswitches", "halt-wires")

        def gone() -> bool:
            try:
                custom.get_namespaced_custom_object("agentsaga.dev", "v1alpha1", demo, "killswitches", "halt-wires")
            except ApiException as e:
                return e.status == 404
            return False

        try:
            poll(gone, timeout=DEADLINE, what="KillSwitch deleted (finalizer removed by the standby)")
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- standby log ---\n{standby.log()}") from None
        assert r.get(key) is None
        standby.stop()
        _logs_clean(leader, standby)
        peers = custom.get_cluster_custom_object("kopf.dev", "v1", "clusterkopfpeerings", rel).get("status") or {}
        assert not peers, f"keep-alives left behind: {peers}"
    finally:
        leader.stop()
        standby.stop()
        r.close()
        core.delete_namespace(demo)
        uninstall(helm, cluster, rel, ns, check=False)


def test_recoveryd_with_the_chart_arguments_becomes_ready(
    cluster: KubeCluster, helm: Helm, kube_namespace: str, redis_server_factory: Any, tmp_path: Path
) -> None:
    """recoveryd needs no Kubernetes credentials at all: started with the Deployment's own
    arguments and environment (the password from the Secret), it serves /readyz."""
    ns, rel = kube_namespace, release_name()
    core = client.CoreV1Api(cluster.api_client())
    password = secrets.token_hex(16)
    server: RedisServer = redis_server_factory(appendonly=True)
    assert server.command("CONFIG", "SET", "requirepass", password).startswith(b"+OK")
    core.create_namespaced_secret(ns, client.V1Secret(
        metadata=client.V1ObjectMeta(name="policy-plane"), string_data={"redis-password": password}))
    helm.run("install", rel, str(CHART), "--namespace", ns, "--set", "redis.host=127.0.0.1",
             "--set", f"redis.port={server.port}", "--set", "redis.auth.existingSecret=policy-plane")
    try:
        dep = json.loads(cluster.kubectl("get", "deployment", f"{rel}-recoveryd", "-n", ns, "-o", "json").stdout)
        pod = dep["spec"]["template"]["spec"]
        assert pod["automountServiceAccountToken"] is False
        container = pod["containers"][0]
        args, env = _kubelet_view(cluster, ns, container, f"{rel}-recoveryd-abc12", 0)
        port_file = tmp_path / "port"
        args = [a for a in args if not a.startswith("--metrics-port=")]
        args += ["--metrics-port=0", f"--port-file={port_file}", "--bind=127.0.0.1"]
        child_env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"} | env
        child_env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT / "recoveryd"), str(REPO_ROOT / "runtime"), child_env.get("PYTHONPATH", "")])
        log = tmp_path / "recoveryd.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen([sys.executable, "-m", "agent_saga_recoveryd", *args], env=child_env,
                                    stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                    preexec_fn=_die_with_parent)
        try:
            port = poll(lambda: port_file.exists() and port_file.read_text().strip(), timeout=DEADLINE,
                        what="recoveryd serving")

            def get(path: str) -> int:
                try:
                    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                        return int(r.status)
                except urllib.error.HTTPError as e:
                    return int(e.code)

            try:
                poll(lambda: get("/readyz") == 200, timeout=DEADLINE, what="recoveryd /readyz 200")
            except AssertionError as e:
                raise AssertionError(f"{e}\n{log.read_text(errors='replace')}") from None
            assert get("/livez") == 200
        finally:
            proc.terminate()  # SIGTERM: drain, then exit 0
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        assert proc.returncode == 0, log.read_text(errors="replace")
        assert password not in log.read_text(errors="replace")  # logs show redis://:***@
    finally:
        uninstall(helm, cluster, rel, ns, check=False)


def test_in_chart_redis_command_requires_its_password(helm: Helm, tmp_path: Path) -> None:
    """NOT FOR PRODUCTION, but it must work: the trial Redis's shell command and readiness
    probe, run with this machine's redis-server (paths and port moved into tmp_path)."""
    redis_bin = require_redis_server()
    objs = helm.render("rel", "agent-saga", [CHART / "ci" / "inchart-redis-values.yaml"])
    c = next(s for w, s in pod_specs(objs) if w.endswith("-redis"))["containers"][0]
    scratch, data, port = tmp_path / "tmp", tmp_path / "data", free_port()
    scratch.mkdir()
    data.mkdir()
    script = (c["args"][0].replace("/tmp/", f"{scratch}/").replace("--dir /data", f"--dir {data}")
              .replace("--port 6379", f"--port {port}").replace("exec redis-server", f"exec {redis_bin}"))
    password, agent_pw, approver_pw = secrets.token_hex(20), secrets.token_hex(20), secrets.token_hex(20)
    env = {"PATH": f"{redis_bin.parent}:{os.environ.get('PATH', '')}", "REDIS_PASSWORD": password,
           "AGENT_PASSWORD": agent_pw, "APPROVER_PASSWORD": approver_pw}
    proc = subprocess.Popen([*c["command"], script], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent)
    try:
        probe = [*c["readinessProbe"]["exec"]["command"][:2],
                 c["readinessProbe"]["exec"]["command"][2].replace("-p 6379", f"-p {port}")]
        poll(lambda: subprocess.run(probe, env=env, timeout=5).returncode == 0, timeout=DEADLINE,
             what="the readiness probe passes")
        assert (scratch / "redis.conf").stat().st_mode & 0o077 == 0  # the password file is private
        anonymous = redis.Redis(port=port, retry=Retry(NoBackoff(), 0))  # refused once, not retried
        with pytest.raises(redis.AuthenticationError):
            anonymous.ping()
        anonymous.close()
        authed = redis.Redis(port=port, password=password)
        assert authed.ping() is True
        # The least-privilege users: the agent reads the policy plane and cannot write a
        # kill switch document; the approver (the CLI) can.
        authed.set("agentsaga:v1:killswitch:ns/halt", "{}")
        agent = redis.Redis(port=port, username="agent-saga-agent", password=agent_pw)
        assert agent.get("agentsaga:v1:killswitch:ns/halt") == b"{}"
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.delete("agentsaga:v1:killswitch:ns/halt")
        with pytest.raises(redis.exceptions.NoPermissionError):
            agent.eval("return 1", 0)
        approver = redis.Redis(port=port, username="agent-saga-approver", password=approver_pw)
        assert approver.set("agentsaga:v1:killswitch:ns/halt", "{}") is True
        rules = {u.split(" ", 2)[1]: u for u in (x.decode() for x in authed.execute_command("ACL", "LIST"))}
        assert set(rules) == {"default", "agent-saga-agent", "agent-saga-approver"}
        # ... exactly the runtime's rules (with the chart's RedisWAL keys), as Redis normalises them.
        for role, kw in (("agent", {"wal_keys": ("agent-saga:wal",)}), ("approver", {})):
            authed.execute_command(*acl_setuser(f"probe-{role}", acl_rules(role, **kw), password=secrets.token_hex(8)))
            probe = next(x.decode() for x in authed.execute_command("ACL", "LIST") if x.startswith(b"user probe-"
                                                                                                  + role.encode()))
            strip = lambda line: " ".join(t for t in line.split(" ")[2:] if not t.startswith("#"))  # noqa: E731
            assert strip(probe) == strip(rules[f"agent-saga-{role}"]), role
        for c in (agent, approver):
            c.close()
        authed.close()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(10)
