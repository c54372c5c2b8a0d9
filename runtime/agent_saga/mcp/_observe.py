"""``--observe``: the tool surface a session showed, and the skeleton written from it.

The proxy forwards everything and records, from ``tools/list`` responses, each tool's
name, input schema and annotations, and from ``tools/call`` requests, how often each was called
(names only, never argument values). At the end of the session it writes, with the same
generator as ``agent-saga policy skeleton``:

- ``FILE``: the SagaPolicy spec — YAML with a ``# TODO`` on every tool when FILE ends in
  ``.yaml`` / ``.yml``, else JSON (which has no comments: the TODOs are in the manifest);
- ``FILE`` with ``.sagapolicy.yaml`` in place of its extension: the SagaPolicy custom
  resource (``kubectl apply -f``), with the TODOs.

Every tool is IRREVERSIBLE: a skeleton that guessed COMPENSABLE and invented an inverse
would assert that an operation is undoable on the evidence of its name. In the YAML, a
tool whose name or annotations (``readOnlyHint``, ``destructiveHint``) suggest a class
gets a comment with the candidate (an inverse's shape), for a reviewer to verify; it is
only a comment. Neither file is ever overwritten.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from ..controls.policy import SurfaceEntry, load_policy_text, skeleton_yaml
from ..controls.policy._model import TOOL_NAME
from ..errors import ConfigurationError

__all__ = ["Surface", "manifest_path"]


def manifest_path(path: str) -> str:
    """Where the custom resource goes next to the spec file ``path``."""
    p = Path(path)
    return str(p.with_name(p.stem + ".sagapolicy.yaml"))


class Surface:
    """The tools seen in one session (see the module doc)."""

    def __init__(self) -> None:
        self.schemas: dict[str, dict[str, Any] | None] = {}
        self.annotations: dict[str, dict[str, Any] | None] = {}
        self.calls: dict[str, int] = {}
        self.first = time.time()

    def listed(self, tools: list[Any]) -> None:
        """Note the tools of a ``tools/list`` response (name, input schema, annotations)."""
        for t in tools:
            if isinstance(t, dict) and isinstance(t.get("name"), str):
                schema, notes = t.get("inputSchema"), t.get("annotations")
                self.schemas[t["name"]] = schema if isinstance(schema, dict) else None
                self.annotations[t["name"]] = notes if isinstance(notes, dict) else None

    def called(self, tool: str) -> None:
        """Count one ``tools/call`` of ``tool``."""
        self.calls[tool] = self.calls.get(tool, 0) + 1

    def entries(self) -> list[SurfaceEntry]:
        """The surface as entries for the skeleton generator."""
        now = time.time()
        names = sorted(set(self.schemas) | set(self.calls))
        return [SurfaceEntry(n, None, (), self.schemas.get(n), self.first, now, self.calls.get(n, 0),
                             annotations=self.annotations.get(n)) for n in names]

    def write(self, path: str, *, name: str, namespace: str = "default", source: str = "") -> list[str]:
        """Write the spec file and the manifest (never over an existing file); their paths."""
        manifest = skeleton_yaml(self.entries(), name=name, namespace=namespace,
                                 generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                                 source=f"agent-saga mcp --observe -- {source}" if source else "")
        manifest = manifest.replace("`agent-saga policy skeleton`", "`agent-saga mcp --observe`")
        spec_lines = manifest.split("\nspec:\n", 1)[1].splitlines()
        spec_yaml = "\n".join(line[2:] for line in spec_lines) + "\n"
        head = [line for line in manifest.splitlines() if line.startswith("#")]
        if path.endswith((".yaml", ".yml")):
            spec_text = "\n".join(head) + "\n" + spec_yaml
        else:
            spec_text = json.dumps(_spec_doc(self.entries(), path), indent=2) + "\n"
        out = []
        for target, text in ((path, spec_text), (manifest_path(path), manifest)):
            try:
                fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                raise ConfigurationError(f"{target} exists: a skeleton never overwrites a file") from None
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            out.append(target)
        return out


def _spec_doc(entries: list[SurfaceEntry], path: str) -> dict[str, Any]:
    """The spec as JSON: every tool with a valid name IRREVERSIBLE (checked by the one schema)."""
    tools = {e.tool: {"semantics": "IRREVERSIBLE"} for e in entries if TOOL_NAME.match(e.tool) and len(e.tool) <= 253}
    doc = {"mode": "Enforce", "undeclaredTools": "Refuse", "tools": tools}
    return load_policy_text(json.dumps(doc), source=path).to_doc()
