"""The skeleton's candidate comments: what a tool's name or annotations suggest, beside a
declaration that stays IRREVERSIBLE (the file never upgrades itself)."""

from __future__ import annotations

from typing import Any

from agent_saga.controls.policy import SurfaceEntry, load_policy_text, skeleton_yaml
from agent_saga.controls.policy._hints import hints

REPO = {"type": "object", "properties": {"repo_path": {"type": "string"}}, "required": ["repo_path"]}
ADD = {"type": "object", "properties": {"repo_path": {"type": "string"}, "files": {"type": "array"}},
       "required": ["repo_path", "files"]}
MOVE = {"type": "object", "properties": {"source": {"type": "string"}, "destination": {"type": "string"}}}
WRITES = {"readOnlyHint": False, "destructiveHint": True}


def _entries(tools: dict[str, tuple[dict[str, Any] | None, dict[str, Any] | None]]) -> list[SurfaceEntry]:
    return [SurfaceEntry(name, None, (), schema, 0.0, 0.0, 1, annotations=notes)
            for name, (schema, notes) in tools.items()]


def test_a_tool_with_an_opposite_sibling_gets_its_inverse_shape_with_the_call_arguments() -> None:
    surface = {"git_add": ADD, "git_reset": REPO}
    assert hints("git_add", ADD, None, surface) == [
        "candidate (its name and git_reset's suggest it; verify that git_reset undoes exactly what git_add did "
        "before you use it):",
        "  semantics: COMPENSABLE",
        "  compensate: {tool: git_reset, callArgs: {repo_path: $.repo_path}}",
    ]


def test_an_inverse_argument_the_call_lacks_is_taken_from_the_result_and_flagged() -> None:
    create = {"properties": {"title": {"type": "string"}}}
    delete = {"properties": {"issue_id": {"type": "string"}}, "required": ["issue_id"]}
    lines = hints("createIssue", create, None, {"createIssue": create, "deleteIssue": delete})
    assert lines[2] == "  compensate: {tool: deleteIssue, args: {issue_id: $.issue_id}}"
    assert "issue_id: not an argument of createIssue; check that its answer has it" in lines[3]


def test_a_move_with_both_paths_in_the_call_is_its_own_inverse_with_the_paths_swapped() -> None:
    lines = hints("move_file", MOVE, WRITES, {"move_file": MOVE})
    assert lines[-1] == "  compensate: {tool: move_file, callArgs: {source: $.destination, destination: $.source}}"


def test_read_only_tools_are_reversible_candidates_and_the_annotation_outranks_the_name() -> None:
    assert "semantics: REVERSIBLE" in hints("git_status", REPO, {"readOnlyHint": True}, {})[0]
    assert "readOnlyHint: true" in hints("run", None, {"readOnlyHint": True}, {})[0]
    assert "its name reads (list)" in hints("list_tables", None, None, {})[0]
    assert hints("list_and_purge", None, {"readOnlyHint": False}, {}) == []  # the server says it writes


def test_a_destructive_tool_without_an_inverse_is_flagged_and_others_get_nothing() -> None:
    assert hints("write_file", None, WRITES, {})[0].startswith("destructiveHint: true")
    assert hints("git_commit", REPO, {"readOnlyHint": False, "destructiveHint": False}, {}) == []
    assert hints("", None, "not a mapping", {}) == []  # type: ignore[arg-type]


def test_the_skeleton_carries_candidates_as_comments_and_every_tool_stays_irreversible() -> None:
    text = skeleton_yaml(_entries({"git_add": (ADD, None), "git_reset": (REPO, WRITES),
                                   "git_status": (REPO, {"readOnlyHint": True}), "move_file": (MOVE, WRITES)}),
                         name="git", namespace="default")
    assert "      #   compensate: {tool: git_reset, callArgs: {repo_path: $.repo_path}}" in text
    assert "      # candidate (readOnlyHint: true): semantics: REVERSIBLE" in text
    assert "      #   compensate: {tool: move_file, callArgs: {source: $.destination, destination: $.source}}" in text
    policy = load_policy_text(text)
    assert {d.semantics.value for d in policy.tools.values()} == {"IRREVERSIBLE"}
    assert all(d.compensate is None for d in policy.tools.values())
