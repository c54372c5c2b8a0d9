"""A short session of the proxy's own with a Streamable HTTP server: ``call_tool_http``
initializes, calls one tool, and DELETEs the session — how an inverse is called on an
HTTP upstream when no client session is left (the rollback of an abandoned session, the
recovery daemon after a crash; ``agent_saga.mcp.upstreams``).

Invariants:
- With credentials in custody (``_custody``), every request carries them and every answer
  is masked before it is read; ``CredentialUnavailable`` before anything is sent.
- It raises unless the tool confirmed it acted (an error, ``isError``, an answer the
  proxy refuses to read, no answer): the caller escalates, never reports an undo.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from . import _http as http
from ._custody import Custody, masked
from ._stdio import PROTOCOL_VERSION, UpstreamGone, tool_result
from ._wire import Unreadable, encode, parse

__all__ = ["call_tool_http"]


async def _post(url: str, msg: Mapping[str, Any], sid: str | None, want: Any = None,
                custody: Custody | None = None) -> tuple[Any, str | None]:
    headers = [("Content-Type", "application/json"), ("Accept", "application/json, text/event-stream"),
               ("MCP-Protocol-Version", PROTOCOL_VERSION)]
    if sid:
        headers.append(("Mcp-Session-Id", sid))
    if custody:
        headers += custody.headers()
    resp = await http.request(url, "POST", headers, encode(msg))
    try:
        new_sid = http.header(resp.headers, "mcp-session-id") or sid
        if want is None:
            await resp.body()
            return None, new_sid
        if resp.content_type == "text/event-stream":
            async for _, doc in http.sse_events(masked(resp.chunks(), custody)):
                if isinstance(doc, Unreadable) and doc.id == want:
                    raise RuntimeError(f"{url} answered with a message agent-saga refuses: {doc.message}")
                if isinstance(doc, dict) and "method" not in doc and doc.get("id") == want:
                    return doc, new_sid
            raise UpstreamGone(f"{url} closed its event stream before answering")
        try:
            body = await resp.body()
            return parse(custody.redact(body) if custody else body), new_sid
        except Unreadable as exc:
            raise RuntimeError(f"{url} answered with a message agent-saga refuses: {exc.message}") from None
    finally:
        resp.close()


async def call_tool_http(url: str, tool: str, arguments: Mapping[str, Any], *,
                         meta: Mapping[str, Any] | None = None, timeout: float = 60.0,
                         custody: Custody | None = None) -> dict[str, Any]:
    """``call_tool_once`` for a Streamable HTTP server: initialize, one ``tools/call``,
    DELETE the session; the call's ``result`` (raises if it did not happen;
    ``CredentialUnavailable`` before anything is sent)."""
    custody = custody if custody else None
    async with asyncio.timeout(timeout):
        init, sid = await _post(url, {"jsonrpc": "2.0", "id": "agent-saga:init", "method": "initialize", "params": {
            "protocolVersion": PROTOCOL_VERSION, "capabilities": {},
            "clientInfo": {"name": "agent-saga-recovery", "version": "1"}}}, None, "agent-saga:init", custody)
        if "error" in init:
            raise RuntimeError(f"initialize was refused: {init['error']}")
        await _post(url, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid, custody=custody)
        params: dict[str, Any] = {"name": tool, "arguments": dict(arguments)}
        if meta:
            params["_meta"] = dict(meta)
        resp, sid = await _post(url, {"jsonrpc": "2.0", "id": "agent-saga:call", "method": "tools/call",
                                      "params": params}, sid, "agent-saga:call", custody)
        if sid:
            with contextlib.suppress(Exception):
                done = await http.request(url, "DELETE", [("Mcp-Session-Id", sid), *(custody.headers() if custody
                                                                                      else [])])
                done.close()
        return tool_result(resp, tool)
