"""`helm uninstall` on a real node leaves exactly what docs/install.md ("Uninstall") says:
the CRDs and nothing else of the release -- no object labelled with it anywhere, every
pod of it stopped by the kubelet, the namespace back to what Kubernetes puts in any.

A release of its own (not the session's), watching only its namespace, following the
documented steps: delete the projected objects while the operator runs (it removes its
finalizers), then `helm uninstall`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.chart_helpers import CHART_CRDS, docs, labelled
from fixtures.binaries import Image
from fixtures.controlplane import KubeCluster
from node_support import DEADLINE, Release, poll

# What the API server and kube-controller-manager put in every namespace.
EVERY_NAMESPACE = {"serviceaccount/default", "configmap/kube-root-ca.crt"}


@pytest.fixture
def own_release(node: KubeCluster, images: dict[str, Image], tmp_path: Path) -> Iterator[Release]:
    rel = Release(node, images, tmp_path / "helm", name="agent-saga-u", namespace="agent-saga-u")
    rel.install()
    try:
        yield rel
    finally:
        rel.helm.run("uninstall", rel.name, "--namespace", rel.namespace, "--ignore-not-found", check=False)
        node.kubectl("delete", "namespace", rel.namespace, "--wait=false", check=False)


def namespaced_objects(rel: Release) -> set[str]:
    kinds = rel.cluster.kubectl("api-resources", "--verbs=list", "--namespaced=true", "-o", "name").stdout.split()
    kinds = [k for k in kinds if k not in ("events", "events.events.k8s.io")]
    return set(rel.kubectl("get", ",".join(kinds), "-o", "name", "--ignore-not-found").stdout.split())


def test_uninstall_leaves_only_what_the_docs_say(own_release: Release) -> None:
    rel = own_release
    rel.wait_ready()
    rel.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "agentsaga.dev/v1alpha1", "kind": "KillSwitch", "metadata": {"name": "before-uninstall"},
        "spec": {"action": "Halt", "scope": {"tool": "x.y"}, "reason": "uninstall test", "requestedBy": "e2e"}}))
    poll(lambda: "agentsaga.dev/projection" in json.loads(
        rel.kubectl("get", "killswitch", "before-uninstall", "-o", "json").stdout)["metadata"].get("finalizers", []),
        what="the operator's finalizer on the KillSwitch")
    assert labelled(rel.cluster, rel.name)
    # 1. (docs: `-A`; here the release's namespace, other tests' objects are not ours to delete)
    rel.kubectl("delete", "approvals,killswitches,budgetlimits,sagapolicies,modelroutes", "--all", "--wait=true",
                f"--timeout={int(DEADLINE)}s", timeout=DEADLINE + 10)
    # 2. the release
    rel.uninstall()
    assert rel.helm.run("list", "--namespace", rel.namespace, "--all", "-q").stdout.split() == []
    # The Deployments went at once; their pods stop within their grace periods.
    poll(lambda: not json.loads(rel.kubectl("get", "pods", "-o", "json").stdout)["items"],
         what="every pod of the release stopped")
    assert labelled(rel.cluster, rel.name) == []
    assert namespaced_objects(rel) == EVERY_NAMESPACE
    # The CRDs stay (Helm never deletes crds/).
    for crd in (d for p in sorted(CHART_CRDS.glob("*.yaml")) for d in docs(p.read_text())):
        assert rel.cluster.kubectl("get", "crd", crd["metadata"]["name"], "-o", "name").stdout.strip()
