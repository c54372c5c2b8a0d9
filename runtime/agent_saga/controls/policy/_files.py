"""Reading policies: from a file (the MCP proxy's JSON, or a SagaPolicy manifest), or
from the operator's policy-plane documents (``policies_from_documents``).

    load_policy_file("saga-policy.json")     # {"mode": "enforce", "tools": {...}}
    load_policy_file("policy.yaml")          # apiVersion: agentsaga.dev/v1alpha1, kind: SagaPolicy

A document with ``kind: SagaPolicy`` is a manifest: its ``spec`` is the policy (errors
name ``spec.…``). Anything else is the policy itself. JSON needs nothing; YAML needs
PyYAML (``pip install pyyaml``), imported only for a file that is not JSON.

Invariant: every failure is a ``PolicyError`` naming the file and the field.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ._evaluation import PolicyInForce
from ._model import PolicyError, SagaPolicy, parse_policy

__all__ = ["load_policy_file", "load_policy_text", "policies_from_documents"]


def load_policy_text(text: str, *, source: str = "<policy>") -> SagaPolicy:
    """Parse a policy or a SagaPolicy manifest from JSON or YAML text."""
    try:
        doc: Any = json.loads(text)
    except ValueError:
        try:
            import yaml
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise PolicyError("", f"{source} is not JSON, and reading YAML needs PyYAML: pip install pyyaml "
                              f"(or write the policy as JSON)") from exc
        try:
            doc = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise PolicyError("", f"{source} is neither JSON nor YAML ({exc})") from None
    where = ""
    if isinstance(doc, dict) and ("kind" in doc or "apiVersion" in doc):
        if doc.get("kind") != "SagaPolicy":
            raise PolicyError("kind", f"{source} is a {doc.get('kind')!r} manifest; a policy file is a SagaPolicy "
                              f"manifest or the policy itself ({{\"mode\": ..., \"tools\": {{...}}}})")
        doc, where = doc.get("spec"), "spec"
    try:
        return parse_policy(doc, where=where)
    except PolicyError as exc:
        raise PolicyError(exc.field, f"{source}: {exc.message.removeprefix(exc.field + ': ')}") from None


def load_policy_file(path: str | Path) -> SagaPolicy:
    """Parse the policy in the file at ``path`` (see the module doc)."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise PolicyError("", f"cannot read policy file {p}: {exc.strerror or exc}") from None
    return load_policy_text(text, source=str(p))


def policies_from_documents(docs: Iterable[Mapping[str, Any]]) -> tuple[list[PolicyInForce], list[str]]:
    """The policies in the operator's SagaPolicy documents (docs/policy-plane.md), and the
    problems met: a document of an unknown ``v``, or one this parser refuses, is skipped
    and reported, never guessed at."""
    out: list[PolicyInForce] = []
    problems: list[str] = []
    for doc in docs:
        id_ = str(doc.get("id", "?"))
        if doc.get("v") != 1:
            problems.append(f"{id_}: document v={doc.get('v')!r} is not supported (skipped)")
            continue
        try:
            policy = parse_policy(doc.get("policy"), where="policy")
        except PolicyError as exc:
            problems.append(f"{id_}: unreadable SagaPolicy ({exc}) (skipped)")
            continue
        out.append(PolicyInForce(id_, policy, str(doc.get("uid") or ""), int(doc.get("generation") or 0)))
    return out, problems
