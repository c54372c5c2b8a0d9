"""kubectl and helm, the binaries hack/build-control-plane.sh provides, against the cluster."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from fixtures.binaries import read_versions, require_asset
from fixtures.controlplane import KubeCluster
from kubernetes import client


def test_kubectl_get_ns_with_the_written_kubeconfig(kube: KubeCluster) -> None:
    kubectl = require_asset("kubectl")
    # Exactly what a person runs: the binary and the kubeconfig file, nothing else.
    proc = subprocess.run(
        [str(kubectl), "--kubeconfig", str(kube.kubeconfig), "get", "ns"],
        capture_output=True, text=True, timeout=60, env={"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent"},
    )
    assert proc.returncode == 0, proc.stderr
    header, *rows = proc.stdout.splitlines()
    assert header.split()[:2] == ["NAME", "STATUS"]
    names = {r.split()[0] for r in rows}
    assert {"default", "kube-system", "kube-public"} <= names


def test_server_version_is_the_pinned_one(kube: KubeCluster) -> None:
    out = json.loads(kube.kubectl("version", "-o", "json").stdout)
    if kube.local:
        assert out["serverVersion"]["gitVersion"] == read_versions()["KUBE_VERSION"]
    assert out["serverVersion"]["major"] == "1"


def test_helm_installs_upgrades_and_uninstalls_a_chart(
    kube: KubeCluster, kube_namespace: str, tmp_path: Path
) -> None:
    helm = require_asset("helm")
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {{ .Release.Name }}-probe\n"
        "data:\n  greeting: {{ .Values.greeting | quote }}\n"
    )
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "HELM_CACHE_HOME": str(tmp_path / "helm-cache"),
        "HELM_CONFIG_HOME": str(tmp_path / "helm-config"),
        "HELM_DATA_HOME": str(tmp_path / "helm-data"),
        "KUBECONFIG": str(kube.kubeconfig),
    }

    def run(*args: str) -> str:
        proc = subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stderr}"
        return proc.stdout

    assert run("version", "--short").startswith(read_versions()["HELM_VERSION"])
    core = client.CoreV1Api(kube.api_client())

    run("install", "rel", str(chart), "-n", kube_namespace)
    assert core.read_namespaced_config_map("rel-probe", kube_namespace).data == {"greeting": "hello"}

    run("upgrade", "rel", str(chart), "-n", kube_namespace, "--set", "greeting=bonjour")
    assert core.read_namespaced_config_map("rel-probe", kube_namespace).data == {"greeting": "bonjour"}
    assert "rel" in run("list", "-n", kube_namespace, "-q").split()

    run("uninstall", "rel", "-n", kube_namespace, "--wait")
    names = [cm.metadata.name for cm in core.list_namespaced_config_map(kube_namespace).items]
    assert "rel-probe" not in names
