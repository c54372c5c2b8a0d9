"""The committed CRDs are exactly what the models generate, and are structural."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from agent_saga_operator import crdgen
from agent_saga_operator.models import KINDS, BudgetLimitSpec, KillSwitchSpec
from pydantic import ValidationError


def test_committed_crds_match_the_models() -> None:
    problems = crdgen.check()
    assert not problems, "CRDs are out of date: run make crds\n" + "\n".join(problems)


def test_generation_is_deterministic() -> None:
    assert crdgen.render_all() == crdgen.render_all()


def _walk(node: Any, path: str = "") -> list[tuple[str, str, Any]]:
    out = []
    if isinstance(node, dict):
        for k, v in node.items():
            out.append((path, k, v))
            out.extend(_walk(v, f"{path}.{k}"))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            out.extend(_walk(v, f"{path}[{i}]"))
    return out


@pytest.mark.parametrize("model", KINDS, ids=[m.info.kind for m in KINDS])
def test_schema_is_structural(model: Any) -> None:
    crd = crdgen.crd_for(model)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, key, value in _walk(schema):
        assert key not in ("$ref", "anyOf", "allOf", "oneOf", "title", "const", "$defs"), f"{path}.{key}"
        if key == "additionalProperties":
            assert isinstance(value, dict), f"{path}: additionalProperties must be a schema"
        if key == "default":
            assert value is not None, f"{path}: null default"
        if key in ("exclusiveMinimum", "exclusiveMaximum"):
            assert value is True, f"{path}: OpenAPI 3.0 takes a boolean {key}"
    # Every object node says it is an object; every property has a type.
    for path, key, value in _walk(schema):
        if key == "properties":
            for name, sub in value.items():
                assert "type" in sub or "x-kubernetes-preserve-unknown-fields" in sub, f"{path}.{name}"
    version = crd["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]][-3:] == ["Ready", "Status", "Age"]
    status = schema["properties"]["status"]["properties"]
    assert "observedGeneration" in status
    assert status["conditions"]["x-kubernetes-list-type"] == "map"
    assert status["conditions"]["x-kubernetes-list-map-keys"] == ["type"]


def test_yaml_round_trips() -> None:
    for name, text in crdgen.render_all().items():
        docs = [d for d in yaml.safe_load_all(text) if d]
        assert docs, name
        for d in docs:
            assert d["kind"] == "CustomResourceDefinition"


def test_check_reports_a_stale_file_with_the_fix(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    crdgen.write([tmp_path])
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 0
    (tmp_path / "agentsaga.dev_killswitches.yaml").write_text("# edited by hand\n")
    (tmp_path / "stray.yaml").write_text("{}\n")
    assert crdgen.main(["--check", "--out", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert "run make crds" in err and "differs from the models" in err and "stray.yaml" in err


def test_models_read_specs_as_kubernetes_stores_them() -> None:
    ks = KillSwitchSpec.model_validate(
        {"action": "Halt", "scope": {"tool": "stripe.*"}, "reason": "r", "requestedBy": "soc@corp", "ttlSeconds": 60}
    )
    assert ks.scope is not None and ks.scope.tool == "stripe.*" and ks.ttl_seconds == 60
    with pytest.raises(ValidationError):
        KillSwitchSpec.model_validate({"action": "Stop", "reason": "r", "requestedBy": "x"})
    with pytest.raises(ValidationError):
        BudgetLimitSpec.model_validate({"kind": "Budget", "arg": "amount", "maxTotal": -1, "window": "1h"})
    with pytest.raises(ValidationError):
        KillSwitchSpec.model_validate({"action": "Halt", "reason": "r", "requestedBy": "x", "surprise": 1})


@pytest.mark.parametrize("scope", [{}, {"tool": None}, {"tool": "wire.send", "tag": "eu"}])
def test_a_killswitch_scope_names_exactly_one_target(scope: dict[str, object]) -> None:
    """An empty scope is refused by the model too (an object stored before the CEL rule
    existed is Invalid, never a global halt)."""
    with pytest.raises(ValidationError, match="exactly one of tool, tag or sagaId; omit scope for a global"):
        KillSwitchSpec.model_validate({"action": "Halt", "scope": scope, "reason": "r", "requestedBy": "x"})


def test_every_pattern_has_an_explained_cel_rule_instead_of_a_bare_regex() -> None:
    """No spec field is checked by a bare OpenAPI pattern (the API server would answer
    "should match '^...$'"): each has a CEL rule whose message says what to write."""
    bare: list[str] = []

    def walk(node: dict[str, object], path: str) -> None:
        if "pattern" in node:
            bare.append(path)
        for rule in node.get("x-kubernetes-validations", ()):  # type: ignore[attr-defined]
            assert rule.get("message") or rule.get("messageExpression"), (path, rule)
        for name, sub in (node.get("properties") or {}).items():  # type: ignore[attr-defined]
            walk(sub, f"{path}.{name}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], f"{path}[]")  # type: ignore[arg-type]

    for model in KINDS:
        walk(crdgen.crd_for(model)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"],
             f"{model.info.kind}.spec")
    assert bare == []
