"""SagaPolicy: the reviewed file that says what each tool is and who must approve it.

One schema for the ``SagaPolicy`` custom resource's spec and the MCP proxy's policy file
(``_model``); a small JSONPath subset for taking values from a call or a forward result
(``_jsonpath``); how the policies in force change a step (``_evaluation``: a reviewed
policy only ever tightens what code declares); reading a policy from a file
(``_files``); where the gate gets them (``_source``: a fixed set, or ``_redis``: the
policy plane, watched, with a grace window); and the skeleton written from a recorded
tool surface (``_skeleton``, ``_surface``).
See docs/policy.md.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

if TYPE_CHECKING:
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
    from ._redis import PolicySourceUnavailable, RedisPolicySource
    from ._skeleton import SurfaceEntry, merge_surface, skeleton_yaml, surface_entry_doc
    from ._source import (
        PolicySource,
        PolicyView,
        StaticPolicySource,
        SurfaceLog,
        get_policy_source,
        set_policy_source,
    )

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._evaluation": ("Admission", "PolicyInForce", "PolicySet"),
    "._files": ("load_policy_file", "load_policy_text", "policies_from_documents"),
    "._jsonpath": (
        "JSON_PATH_PATTERN", "JsonPath", "JsonPathError", "JsonPathMissing", "compile_path",
    ),
    "._model": (
        "AppliesTo", "Compensate", "PolicyError", "PolicyRule", "SagaPolicy",
        "ToolDeclaration", "parse_policy",
    ),
    "._redis": ("PolicySourceUnavailable", "RedisPolicySource"),
    "._skeleton": ("SurfaceEntry", "merge_surface", "skeleton_yaml", "surface_entry_doc"),
    "._source": (
        "PolicySource", "PolicyView", "StaticPolicySource", "SurfaceLog",
        "get_policy_source", "set_policy_source",
    ),
}

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
    "PolicySource",
    "PolicySourceUnavailable",
    "PolicyView",
    "RedisPolicySource",
    "SagaPolicy",
    "StaticPolicySource",
    "SurfaceEntry",
    "SurfaceLog",
    "ToolDeclaration",
    "compile_path",
    "get_policy_source",
    "load_policy_file",
    "load_policy_text",
    "merge_surface",
    "parse_policy",
    "policies_from_documents",
    "set_policy_source",
    "skeleton_yaml",
    "surface_entry_doc",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
