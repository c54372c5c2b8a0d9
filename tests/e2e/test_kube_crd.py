"""CustomResourceDefinitions on a real API server: schema, CEL, /status, watch, finalizer.

Everything the operator's CRDs rely on (DESIGN.md §5), checked against kube-apiserver
itself rather than a model of it.
"""

from __future__ import annotations

import json
import queue
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fixtures.controlplane import KubeCluster
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

VERSION = "v1alpha1"
PLURAL = "budgets"
RULE_MESSAGE = "warnAt must not exceed limit"
FINALIZER = "e2e.agentsaga.dev/cleanup"


def _crd(group: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{PLURAL}.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": PLURAL, "singular": "budget", "kind": "Budget", "listKind": "BudgetList"},
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [
                        {"name": "Limit", "type": "integer", "jsonPath": ".spec.limit"},
                        {"name": "Phase", "type": "string", "jsonPath": ".status.phase"},
                    ],
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["limit", "warnAt"],
                                    "properties": {
                                        "limit": {"type": "integer", "minimum": 0},
                                        "warnAt": {"type": "integer", "minimum": 0},
                                        "mode": {"type": "string", "enum": ["enforce", "audit"]},
                                    },
                                    "x-kubernetes-validations": [
                                        {"rule": "self.warnAt <= self.limit", "message": RULE_MESSAGE}
                                    ],
                                },
                                "status": {
                                    "type": "object",
                                    "properties": {
                                        "observedGeneration": {"type": "integer"},
                                        "phase": {"type": "string"},
                                    },
                                },
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def crd_group(kube: KubeCluster) -> Iterator[str]:
    # A group unique to this run: CRDs are cluster-scoped, and a --kubeconfig cluster is shared.
    group = f"e2e{secrets.token_hex(3)}.agentsaga.dev"
    name = f"{PLURAL}.{group}"
    kube.kubectl("apply", "-f", "-", input=json.dumps(_crd(group)))
    kube.kubectl("wait", "--for=condition=Established", f"crd/{name}", "--timeout=60s")
    # Established means the group is served; the discovery/REST mapping may lag a moment.
    api = client.CustomObjectsApi(kube.api_client())
    deadline = time.monotonic() + 30
    while True:
        try:
            api.list_cluster_custom_object(group, VERSION, PLURAL)
            break
        except ApiException as e:
            if e.status != 404 or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    yield group
    kube.kubectl("delete", f"crd/{name}", "--wait=false", check=False)


def _budget(
    group: str, name: str, limit: int, warn_at: int, finalizers: list[str] | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if finalizers:
        meta["finalizers"] = finalizers
    return {
        "apiVersion": f"{group}/{VERSION}",
        "kind": "Budget",
        "metadata": meta,
        "spec": {"limit": limit, "warnAt": warn_at, "mode": "enforce"},
    }


def test_invalid_object_is_refused_with_the_rules_message(
    kube: KubeCluster, crd_group: str, kube_namespace: str
) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    bad = _budget(crd_group, "too-low", limit=10, warn_at=50)
    with pytest.raises(ApiException) as exc:
        api.create_namespaced_custom_object(crd_group, VERSION, kube_namespace, PLURAL, bad)
    assert exc.value.status == 422
    assert RULE_MESSAGE in str(exc.value.body)

    # kubectl shows the same refusal, naming the field.
    proc = kube.kubectl("apply", "-n", kube_namespace, "-f", "-", input=json.dumps(bad), check=False)
    assert proc.returncode != 0
    assert RULE_MESSAGE in proc.stderr and "spec" in proc.stderr

    # The structural schema is enforced too (enum, minimum).
    bad2 = _budget(crd_group, "bad-mode", limit=10, warn_at=5)
    bad2["spec"]["mode"] = "sometimes"
    with pytest.raises(ApiException) as exc:
        api.create_namespaced_custom_object(crd_group, VERSION, kube_namespace, PLURAL, bad2)
    assert exc.value.status == 422
    assert "spec.mode" in str(exc.value.body)


def _watch(
    api: client.CustomObjectsApi, group: str, namespace: str, resource_version: str,
    events: queue.Queue[dict[str, Any]], stop: threading.Event,
) -> None:
    w = watch.Watch()
    try:
        for ev in w.stream(
            api.list_namespaced_custom_object, group, VERSION, namespace, PLURAL,
            resource_version=resource_version, timeout_seconds=60,
        ):
            events.put(ev)
            if stop.is_set() or ev["type"] == "DELETED":
                break
    finally:
        w.stop()


def _next_event(events: queue.Queue[dict[str, Any]], what: str, timeout: float = 30) -> dict[str, Any]:
    try:
        return events.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"no watch event for {what} within {timeout}s") from None


