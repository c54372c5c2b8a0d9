"""SagaPolicy: the reviewed file that says what each tool is and who must approve it.

One schema for the ``SagaPolicy`` custom resource's spec and the MCP proxy's policy file
(``_model``); a small JSONPath subset for taking values from a call or a forward result
(``_jsonpath``); how the policies in force change a step (``_evaluation``: a reviewed
policy only ever tightens what code declares); reading a policy from a file
(``_files``); and the skeleton written from a recorded tool surface (``_skeleton``).
See docs/policy.md.
"""

from ._evaluation import Admission, PolicyInForce, PolicySet
from ._files import load_policy_file, load_policy_text, policies_from_documents
from ._jsonpath import JSON_PATH_PATTERN, JsonPath, JsonPathError, JsonPathMissing, compile_path
from ._model import (
    AppliesTo,
    Compensate,
    PolicyError,
    PolicyRule,
    SagaPolicy,
    ToolDeclaration,
    parse_policy,
)
from ._skeleton import SurfaceEntry, merge_surface, skeleton_yaml, surface_entry_doc

__all__ = [
    "JSON_PATH_PATTERN",
    "Admission",
    "AppliesTo",
    "Compensate",
    "JsonPath",
    "JsonPathError",
    "JsonPathMissing",
    "PolicyError",
    "PolicyInForce",
    "PolicyRule",
    "PolicySet",
    "SagaPolicy",
    "SurfaceEntry",
    "ToolDeclaration",
    "compile_path",
    "load_policy_file",
    "load_policy_text",
    "merge_surface",
    "parse_policy",
    "policies_from_documents",
    "skeleton_yaml",
    "surface_entry_doc",
]
