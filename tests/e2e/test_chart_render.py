"""The chart renders, lints strictly, and says what DESIGN.md section 5 asks, before any
API server sees it: ``helm lint --strict`` and ``helm template`` with the default values
and with every file in charts/agent-saga/ci/ (together they set every option), the strict
values.schema.json refusing typos and passwords, and the security properties every pod
must have. (tests/e2e/test_chart_apiserver.py puts the same renders in front of a real
kube-apiserver, and checks NOTES.txt: helm renders it only against a cluster.)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from chart_helpers import (
    CHART,
    CI_VALUES,
    Helm,
    container_env,
    crd_plurals,
    env_of,
    expand,
    of_kind,
    one,
    pod_specs,
)
from fixtures.monitoring import DASHBOARD, RULES

VALUE_SETS: list[tuple[str, list[Path]]] = [("default", [])] + [(p.stem, [p]) for p in CI_VALUES]
SERVICE_MONITOR_API = "monitoring.coreos.com/v1/ServiceMonitor"


@pytest.fixture(scope="module")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(tmp_path_factory.mktemp("helm"))


@pytest.fixture(scope="module")
def renders(helm: Helm) -> dict[str, list[dict[str, Any]]]:
    # Rendered for a cluster that serves the Prometheus Operator's ServiceMonitor.
    return {name: helm.render("rel", "agent-saga", values, api_versions=(SERVICE_MONITOR_API,))
            for name, values in VALUE_SETS}


def test_ci_values_cover_every_option() -> None:
    assert {p.stem for p in CI_VALUES} >= {"full-values", "inchart-redis-values", "url-secret-values"}


@pytest.mark.parametrize(("name", "values"), VALUE_SETS, ids=[n for n, _ in VALUE_SETS])
def test_helm_lint_strict(helm: Helm, name: str, values: list[Path]) -> None:
    args = ["lint", "--strict", str(CHART)]
    for v in values:
        args += ["--values", str(v)]
    out = helm.run(*args).stdout
    assert "1 chart(s) linted, 0 chart(s) failed" in out
    assert "[WARNING]" not in out and "[ERROR]" not in out, out


def test_default_values_render_the_documented_objects(renders: dict[str, list[dict[str, Any]]]) -> None:
    objs = renders["default"]
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in objs)
    assert kinds == sorted([
        ("ClusterKopfPeering", "rel-agent-saga"),
        ("ClusterRole", "rel-agent-saga-approver"),
        ("ClusterRole", "rel-agent-saga-break-glass"),
        ("ClusterRole", "rel-agent-saga-operator"),
        ("ClusterRoleBinding", "rel-agent-saga-operator"),
        ("ConfigMap", "rel-agent-saga-approval-keys"),
        ("ConfigMap", "rel-agent-saga-dashboard"),
        ("Role", "rel-agent-saga-approval-keys"),
        ("RoleBinding", "rel-agent-saga-approval-keys"),
        ("Secret", "rel-agent-saga-approval-signing"),
        ("ValidatingAdmissionPolicy", "rel-agent-saga-approver-is-requester"),
        ("ValidatingAdmissionPolicyBinding", "rel-agent-saga-approver-is-requester"),
        ("Deployment", "rel-agent-saga-operator"),
        ("Deployment", "rel-agent-saga-recoveryd"),
        ("PodDisruptionBudget", "rel-agent-saga-recoveryd"),
        ("Service", "rel-agent-saga-operator"),
        ("Service", "rel-agent-saga-recoveryd"),
        ("ServiceAccount", "rel-agent-saga-agent"),
        ("ServiceAccount", "rel-agent-saga-operator"),
        ("ServiceAccount", "rel-agent-saga-recoveryd"),
    ])
    # No Secret but the operator's approval signing key (generated: no value in values.yaml),
    # and no ServiceMonitor unless asked for.
    assert [s["metadata"]["name"] for s in of_kind(objs, "Secret")] == ["rel-agent-saga-approval-signing"]
    assert set(of_kind(objs, "Secret")[0]["data"]) == {"signing-key.pem"}
    assert not of_kind(objs, "ServiceMonitor")
    assert one(objs, "Deployment", "operator")["spec"]["replicas"] == 1
    recoveryd = one(objs, "Deployment", "recoveryd")
    assert recoveryd["spec"]["replicas"] == 2
    anti = recoveryd["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    term = anti["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "recoveryd"
    pdb = one(objs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": recoveryd["spec"]["selector"]}
    # The keys agents mount (AGENT_SAGA_APPROVAL_KEYS): the operator writes the published
    # ones into it, with get + patch on that one ConfigMap and nothing else.
    args = one(objs, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--approval-keys-configmap=agent-saga/rel-agent-saga-approval-keys" in args
    role = one(objs, "Role", "approval-keys")
    assert role["metadata"]["namespace"] == "agent-saga" and role["rules"] == [
        {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["rel-agent-saga-approval-keys"],
         "verbs": ["get", "patch"]}]


@pytest.mark.parametrize("name", [n for n, _ in VALUE_SETS])
def test_every_pod_is_non_root_read_only_and_unprivileged(renders: dict[str, list[dict[str, Any]]], name: str) -> None:
    specs = pod_specs(renders[name])
    assert specs
    for workload, spec in specs:
        pod_sc = spec.get("securityContext") or {}
        assert pod_sc.get("runAsNonRoot") is True, workload
        assert pod_sc.get("seccompProfile") == {"type": "RuntimeDefault"}, workload
        assert spec.get("hostNetwork") is not True and spec.get("hostPID") is not True, workload
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, workload
            assert sc["allowPrivilegeEscalation"] is False, workload
            assert sc["capabilities"] == {"drop": ["ALL"]}, workload
            assert sc["runAsNonRoot"] is True, workload
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, workload
            assert c["resources"]["requests"]["memory"] and c["resources"]["limits"]["memory"], workload
            assert c.get("livenessProbe") and (c.get("readinessProbe") or name == "full-values"), workload


@pytest.mark.parametrize("name", [n for n, _ in VALUE_SETS])
def test_only_the_operator_gets_a_kubernetes_token(renders: dict[str, list[dict[str, Any]]], name: str) -> None:
    objs = renders[name]
    for workload, spec in pod_specs(objs):
        wants_token = workload.endswith("-operator")
        assert spec["automountServiceAccountToken"] is wants_token, workload
    for sa in of_kind(objs, "ServiceAccount"):
        if not sa["metadata"]["name"].endswith("operator"):
            assert sa["automountServiceAccountToken"] is False, sa["metadata"]["name"]
    # The RBAC objects name only the operator's account (and the approver bindings, people:
    # approvals.roles.bindings, bound to the approver roles only).
    for rb in of_kind(objs, "ClusterRoleBinding", "RoleBinding"):
        if rb["metadata"]["labels"]["app.kubernetes.io/component"] == "approver":
            assert rb["roleRef"]["name"].endswith(("-approver", "-break-glass")), rb
            assert {s["kind"] for s in rb["subjects"]} <= {"User", "Group"}, rb
            continue
        assert [s["name"] for s in rb["subjects"]] == [
            next(sa for w, sa in ((w, s["serviceAccountName"]) for w, s in pod_specs(objs)) if w.endswith("operator"))]


@pytest.mark.parametrize("name", [n for n, _ in VALUE_SETS])
def test_redis_password_only_ever_comes_from_a_secret(renders: dict[str, list[dict[str, Any]]], name: str) -> None:
    for workload, spec in pod_specs(renders[name]):
        for c in spec["containers"]:
            env = env_of(c)
            for e in env.values():
                if "PASSWORD" in e["name"] or e["name"] == "AGENT_SAGA_REDIS_URL" and "valueFrom" in e:
                    assert "value" not in e and "secretKeyRef" in e["valueFrom"], (workload, e)
            url = env.get("AGENT_SAGA_REDIS_URL")
            if c["name"] == "redis":
                continue
            assert url is not None, workload
            if "value" in url:
                # host/port form: the password is spliced in by the kubelet, never literal.
                userinfo = url["value"].split("://", 1)[1].rsplit("@", 1)
                if len(userinfo) == 2 and ":" in userinfo[0]:
                    assert userinfo[0].endswith(":$(AGENT_SAGA_REDIS_PASSWORD)"), url
                    names = [e["name"] for e in c["env"]]
                    assert names.index("AGENT_SAGA_REDIS_PASSWORD") < names.index("AGENT_SAGA_REDIS_URL")
            assert "--redis-url" not in " ".join(c.get("args", [])), workload


def test_full_values_exercise_every_option(renders: dict[str, list[dict[str, Any]]]) -> None:
    objs = renders["full-values"]
    sts = one(objs, "StatefulSet", "operator")
    assert not [d for d in of_kind(objs, "Deployment") if d["metadata"]["name"].endswith("operator")]
    assert sts["spec"]["replicas"] == 3
    c = sts["spec"]["template"]["spec"]["containers"][0]
    assert c["image"].endswith(":0.1.0-ci@sha256:" + "0" * 64) and c["image"].startswith("registry.example.com/")
    args = c["args"]
    assert "--peering=payments-operators" in args and "--priority=-$(POD_INDEX)" in args
    assert env_of(c)["POD_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"] == \
        "metadata.labels['apps.kubernetes.io/pod-index']"
    assert {"--namespace=agent-saga-ci-team-a", "--namespace=agent-saga-ci-team-b", "--key-prefix={agentsaga}",
            "--health-port=18080", "--metrics-port=19090", "--log-level=DEBUG", "--retry-delay=1",
            "--approval-poll-interval=1.5"} <= set(args)
    assert env_of(c)["AGENT_SAGA_REDIS_URL"]["value"] == \
        "rediss://agent-saga:$(AGENT_SAGA_REDIS_PASSWORD)@redis-primary.data.svc.cluster.local:6380/3"
    # Namespaced mode: a Role + RoleBinding + KopfPeering per watched namespace, and the
    # ClusterRole keeps only read access to CRDs and namespaces.
    assert sorted(r["metadata"]["namespace"] for r in of_kind(objs, "Role")
                  if not r["metadata"]["name"].endswith("approval-keys")) == \
        ["agent-saga-ci-team-a", "agent-saga-ci-team-b"]
    assert sorted(p["metadata"]["namespace"] for p in of_kind(objs, "KopfPeering")) == \
        ["agent-saga-ci-team-a", "agent-saga-ci-team-b"]
    # Approvals: the operator signs with the Secret named, publishes the approvers' keys.
    assert {"--approval-signing-key=/etc/agent-saga/approval-signing/signing-key.pem",
            "--approval-keys=/etc/agent-saga/approver-keys"} <= set(args)
    vols = {v["name"]: v for v in sts["spec"]["template"]["spec"]["volumes"]}
    assert vols["approval-signing"]["secret"]["secretName"] == "agent-saga-approval-key"
    keys_cm = one(objs, "ConfigMap", "approver-keys")
    assert list(keys_cm["data"]) == ["risk-team.pem"] and "BEGIN PUBLIC KEY" in keys_cm["data"]["risk-team.pem"]
    assert not of_kind(objs, "Secret"), "the signing key is the Secret named, not one the chart makes"
    cr = one(objs, "ClusterRole", "operator")
    assert {(tuple(r["resources"]), tuple(r["verbs"])) for r in cr["rules"]} == {
        (("customresourcedefinitions",), ("list", "watch")), (("namespaces",), ("list", "watch")),
        (("validatingadmissionpolicies", "validatingadmissionpolicybindings"), ("get",))}
    rec = one(objs, "Deployment", "recoveryd")
    rc = rec["spec"]["template"]["spec"]["containers"][0]
    assert rec["spec"]["replicas"] == 4
    assert {"--imports=payments.compensators", "--imports=payments.reconcilers", "--metrics-port=19102",
            "--log-json", "--namespace=payments", "--concurrency=16", "--in-hand=64", "--compensation-timeout=0",
            "--claim-ttl=20", "--lease-grace=12.5", "--bind=0.0.0.0"} <= set(rc["args"])
    assert "requiredDuringSchedulingIgnoredDuringExecution" in \
        rec["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert one(objs, "PodDisruptionBudget")["spec"]["minAvailable"] == "50%"
    assert all(o["metadata"]["labels"]["team"] == "payments-platform" for o in objs)
    monitors = of_kind(objs, "ServiceMonitor")
    assert len(monitors) == 2
    services = {s["metadata"]["name"]: s for s in of_kind(objs, "Service")}
    for m in monitors:
        # Client-side check of what the Prometheus Operator will do (its CRDs are not on
        # the test server): the selector picks exactly one Service, whose port is named.
        picked = [s for s in services.values()
                  if m["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()]
        assert len(picked) == 1, m["metadata"]["name"]
        assert m["spec"]["endpoints"][0]["port"] in {p["name"] for p in picked[0]["spec"]["ports"]}
        assert m["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_recoveryd_logs_and_claims(renders: dict[str, list[dict[str, Any]]]) -> None:
    default = env_of(one(renders["default"], "Deployment", "recoveryd")["spec"]["template"]["spec"]["containers"][0])
    assert default["AGENT_SAGA_RECOVERYD_WAL_URL"]["value"] == "$(AGENT_SAGA_REDIS_URL)?key=agent-saga:wal"
    assert default["AGENT_SAGA_RECOVERYD_REDIS_URL"]["value"] == "$(AGENT_SAGA_REDIS_URL)"
    c = one(renders["full-values"], "Deployment", "recoveryd")["spec"]["template"]["spec"]["containers"][0]
    env = env_of(c)
    assert env["AGENT_SAGA_RECOVERYD_WAL_URL"]["value"] == (
        "$(AGENT_SAGA_REDIS_URL)?key=payments:wal,$(AGENT_SAGA_REDIS_URL)?key=refunds:wal,$(AGENT_SAGA_WAL_URLS)")
    assert env["AGENT_SAGA_WAL_URLS"]["valueFrom"]["secretKeyRef"] == {"name": "agent-saga-wal", "key": "urls"}
    names = [e["name"] for e in c["env"]]
    # $(VAR) only expands variables defined earlier in the list.
    assert names.index("AGENT_SAGA_REDIS_URL") < names.index("AGENT_SAGA_RECOVERYD_REDIS_URL")
    assert names.index("AGENT_SAGA_WAL_URLS") < names.index("AGENT_SAGA_RECOVERYD_WAL_URL")


def test_recoveryd_reads_encrypted_logs_with_a_mounted_key_file(renders: dict[str, list[dict[str, Any]]]) -> None:
    spec = one(renders["full-values"], "Deployment", "recoveryd")["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert "--wal-key-file=/etc/agent-saga/wal-key/keys.txt" in c["args"]
    mount = {m["name"]: m for m in c["volumeMounts"]}["wal-key"]
    assert mount == {"name": "wal-key", "mountPath": "/etc/agent-saga/wal-key", "readOnly": True}
    volume = {v["name"]: v for v in spec["volumes"]}["wal-key"]
    assert volume["secret"]["secretName"] == "agent-saga-wal-key"
    assert volume["secret"]["items"] == [{"key": "keys.txt", "path": "keys.txt"}]
    # The key is a file, never an environment variable the pod's env would show.
    assert not [e for e in c["env"] if "WAL_KEY" in e["name"]]
    default = one(renders["default"], "Deployment", "recoveryd")["spec"]["template"]["spec"]
    (dc,) = default["containers"]
    assert not [a for a in dc["args"] if a.startswith("--wal-key-file")] and "--log-json" not in dc["args"]
    assert "--lease-grace=5" in dc["args"]
    assert "wal-key" not in {v["name"] for v in default["volumes"]}


SECRET = "0123456789abcdef0123456789abcdef"


def _kubelet_view(container: dict[str, Any], pod: str, index: int) -> tuple[list[str], dict[str, str]]:
    """(args, env) as the kubelet would start ``container`` in pod ``pod`` (every Secret key
    holding SECRET, except URL keys holding a URL)."""
    class Secrets(dict[tuple[str, str], str]):
        def __missing__(self, ref: tuple[str, str]) -> str:
            if ref[1] == "url":
                return f"redis://:{SECRET}@redis.example:6379/0"
            if "url" in ref[1]:
                return f"postgresql://saga:{SECRET}@pg.example/saga?table=saga_wal"
            return SECRET

    env = container_env(container, Secrets(), {
        "metadata.name": pod, "metadata.labels['apps.kubernetes.io/pod-index']": str(index)})
    return [expand(a, env) for a in container["args"]], env


@pytest.mark.parametrize("name", [n for n, _ in VALUE_SETS])
def test_the_operator_cli_accepts_what_the_chart_passes(
    renders: dict[str, list[dict[str, Any]]], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_saga_operator.__main__ import parse_args

    workload = one(renders[name], "StatefulSet" if name == "full-values" else "Deployment", "operator")
    container = workload["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "agent_saga_operator"]
    for index in range(int(workload["spec"]["replicas"])):
        args, env = _kubelet_view(container, f"{workload['metadata']['name']}-{index}", index)
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        parsed = parse_args(args)
        assert parsed.redis_url == env["AGENT_SAGA_REDIS_URL"] and "$(" not in parsed.redis_url
        assert (SECRET in parsed.redis_url) is (name != "default")  # the default has no Redis password
        assert parsed.standalone is (name == "inchart-redis-values")
        assert parsed.priority == -index  # distinct per replica: pod 0 leads


@pytest.mark.parametrize("name", [n for n, _ in VALUE_SETS])
def test_the_recoveryd_cli_accepts_what_the_chart_passes(
    renders: dict[str, list[dict[str, Any]]], name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent_saga_recoveryd.config import parse_args

    workload = one(renders[name], "Deployment", "recoveryd")
    container = workload["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "agent_saga_recoveryd"]
    args, env = _kubelet_view(container, "rd-0", 0)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    config = parse_args(args)
    assert config.redis_url == env["AGENT_SAGA_REDIS_URL"] and config.daemon_id == "rd-0"
    assert config.wal_urls and all("$(" not in u for u in config.wal_urls)
    assert config.metrics_port == int(container["ports"][0]["containerPort"])
    values = {"default": {}, **{p.stem: yaml.safe_load(p.read_text()) for p in CI_VALUES}}[name]
    rv = {**yaml.safe_load((CHART / "values.yaml").read_text())["recoveryd"], **values.get("recoveryd", {})}
    assert (config.claim_ttl, config.lease_grace, config.concurrency, config.interval) == \
        (rv["claimTtl"], rv["leaseGrace"], rv["concurrency"], rv["interval"])
    assert config.in_hand == (rv["inHand"] if rv["inHand"] is not None else rv["concurrency"])
    assert config.log_json is rv["logJson"] and config.log_level == rv["logLevel"]
    assert config.wal_key_file == (f"/etc/agent-saga/wal-key/{rv['walKey']['key']}"
                                   if rv["walKey"]["existingSecret"] else None)
    probes = {container[p]["httpGet"]["path"] for p in ("livenessProbe", "readinessProbe", "startupProbe")
              if container.get(p)}
    assert probes <= {"/livez", "/readyz"}


def test_in_chart_redis_is_marked_not_for_production(renders: dict[str, list[dict[str, Any]]]) -> None:
    objs = renders["inchart-redis-values"]
    secret = one(objs, "Secret", "redis")
    # The default user's password, and the least-privilege ACL users' (agents, the approvers' CLI).
    assert set(secret["data"]) == {"redis-password", "agent-password", "approver-password"}
    assert all(len(v) > 40 for v in secret["data"].values())
    redis = one(objs, "Deployment", "redis")
    assert "not-for-production" in str(redis["metadata"]["annotations"])
    op = one(objs, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0]
    assert env_of(op)["AGENT_SAGA_REDIS_URL"]["value"] == "redis://:$(AGENT_SAGA_REDIS_PASSWORD)@rel-agent-saga-redis:6379/0"
    assert env_of(op)["AGENT_SAGA_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"] == \
        {"name": "rel-agent-saga-redis", "key": "redis-password"}
    assert "--standalone" in op["args"] and not of_kind(objs, "ClusterKopfPeering")


def test_url_from_secret(renders: dict[str, list[dict[str, Any]]]) -> None:
    objs = renders["url-secret-values"]
    assert not of_kind(objs, "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "PodDisruptionBudget")
    for _, spec in pod_specs(objs):
        url = env_of(spec["containers"][0])["AGENT_SAGA_REDIS_URL"]
        assert url == {"name": "AGENT_SAGA_REDIS_URL",
                       "valueFrom": {"secretKeyRef": {"name": "agent-saga-redis-url", "key": "url"}}}
        assert spec["serviceAccountName"] in {"platform-operator", "platform-recoveryd"}


def test_rbac_covers_exactly_the_generated_crds(renders: dict[str, list[dict[str, Any]]]) -> None:
    plurals = crd_plurals()
    cr = one(renders["default"], "ClusterRole", "operator")
    granted = {res for r in cr["rules"] if r["apiGroups"] == ["agentsaga.dev"] for res in r["resources"]}
    assert granted == plurals["agentsaga.dev"] | {f"{p}/status" for p in plurals["agentsaga.dev"]}
    assert {"clusterkopfpeerings", "kopfpeerings"} <= plurals["kopf.dev"]


def test_approval_ttl_grants_delete_on_approvals_only(helm: Helm) -> None:
    """operator.approvalTtlSecondsAfterFinished > 0 passes the TTL and grants delete on
    approvals (the janitor removes finished ones); 0, the default, grants no delete."""
    def deletes(objs: list[dict[str, Any]]) -> set[str]:
        role = one(objs, "ClusterRole", "operator")
        return {res for r in role["rules"] if "delete" in r["verbs"] for res in r["resources"]}

    default = helm.render("rel", "agent-saga")
    assert deletes(default) == set()
    assert not [a for a in one(default, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0]["args"]
                if a.startswith("--approval-ttl-after-finished")]
    ttl = helm.render("rel", "agent-saga", sets=["operator.approvalTtlSecondsAfterFinished=604800"])
    assert deletes(ttl) == {"approvals"}
    args = one(ttl, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--approval-ttl-after-finished=604800" in args


def test_service_monitors_only_where_the_cluster_serves_them(helm: Helm) -> None:
    """metrics.serviceMonitor.enabled on a cluster without the Prometheus Operator renders
    no ServiceMonitor (helm install would fail on its unknown kind), and NOTES say so."""
    full = [CHART / "ci" / "full-values.yaml"]
    assert not of_kind(helm.render("rel", "agent-saga", full), "ServiceMonitor")
    assert len(of_kind(helm.render("rel", "agent-saga", full, api_versions=(SERVICE_MONITOR_API,)),
                       "ServiceMonitor")) == 2


PROMETHEUS_RULE_API = "monitoring.coreos.com/v1/PrometheusRule"


def test_alert_rules_render_only_where_the_cluster_serves_prometheus_rules(helm: Helm) -> None:
    """With the default values: no PrometheusRule on a cluster without the kind (helm
    install would fail on it), and the one rules file, as it is, where the API is served."""
    assert not of_kind(helm.render("rel", "agent-saga"), "PrometheusRule")
    assert not of_kind(helm.render("rel", "agent-saga", api_versions=(SERVICE_MONITOR_API,)), "PrometheusRule")
    rule = one(helm.render("rel", "agent-saga", api_versions=(PROMETHEUS_RULE_API,)), "PrometheusRule")
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["namespace"] == "agent-saga"
    assert rule["spec"] == yaml.safe_load(RULES.read_text())
    off = helm.render("rel", "agent-saga", sets=["metrics.prometheusRule.enabled=false"],
                      api_versions=(PROMETHEUS_RULE_API,))
    assert not of_kind(off, "PrometheusRule")
    placed = one(helm.render("rel", "agent-saga", [CHART / "ci" / "full-values.yaml"],
                             sets=["metrics.prometheusRule.namespace=monitoring"],
                             api_versions=(PROMETHEUS_RULE_API,)), "PrometheusRule")
    assert placed["metadata"]["namespace"] == "monitoring"
    assert placed["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_the_dashboard_is_a_configmap_for_grafanas_sidecar(helm: Helm) -> None:
    cm = one(helm.render("rel", "agent-saga"), "ConfigMap", "dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(cm["data"]["agent-saga.json"]) == json.loads(DASHBOARD.read_text())
    full = one(helm.render("rel", "agent-saga", [CHART / "ci" / "full-values.yaml"]), "ConfigMap", "dashboard")
    assert full["metadata"]["annotations"] == {"grafana_folder": "agent-saga"}
    assert not [o for o in helm.render("rel", "agent-saga", sets=["metrics.dashboard.enabled=false"])
                if o["metadata"]["name"].endswith("dashboard")]


# --------------------------------------------------------------------------- HA Redis
def _urls(objs: list[dict[str, Any]]) -> set[str]:
    return {env_of(spec["containers"][0])["AGENT_SAGA_REDIS_URL"]["value"] for _, spec in pod_specs(objs)}


def test_an_existing_sentinel_deployment(helm: Helm) -> None:
    objs = helm.render(sets=["redis.topology=sentinel", "redis.sentinel.hosts[0]=s0.sentinel:26379",
                             "redis.sentinel.hosts[1]=s1.sentinel:26379", "redis.sentinel.service=payments",
                             "redis.db=2", "redis.auth.existingSecret=agent-saga-redis"])
    assert _urls(objs) == {"redis+sentinel://:$(AGENT_SAGA_REDIS_PASSWORD)@s0.sentinel:26379,s1.sentinel:26379/payments?db=2"}
    wal = env_of(one(objs, "Deployment", "recoveryd")["spec"]["template"]["spec"]["containers"][0])
    assert wal["AGENT_SAGA_RECOVERYD_WAL_URL"]["value"] == "$(AGENT_SAGA_REDIS_URL)&key=agent-saga:wal"


def test_recoveryd_reads_its_logs_with_wait_behind_sentinel_and_is_refused_it_on_a_cluster(
        helm: Helm, tmp_path: Path) -> None:
    objs = helm.render(sets=["redis.topology=sentinel", "redis.sentinel.hosts[0]=s0.sentinel:26379",
                             "redis.sentinel.service=payments", "recoveryd.wal.waitReplicas=1"])
    wal = env_of(one(objs, "Deployment", "recoveryd")["spec"]["template"]["spec"]["containers"][0])
    assert wal["AGENT_SAGA_RECOVERYD_WAL_URL"]["value"] == "$(AGENT_SAGA_REDIS_URL)?key=agent-saga:wal&wait_replicas=1"
    values = tmp_path / "cluster.yaml"
    values.write_text('redis: {topology: cluster, cluster: {hosts: ["c0.redis:6379"]}}\n'
                      'policyPlane: {keyPrefix: "{agentsaga}"}\n'
                      'recoveryd: {wal: {redisKeys: ["{agent-saga}:wal"], waitReplicas: 1}}\n')
    proc = helm.template(values=[values], check=False)
    assert proc.returncode != 0 and "waitReplicas is not available on a Redis Cluster" in proc.stderr, proc.stderr


def test_an_existing_redis_cluster_with_hash_tagged_keys(helm: Helm, tmp_path: Path) -> None:
    values = tmp_path / "cluster.yaml"
    values.write_text('redis: {topology: cluster, cluster: {hosts: ["c0.redis:6379", "c1.redis:6379"]}}\n'
                      'policyPlane: {keyPrefix: "{agentsaga}"}\nrecoveryd: {wal: {redisKeys: ["{agent-saga}:wal"]}}\n')
    objs = helm.render(values=[values])
    assert _urls(objs) == {"redis+cluster://c0.redis:6379,c1.redis:6379"}
    args = one(objs, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--key-prefix={agentsaga}" in args
    wal = env_of(one(objs, "Deployment", "recoveryd")["spec"]["template"]["spec"]["containers"][0])
    assert wal["AGENT_SAGA_RECOVERYD_WAL_URL"]["value"] == "$(AGENT_SAGA_REDIS_URL)?key={agent-saga}:wal"


# --------------------------------------------------------------------------- refusals
BAD_VALUES = [
    (["operator.replica=2"], "additional properties 'replica' not allowed"),
    (["unknownTopLevel=1"], "additional properties 'unknownTopLevel' not allowed"),
    # A password as a value is refused with the way to pass one (a Secret).
    (["redis.password=hunter2"], "is not a value"),
    (["redis.password=hunter2"], "set redis.auth.existingSecret=agent-saga-redis"),
    (["redis.auth.password=hunter2"], "create secret generic agent-saga-redis"),
    (["operator.logLevel=TRACE"], "logLevel"),
    (["redis.inChart.appendFsync=sometimes"], "appendFsync"),
    (["recoveryd.podAntiAffinityPreset=maybe"], "podAntiAffinityPreset"),
    (["operator.image.digest=latest"], "digest"),
    (["recoveryd.imports[0]=not a module"], "imports"),
    (["operator.watchNamespaces[0]=Bad_NS"], "watchNamespaces"),
    (["recoveryd.podDisruptionBudget.minAvailable=1", "recoveryd.podDisruptionBudget.maxUnavailable=1"],
     "podDisruptionBudget"),
    (["operator.replicas=2", "operator.peering.enabled=false"], "operator.replicas > 1 needs operator.peering.enabled=true"),
    (["redis.inChart.enabled=true", "redis.auth.existingSecret=mine"], "leave redis.auth.existingSecret empty"),
    (["redis.host="], "set redis.host"),
    (["redis.auth.urlKey=url"], "set redis.auth.existingSecret too"),
    (["operator.serviceAccount.create=false"], "operator.serviceAccount.name is required"),
    (["json:recoveryd.wal.redisKeys=[]"], "recoveryd has no log to recover"),
    (["recoveryd.wal.redisKeys[0]=a?b"], "redisKeys"),
    (["recoveryd.concurrency=0"], "concurrency"),
    (["recoveryd.inHand=4"], "recoveryd.inHand (4) must be >= recoveryd.concurrency (8), or null"),
    (["recoveryd.leaseGrace=-1"], "leaseGrace"),
    (["recoveryd.walKey.existingSecret=Not_A_Name"], "existingSecret"),
    (["redis.topology=sentinel"], "redis.topology=sentinel needs redis.sentinel.hosts"),
    (["redis.topology=cluster"], "redis.topology=cluster needs redis.cluster.hosts"),
    (["redis.topology=cluster", "redis.cluster.hosts[0]=n0:6379"], "set policyPlane.keyPrefix to a hash tag"),
    (["redis.topology=cluster", "redis.cluster.hosts[0]=n0:6379", "redis.db=1"], "has only database 0"),
    (["redis.topology=replicated"], "topology"),
    (["recoveryd.wal.waitReplicas=-1"], "waitReplicas"),
    (["approvals.roles.bindings[0].namespace=team-a", "approvals.roles.bindings[0].role=approver"],
     "the approver binding in namespace team-a names nobody: set users or groups"),
    (["approvals.roles.bindings[0].namespace=team-a", "approvals.roles.bindings[0].role=admin",
      "approvals.roles.bindings[0].users[0]=risk@corp"], "role"),
    (["approvals.roles.bindings[0].namespace=team-a", "approvals.roles.bindings[0].role=approver",
      "approvals.roles.bindings[0].users[0]=a@corp", "approvals.roles.bindings[1].namespace=team-a",
      "approvals.roles.bindings[1].role=approver", "approvals.roles.bindings[1].users[0]=b@corp"],
     "two entries bind approver in namespace team-a"),
]


@pytest.mark.parametrize(("sets", "message"), BAD_VALUES, ids=[" ".join(s) for s, _ in BAD_VALUES])
def test_bad_values_are_refused_with_a_message_naming_them(helm: Helm, sets: list[str], message: str) -> None:
    proc = helm.template(sets=sets, check=False)
    assert proc.returncode != 0, f"accepted: {sets}"
    assert message in proc.stderr, proc.stderr