def test_status_subresource_watch_and_finalizer(
    kube: KubeCluster, crd_group: str, kube_namespace: str
) -> None:
    api = client.CustomObjectsApi(kube.api_client())
    args = (crd_group, VERSION, kube_namespace, PLURAL)
    body = _budget(crd_group, "daily", limit=50_000, warn_at=40_000, finalizers=[FINALIZER])
    created = api.create_namespaced_custom_object(*args, body)
    assert created["metadata"]["generation"] == 1
    assert "status" not in created

    events: queue.Queue[dict[str, Any]] = queue.Queue()
    stop = threading.Event()
    # A second client for the watch thread: ApiClient pools are not for sharing across
    # a long-poll and concurrent requests.
    watch_api = client.CustomObjectsApi(kube.api_client())
    t = threading.Thread(
        target=_watch,
        args=(watch_api, crd_group, kube_namespace, created["metadata"]["resourceVersion"], events, stop),
        daemon=True,
    )
    t.start()
    try:
        # The main resource ignores status (status subresource semantics) ...
        api.patch_namespaced_custom_object(*args, "daily", {"status": {"phase": "Sneaky"}})
        assert "status" not in api.get_namespaced_custom_object(*args, "daily")

        # ... and /status takes it, without bumping the generation.
        patched = api.patch_namespaced_custom_object_status(
            *args, "daily", {"status": {"phase": "Ready", "observedGeneration": 1}}
        )
        assert patched["status"] == {"phase": "Ready", "observedGeneration": 1}
        assert patched["metadata"]["generation"] == 1

        # The watch sees the change arrive.
        while True:
            ev = _next_event(events, "the status patch")
            if ev["object"].get("status", {}).get("phase") == "Ready":
                break
        assert ev["type"] == "MODIFIED"

        # A spec change bumps the generation; the printer columns show limit and phase.
        api.patch_namespaced_custom_object(*args, "daily", {"spec": {"limit": 60_000}})
        assert api.get_namespaced_custom_object(*args, "daily")["metadata"]["generation"] == 2
        table = kube.kubectl("get", f"{PLURAL}.{crd_group}", "-n", kube_namespace).stdout
        assert "LIMIT" in table and "PHASE" in table and "60000" in table and "Ready" in table

        # Delete: the finalizer holds the object, marked for deletion ...
        api.delete_namespaced_custom_object(*args, "daily")
        held = api.get_namespaced_custom_object(*args, "daily")
        assert held["metadata"].get("deletionTimestamp")
        assert held["metadata"]["finalizers"] == [FINALIZER]

        # ... until the finalizer is removed (what the operator does after undoing its
        # projection); then it is gone, and the watch says so.
        api.patch_namespaced_custom_object(*args, "daily", {"metadata": {"finalizers": None}})
        while True:
            ev = _next_event(events, "the deletion")
            if ev["type"] == "DELETED":
                break
        assert ev["object"]["metadata"]["name"] == "daily"
        with pytest.raises(ApiException) as exc:
            api.get_namespaced_custom_object(*args, "daily")
        assert exc.value.status == 404
    finally:
        stop.set()
        t.join(timeout=70)
    assert not t.is_alive()
