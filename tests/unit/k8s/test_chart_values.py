"""The chart's files agree with each other, without helm or a cluster.

values.yaml and every ci/ values file use only keys values.schema.json declares; the
schema is strict (every object refuses unknown keys unless it is a Kubernetes type the
API server validates); template files are named ``<component>-<kind>.yaml``; RBAC names
every generated CRD; the Dockerfile builds what the chart runs, as the user the chart
expects. (Rendering and the API server: tests/e2e/test_chart_*.py.)
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "charts" / "agent-saga"
SCHEMA = CHART / "values.schema.json"
COMPONENTS = {"operator", "recoveryd", "redis", "agent", "approver", "monitoring"}
# Objects the schema passes through to the API server (Kubernetes types, validated there).
PASS_THROUGH = {"podSecurityContext", "securityContext", "affinity", "global",
                "startupProbe", "livenessProbe", "readinessProbe"}


def schema() -> dict[str, Any]:
    import json

    return json.loads(SCHEMA.read_text())  # type: ignore[no-any-return]


def resolve(node: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    while True:
        if "$ref" in node:
            node = root["definitions"][node["$ref"].rsplit("/", 1)[1]]
        elif "allOf" in node and len(node["allOf"]) == 1:
            node = {**node["allOf"][0], **{k: v for k, v in node.items() if k != "allOf"}}
        else:
            return node


def undeclared(values: Any, node: dict[str, Any], root: dict[str, Any], path: str = "") -> list[str]:
    """Keys of ``values`` the schema does not declare (where it refuses unknown keys)."""
    node = resolve(node, root)
    if not isinstance(values, dict) or node.get("type") != "object":
        return []
    out: list[str] = []
    props = node.get("properties", {})
    for key, value in values.items():
        where = f"{path}.{key}" if path else key
        if key in props:
            out += undeclared(value, props[key], root, where)
        elif node.get("additionalProperties") is False:
            out.append(where)
    return out


def walk(node: Any, path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        if node.get("type") == "object" or "properties" in node:
            out.append((path, node))
        for k, v in node.items():
            out += walk(v, f"{path}/{k}")
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out += walk(v, f"{path}/{i}")
    return out


VALUE_FILES = [CHART / "values.yaml", *sorted((CHART / "ci").glob("*.yaml"))]


@pytest.mark.parametrize("path", VALUE_FILES, ids=[p.name for p in VALUE_FILES])
def test_every_key_is_declared_in_the_schema(path: Path) -> None:
    root = schema()
    assert undeclared(yaml.safe_load(path.read_text()), root, root) == []


def test_the_schema_refuses_unknown_keys_everywhere() -> None:
    root = schema()
    assert root["additionalProperties"] is False
    loose = []
    for path, node in walk(root):
        name = path.rsplit("/", 1)[-1]
        if node.get("additionalProperties") is False or isinstance(node.get("additionalProperties"), dict):
            continue  # strict, or a string map
        if name in PASS_THROUGH or path.startswith("/definitions/probe") or "Kubernetes" in node.get("description", ""):
            continue
        if node.get("type") == "object" and "properties" not in node and "description" in node:
            continue  # a documented Kubernetes object (tolerations items, extraEnv items)
        loose.append(path)
    assert loose == [], f"objects in values.schema.json that accept any key: {loose}"


def test_values_yaml_sets_every_required_key() -> None:
    root = schema()
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def missing(v: Any, node: dict[str, Any], path: str) -> list[str]:
        node = resolve(node, root)
        if not isinstance(v, dict):
            return []
        out = [f"{path}.{k}".lstrip(".") for k in node.get("required", []) if k not in v]
        for k, sub in node.get("properties", {}).items():
            if k in v:
                out += missing(v[k], sub, f"{path}.{k}")
        return out

    assert missing(values, root, "") == []


def test_no_password_value_exists() -> None:
    # Passwords come from Secrets: no key in the schema may hold one. redis.password and
    # redis.auth.password are declared only so that the render can refuse them with the
    # way to pass a password (test_chart_render.py: "is not a value ... existingSecret").
    refusals = {"/properties/redis/password", "/properties/redis/properties/auth/password"}
    nodes = {f"{p}/{k}": sub for p, n in walk(schema()) for k, sub in n.get("properties", {}).items()}
    keys = [p for p, _ in walk(schema())] + list(nodes)
    holders = [k for k in keys if re.search(r"/(password|token|secretValue)$", k, re.I)]
    assert set(holders) <= refusals, holders
    for k in holders:
        assert set(nodes[k]) == {"description"} and nodes[k]["description"].startswith("Not accepted"), k
        assert "redis.auth.existingSecret" in nodes[k]["description"], k


def test_templates_are_named_component_kind() -> None:
    for path in sorted((CHART / "templates").iterdir()):
        if path.name.startswith("_") or path.name == "NOTES.txt":
            continue
        m = re.fullmatch(r"([a-z]+)-([a-z]+)\.yaml", path.name)
        assert m and m.group(1) in COMPONENTS, f"{path.name}: not <component>-<kind>.yaml"
        kinds = {k.lower() for k in re.findall(r"^kind: (\w+)", path.read_text(), re.M)}
        assert kinds and all(m.group(2) in k for k in kinds), f"{path.name} holds {kinds}"


def _crd_plurals(group: str) -> set[str]:
    out = set()
    for path in (CHART / "crds").glob("*.yaml"):
        for d in yaml.safe_load_all(path.read_text()):
            if d and d["spec"]["group"] == group:
                out.add(d["spec"]["names"]["plural"])
    return out


def test_rbac_names_every_generated_crd() -> None:
    text = (CHART / "templates" / "_operator-rbac.tpl").read_text()
    rules = re.findall(r'apiGroups: \["agentsaga\.dev"\]\n\s+resources: \[([^\]]*)\]\n\s+verbs: \[([^\]]*)\]',
                       text)
    plurals = _crd_plurals("agentsaga.dev")

    def items(text: str) -> set[str]:
        return {s.strip().strip('"') for s in text.split(",")}

    granted = {(res, verb) for resources, verbs in rules for res in items(resources) for verb in items(verbs)}
    assert plurals and granted == (
        {(p, v) for p in plurals for v in ("list", "watch", "patch")}
        | {(f"{p}/status", "patch") for p in plurals}
        | {(p, "get") for p in ("killswitches", "sagapolicies", "approvals", "modelroutes")}
        | {("approvals", "create")}
        # only with operator.approvalTtlSecondsAfterFinished > 0 (test_chart_render.py checks)
        | {("approvals", "delete")})


def test_chart_app_version_is_the_package_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert chart["appVersion"] == project["version"]
    assert chart["name"] == "agent-saga" and chart["apiVersion"] == "v2"


def test_dockerfile_builds_what_the_chart_runs() -> None:
    text = (REPO / "Dockerfile").read_text()
    stages = re.findall(r"^FROM (\S+) AS (\S+)$", text, re.M)
    names = {name for _, name in stages}
    assert {"build-operator", "build-recoveryd", "runtime", "operator", "recoveryd"} <= names
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M)
    assert base and re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base.group(1))
    # The recoveryd image also runs the `agent-saga mcp` sidecar: uvloop (the fast extra) with it.
    assert '".[operator]"' in text and '".[recoveryd,fast]"' in text
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for component in ("operator", "recoveryd"):
        uid = values[component]["podSecurityContext"]["runAsUser"]
        assert f"USER {uid}:{uid}" in text and f"--uid {uid}" in text
        template = (CHART / "templates" / ("_operator-pod.tpl" if component == "operator"
                                           else "recoveryd-deployment.yaml")).read_text()
        assert f'command: ["python", "-m", "agent_saga_{component}"]' in template
        assert f'ENTRYPOINT ["python", "-m", "agent_saga_{component}"]' in text
    ignore = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[ignore.index("*") + 1:][:5] == [
        "!pyproject.toml", "!README.md", "!runtime/", "!operator/", "!recoveryd/"]


def test_the_in_chart_redis_acl_users_are_the_runtimes() -> None:
    """files/redis-acl-<role>.json is ``agent-saga acl <role>`` with placeholders the
    template fills (regenerate: agent-saga acl ROLE --key-prefix __PREFIX__
    --limit-namespace __LIMITS__ --json > charts/agent-saga/files/redis-acl-ROLE.json)."""
    import json

    from agent_saga.plane import acl_rules

    for role in ("agent", "approver"):
        shipped = json.loads((CHART / "files" / f"redis-acl-{role}.json").read_text())
        assert shipped == acl_rules(role, prefix="__PREFIX__", limit_namespace="__LIMITS__"), role  # type: ignore[arg-type]
