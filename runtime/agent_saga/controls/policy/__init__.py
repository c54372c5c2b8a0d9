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
    from ._evaluation import Admission as Admission
    from ._evaluation import PolicyInForce as PolicyInForce
    from ._evaluation import PolicySet as PolicySet
    from ._files import load_policy_file as load_policy_file
    from ._files import load_policy_text as load_policy_text
    from ._files import policies_from_documents as policies_from_documents
    from ._jsonpath import JSON_PATH_PATTERN as JSON_PATH_PATTERN
    from ._jsonpath import JsonPath as JsonPath
    from ._jsonpath import JsonPathError as JsonPathError
    from ._jsonpath import JsonPathMissing as JsonPathMissing
    from ._jsonpath import compile_path as compile_path
    from ._model import AppliesTo as AppliesTo
    from ._model import Compensate as Compensate
    from ._model import PolicyError as PolicyError
    from ._model import PolicyRule as PolicyRule
    from ._model import SagaPolicy as SagaPolicy
    from ._model import ToolDeclaration as ToolDeclaration
    from ._model import parse_policy as parse_policy
    from ._redis import PolicySourceUnavailable as PolicySourceUnavailable
    from ._redis import RedisPolicySource as RedisPolicySource
    from ._skeleton import SurfaceEntry as SurfaceEntry
    from ._skeleton import merge_surface as merge_surface
    from ._skeleton import skeleton_yaml as skeleton_yaml
    from ._skeleton import surface_entry_doc as surface_entry_doc
    from ._source import PolicySource as PolicySource
    from ._source import PolicyView as PolicyView
    from ._source import StaticPolicySource as StaticPolicySource
    from ._source import SurfaceLog as SurfaceLog
    from ._source import get_policy_source as get_policy_source
    from ._source import set_policy_source as set_policy_source

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
