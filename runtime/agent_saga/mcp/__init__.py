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
    from ._httpcall import call_tool_http
    from ._httpproxy import HttpProxy
    from ._observe import Surface
    from ._plane import OnePolicy, plane_policy
    from ._proxy import ClientChannel, McpProxy, stdio_client_channel
    from ._run import ProxyOptions, run_proxy
    from ._session import (
        COMMIT_TOOL,
        ROLLBACK_TOOL,
        Boundary,
        OutcomeUnknown,
        ToolSession,
        result_document,
    )
    from ._stdio import StdioUpstream, UpstreamGone, call_tool_once
    from .upstreams import (
        ENV_UPSTREAMS,
        IDEMPOTENCY_META,
        UpstreamSpec,
        handler_name,
        load_upstreams,
        register_upstream,
    )

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._httpcall": ("call_tool_http",),
    "._httpproxy": ("HttpProxy",),
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

__all__ = [
    "Boundary",
    "COMMIT_TOOL",
    "ClientChannel",
    "ENV_UPSTREAMS",
    "HttpProxy",
    "IDEMPOTENCY_META",
    "McpProxy",
    "OnePolicy",
    "OutcomeUnknown",
    "ProxyOptions",
    "ROLLBACK_TOOL",
    "StdioUpstream",
    "Surface",
    "ToolSession",
    "UpstreamGone",
    "UpstreamSpec",
    "call_tool_http",
    "call_tool_once",
    "handler_name",
    "load_upstreams",
    "plane_policy",
    "register_upstream",
    "result_document",
    "run_proxy",
    "stdio_client_channel",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
