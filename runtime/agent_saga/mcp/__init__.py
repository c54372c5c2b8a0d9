"""The MCP proxy: the same guarantees for an agent that cannot be changed.

    agent-saga mcp --policy saga-policy.json --name payments -- python -m my_mcp_server

A JSON-RPC proxy between an MCP client and one MCP server (no MCP SDK inside, so it works
with any server): ``tools/call`` requests pass the whole gate and are logged as saga
steps, COMPENSABLE ones with the inverse derived from their result; everything else is
forwarded verbatim (``_proxy`` for stdio servers, ``_httpproxy`` for Streamable HTTP). Where the boundary of a saga comes from is
``--boundary`` (``_session``); how a process other than the proxy reaches the server to
undo a call is a named upstream (``upstreams``). See docs/mcp.md.
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._httpcall import call_tool_http as call_tool_http
    from ._httpproxy import HttpProxy as HttpProxy
    from ._loop import loop_factory as loop_factory
    from ._observe import Surface as Surface
    from ._plane import OnePolicy as OnePolicy
    from ._plane import plane_policy as plane_policy
    from ._proxy import ClientChannel as ClientChannel
    from ._proxy import McpProxy as McpProxy
    from ._proxy import stdio_client_channel as stdio_client_channel
    from ._run import ProxyOptions as ProxyOptions
    from ._run import run_proxy as run_proxy
    from ._session import COMMIT_TOOL as COMMIT_TOOL
    from ._session import ROLLBACK_TOOL as ROLLBACK_TOOL
    from ._session import Boundary as Boundary
    from ._session import OutcomeUnknown as OutcomeUnknown
    from ._session import ToolSession as ToolSession
    from ._session import result_document as result_document
    from ._stdio import StdioUpstream as StdioUpstream
    from ._stdio import UpstreamGone as UpstreamGone
    from ._stdio import call_tool_once as call_tool_once
    from .upstreams import ENV_UPSTREAMS as ENV_UPSTREAMS
    from .upstreams import IDEMPOTENCY_META as IDEMPOTENCY_META
    from .upstreams import UpstreamSpec as UpstreamSpec
    from .upstreams import handler_name as handler_name
    from .upstreams import load_upstreams as load_upstreams
    from .upstreams import register_upstream as register_upstream

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._httpcall": ("call_tool_http",),
    "._httpproxy": ("HttpProxy",),
    "._loop": ("loop_factory",),
    "._observe": ("Surface",),
    "._plane": ("OnePolicy", "plane_policy"),
    "._proxy": ("ClientChannel", "McpProxy", "stdio_client_channel"),
    "._run": ("ProxyOptions", "run_proxy"),
    "._session": (
        "COMMIT_TOOL", "ROLLBACK_TOOL", "Boundary", "OutcomeUnknown", "ToolSession",
        "result_document",
    ),
    "._stdio": ("StdioUpstream", "UpstreamGone", "call_tool_once"),
    ".upstreams": (
        "ENV_UPSTREAMS", "IDEMPOTENCY_META", "UpstreamSpec", "handler_name",
        "load_upstreams", "register_upstream",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
