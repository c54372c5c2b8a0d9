"""The chart's effector helper (charts/agent-saga/templates/_effector.tpl) renders, for a
user's own chart that depends on agent-saga, exactly the agent pod of
examples/k8s/effector/agent.yaml (which tests/node/test_effector_on_node.py runs on a real
node): the proxy as a native sidecar holding both credentials, the application container
holding none. A missing setting fails the render naming it."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import CHART, Helm, docs
from fixtures.binaries import REPO_ROOT

EXAMPLE = REPO_ROOT / "examples" / "k8s" / "effector" / "agent.yaml"
IMAGE = "ghcr.io/agent-saga/agent-saga-recoveryd:0.1.0"
SETTINGS = {"image": IMAGE, "agent": "effector-agent", "name": "payments",
            "upstream": "http://payments-mcp:8000/mcp", "credentialsSecret": "payments-mcp-token",
            "upstreamsConfigMap": "effector-mcp-upstreams",
            "credentialItems": [{"key": "token", "path": "payments-token"}]}

# A user's Deployment: everything agent-saga renders comes from the three includes.
USER_TEMPLATE = """\
{{- $e := .Values.effector }}
apiVersion: apps/v1
kind: Deployment
metadata:
  name: effector-agent
spec:
  template:
    spec:
      serviceAccountName: agent-saga-agent
      terminationGracePeriodSeconds: 10
      {{- include "agent-saga.effectorPodSettings" $e | nindent 6 }}
      initContainers:
        {{- include "agent-saga.effectorSidecar" $e | nindent 8 }}
      containers:
        {{- toYaml .Values.app | nindent 8 }}
      volumes:
        {{- include "agent-saga.effectorVolumes" $e | nindent 8 }}
        - name: app-tmp
          emptyDir:
            sizeLimit: 64Mi
"""


def example_pod() -> dict[str, Any]:
    (deploy,) = [d for d in yaml.safe_load_all(EXAMPLE.read_text()) if d and d["kind"] == "Deployment"]
    return dict(deploy["spec"]["template"]["spec"])


@pytest.fixture(scope="module")
def user_chart(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("user-chart") / "my-agents"
    (root / "templates").mkdir(parents=True)
    shutil.copytree(CHART, root / "charts" / "agent-saga")
    (root / "Chart.yaml").write_text(yaml.safe_dump({"apiVersion": "v2", "name": "my-agents", "version": "1.0.0"}))
    (root / "templates" / "agent.yaml").write_text(USER_TEMPLATE)
    (root / "values.yaml").write_text(yaml.safe_dump({"effector": SETTINGS, "app": example_pod()["containers"]}))
    return root


def render(helm: Helm, chart: Path, *sets: str) -> tuple[dict[str, Any] | None, str]:
    args = ["template", "rel", str(chart), "--namespace", "agent-saga"]
    for s in sets:
        args += ["--set", s]
    proc = helm.run(*args, check=False)
    if proc.returncode != 0:
        return None, proc.stderr
    (deploy,) = [d for d in docs(proc.stdout) if d["kind"] == "Deployment" and d["metadata"]["name"] == "effector-agent"]
    return deploy["spec"]["template"]["spec"], ""


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(tmp_path_factory.mktemp("helm"))


def test_the_helper_renders_the_example_pod(helm: Helm, user_chart: Path) -> None:
    pod, err = render(helm, user_chart)
    assert pod is not None, err
    assert pod == example_pod()


def test_the_rendered_pod_keeps_every_credential_in_the_proxy(helm: Helm, user_chart: Path) -> None:
    pod, err = render(helm, user_chart)
    assert pod is not None, err
    (proxy,), (app,) = pod["initContainers"], pod["containers"]
    assert proxy["restartPolicy"] == "Always"  # a native sidecar
    assert "--listen=127.0.0.1:8931" in proxy["command"]
    assert pod["automountServiceAccountToken"] is False and pod["shareProcessNamespace"] is False
    secret_volumes = {v["name"] for v in pod["volumes"] if "secret" in v}
    assert secret_volumes == {"agent-saga-credentials"}
    assert secret_volumes <= {m["name"] for m in proxy["volumeMounts"]}
    assert not secret_volumes & {m["name"] for m in app.get("volumeMounts", [])}
    assert [e["name"] for e in proxy["env"] if "secretKeyRef" in e.get("valueFrom", {})] == ["REDIS_AGENT_PASSWORD"]
    assert not [e for e in app.get("env", []) if "valueFrom" in e or "redis" in str(e.get("value", ""))]
    assert app["securityContext"]["runAsUser"] != proxy["securityContext"]["runAsUser"]
    assert pod["securityContext"]["fsGroup"] == proxy["securityContext"]["runAsGroup"]


def test_settings_change_what_they_name(helm: Helm, user_chart: Path) -> None:
    pod, err = render(helm, user_chart, "effector.port=9000", "effector.proxyUser=4242",
                      "effector.redisHost=redis.plane.svc:6380", "effector.policy=team-a/payments")
    assert pod is not None, err
    proxy = pod["initContainers"][0]
    assert "--listen=127.0.0.1:9000" in proxy["command"] and "--policy-from-plane=team-a/payments" in proxy["command"]
    assert "('127.0.0.1', 9000)" in proxy["startupProbe"]["exec"]["command"][-1]
    assert proxy["securityContext"]["runAsUser"] == pod["securityContext"]["fsGroup"] == 4242
    env = {e["name"]: e.get("value") for e in proxy["env"]}
    assert env["AGENT_SAGA_REDIS_URL"] == "redis://agent-saga-agent:$(REDIS_AGENT_PASSWORD)@redis.plane.svc:6380/0"


@pytest.mark.parametrize("key", ["image", "agent", "name", "upstream", "credentialsSecret", "upstreamsConfigMap"])
def test_a_missing_setting_fails_naming_it(helm: Helm, user_chart: Path, key: str) -> None:
    values = yaml.safe_load((user_chart / "values.yaml").read_text())
    chart = user_chart.parent / f"without-{key}"
    if not chart.exists():
        shutil.copytree(user_chart, chart)
    bare = copy.deepcopy(values)
    del bare["effector"][key]
    (chart / "values.yaml").write_text(yaml.safe_dump(bare))
    pod, err = render(helm, chart)
    assert pod is None and f"set {key} (" in err, err
