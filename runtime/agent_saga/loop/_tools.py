"""``LoopTool``: a tool the loop offers the model, and how each call of it becomes a saga step."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..codemod import Codemod
from ..compensation import Compensation
from ..engine import CompensationFactory
from ..errors import ConfigurationError
from ..routing import Tool
from ..semantics import ActionSemantics, coerce_semantics

__all__ = ["LoopTool", "codemod_tool"]

_RESULT_MAX = 4000


@dataclass(frozen=True, slots=True)
class LoopTool:
    """A tool the model may call inside ``AgentLoop.run``.

    Args:
        name: the name the model calls it by (and the saga step's tool name).
        fn: called with the model's arguments as keyword arguments (sync or async); its
            return value, as JSON, is what the model sees next.
        semantics: REVERSIBLE (default), COMPENSABLE (``compensate`` required) or
            IRREVERSIBLE (the gate decides; never undone automatically).
        compensate: the factory over ``fn``'s result that undoes it
            (``lambda r: Compensation(handler=..., kwargs=...)``): what an unfinished goal
            runs to unwind this call.
        description, parameters: what the model is told (``parameters`` is JSON Schema).

    Raises ``ConfigurationError`` at once for a bad field, naming it.
    """

    name: str
    fn: Callable[..., Any]
    semantics: ActionSemantics | str = ActionSemantics.REVERSIBLE
    compensate: CompensationFactory | None = None
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigurationError(f"LoopTool name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn):
            raise ConfigurationError(f"LoopTool {self.name!r}: fn must be callable, got {self.fn!r}")
        object.__setattr__(self, "semantics", coerce_semantics(self.semantics))
        if self.semantics is ActionSemantics.COMPENSABLE and self.compensate is None:
            raise ConfigurationError(
                f"LoopTool {self.name!r} is COMPENSABLE but has no compensate=: an unfinished goal could not "
                f"undo it. Pass compensate=lambda r: Compensation(...), or declare it IRREVERSIBLE"
            )

    def spec(self) -> Tool:
        """The tool as the model is offered it."""
        return Tool(self.name, self.description, dict(self.parameters))


def result_text(value: Any) -> str:
    """A tool's result as the text of the ``tool`` message the model reads next."""
    if isinstance(value, str):
        text = value
    else:
        try:
            text = json.dumps(value, sort_keys=True, default=str)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= _RESULT_MAX else text[:_RESULT_MAX] + " [truncated]"


_EDIT_PARAMETERS = {
    "type": "object",
    "properties": {
        "files": {"type": "object", "description": "path (relative to the repository) -> new content, or null to delete",
                  "additionalProperties": {"type": ["string", "null"]}},
        "message": {"type": "string", "description": "the commit message"},
    },
    "required": ["files", "message"],
}


def codemod_tool(codemod: Codemod, name: str = "repo.edit") -> LoopTool:
    """A ``LoopTool`` that edits ``codemod``'s repository as one transaction.

    The model calls it with ``{"files": {path: text | null}, "message": ...}``; the edit is
    verified in a shadow worktree and merged whole, or not at all (the model is told why:
    ``error: VerifyFailed: ...``). It is COMPENSABLE: if the loop's goal is not reached,
    the rollback restores the repository to the snapshot the edit started from
    (``codemod.restore``, which the recovery daemon also runs after a crash)."""

    async def edit(files: Mapping[str, str | None], message: str) -> dict[str, Any]:
        result = await codemod.run(dict(files), message=message)
        return {"repo": result.repo, "branch": result.branch, "snapshot": result.snapshot,
                "commit": result.commit, "paths": [p for _, p in result.changed]}

    def undo(r: Mapping[str, Any]) -> Compensation:
        return Compensation(handler="codemod.restore", kwargs=dict(r),
                            description=f"restore {r['repo']} to {str(r['snapshot'])[:12]}")

    return LoopTool(name, edit, ActionSemantics.COMPENSABLE, undo,
                    f"edit files in {codemod.repo} (verified by `{' '.join(codemod.verify)}` before it lands)",
                    _EDIT_PARAMETERS)
