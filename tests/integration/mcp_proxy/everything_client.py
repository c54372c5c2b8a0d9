"""One session of the official MCP SDK client with the reference "everything" server, run
twice by test_mcp_everything.py (directly, and through ``agent-saga mcp --listen``): every
feature the server exercises, what the client saw, and every HTTP body it received, as
the bytes that arrived (an httpx transport that copies each response stream)."""

from __future__ import annotations

import base64
import binascii
import json
import re
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import httpx2
from mcp import ClientSession, types
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError


@dataclass
class Exchange:
    """One HTTP request of the client and the response body it received."""

    method: str
    request: bytes
    status: int
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)


class _Copy(httpx2.AsyncByteStream):
    def __init__(self, inner: httpx2.AsyncByteStream, into: bytearray) -> None:
        self.inner = inner
        self.into = into

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.into += chunk
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


class Recording(httpx2.AsyncBaseTransport):
    """An HTTP transport that keeps every exchange as it went over the wire."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.exchanges: list[Exchange] = []

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        resp = await self.inner.handle_async_request(request)
        ex = Exchange(request.method, request.content if request.method == "POST" else b"", resp.status_code,
                      {k.lower(): v for k, v in resp.headers.items()})
        self.exchanges.append(ex)
        resp.stream = _Copy(resp.stream, ex.body)  # type: ignore[arg-type]
        return resp

    async def aclose(self) -> None:
        await self.inner.aclose()


@dataclass
class Seen:
    """What one session showed the client."""

    results: dict[str, Any] = field(default_factory=dict)
    asked: list[Any] = field(default_factory=list)      # the server's requests, as the callbacks got them
    notes: list[Any] = field(default_factory=list)      # the server's notifications
    progress: list[Any] = field(default_factory=list)
    exchanges: list[Exchange] = field(default_factory=list)
    session_id: str = ""


def _dump(x: Any) -> Any:
    return x.model_dump(mode="json", by_alias=True, exclude_none=True)


async def _first(events: list[Any], what: str, pred: Any) -> Any:
    with anyio.fail_after(60):
        while True:
            for e in events:
                if pred(e):
                    return e
            await anyio.sleep(0.01)  # polled, with the deadline above


async def run(url: str) -> Seen:
    """The session (see the module doc)."""
    seen = Seen()
    transport = Recording()
    seen.exchanges = transport.exchanges

    async def sampling(ctx: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        seen.asked.append(("sampling/createMessage", _dump(params)))
        return types.CreateMessageResult(role="assistant", content=types.TextContent(type="text", text="a sample"),
                                         model="test-model", stop_reason="endTurn")

    async def elicit(ctx: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        seen.asked.append(("elicitation/create", _dump(params)))
        return types.ElicitResult(action="accept", content={"name": "Ada", "check": True, "email": "ada@example.com"})

    async def roots(ctx: Any) -> types.ListRootsResult:
        seen.asked.append(("roots/list",))
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/project", name="project")])

    async def on_message(message: Any) -> None:
        if not isinstance(message, Exception):
            seen.notes.append(_dump(message))

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.progress.append((progress, total))

    r = seen.results
    async with httpx2.AsyncClient(transport=transport, timeout=httpx2.Timeout(30, read=300)) as http, \
            streamable_http_client(url, http_client=http) as (rd, wr), \
            ClientSession(rd, wr, sampling_callback=sampling, elicitation_callback=elicit, list_roots_callback=roots,
                          message_handler=on_message) as s:
        r["initialize"] = _dump(await s.initialize())
        # the server asks for the client's roots on the GET stream once initialized
        await _first(seen.notes, "roots logged", lambda n: "Roots updated" in json.dumps(n))
        r["tools"] = _dump(await s.list_tools())
        r["ping"] = _dump(await s.send_ping())
        r["echo"] = _dump(await s.call_tool("echo", {"message": "h\u00e9llo \u2603 \"quoted\""}))
        r["sum"] = _dump(await s.call_tool("get-sum", {"a": 2.5, "b": 40}))
        r["structured"] = _dump(await s.call_tool("get-structured-content", {"location": "Chicago"}))
        r["image"] = _dump(await s.call_tool("get-tiny-image", {}))
        r["long"] = _dump(await s.call_tool("trigger-long-running-operation", {"duration": 0.3, "steps": 3},
                                            progress_callback=on_progress))
        r["sampling"] = _dump(await s.call_tool("trigger-sampling-request", {"prompt": "say hi", "maxTokens": 7}))
        r["elicitation"] = _dump(await s.call_tool("trigger-elicitation-request", {}))
        r["roots"] = _dump(await s.call_tool("get-roots-list", {}))
        r["prompts"] = _dump(await s.list_prompts())
        r["prompt"] = _dump(await s.get_prompt("args-prompt", {"city": "Paris", "state": "IDF"}))
        r["resource-prompt"] = _dump(await s.get_prompt("resource-prompt", {"resourceType": "Blob", "resourceId": "2"}))
        r["complete"] = _dump(await s.complete(types.PromptReference(type="ref/prompt", name="completable-prompt"),
                                               {"name": "department", "value": "E"}))
        r["resources"] = _dump(await s.list_resources())
        r["templates"] = _dump(await s.list_resource_templates())
        r["static"] = _dump(await s.read_resource("demo://resource/static/document/features.md"))
        r["blob"] = _dump(await s.read_resource("demo://resource/dynamic/blob/3"))
        with warnings.catch_warnings():  # deprecated in the SDK's newest protocol, still this server's
            warnings.simplefilter("ignore")
            await s.set_logging_level("debug")
            r["subscribe"] = _dump(await s.subscribe_resource("demo://resource/dynamic/text/1"))
        await s.call_tool("toggle-subscriber-updates", {})
        await s.call_tool("toggle-simulated-logging", {})
        await _first(seen.notes, "resources/updated", lambda n: n.get("method") == "notifications/resources/updated")
        await _first(seen.notes, "a simulated log", lambda n: "level message" in json.dumps(n).lower().replace("-", " "))
        await s.call_tool("toggle-subscriber-updates", {})
        await s.call_tool("toggle-simulated-logging", {})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            r["unsubscribe"] = _dump(await s.unsubscribe_resource("demo://resource/dynamic/text/1"))
        # cancellation: the client gives up on a long call once it has started
        started = anyio.Event()

        async def first_progress(progress: float, total: float | None, message: str | None) -> None:
            started.set()

        async with anyio.create_task_group() as tg:
            async def long_call() -> None:
                await s.call_tool("trigger-long-running-operation", {"duration": 30, "steps": 60},
                                  progress_callback=first_progress)

            tg.start_soon(long_call)
            await started.wait()
            tg.cancel_scope.cancel()
        r["after-cancel"] = _dump(await s.call_tool("echo", {"message": "still here"}))
        try:
            await s.call_tool("get-env", {})
            r["get-env"] = "answered"
        except MCPError as exc:
            r["get-env"] = {"code": exc.error.code, "message": exc.error.message}
    seen.session_id = next((e.headers["mcp-session-id"] for e in transport.exchanges
                            if "mcp-session-id" in e.headers), "")
    return seen


_EVENT_ID = re.compile(rb"^id: [0-9a-f-]{36}$", re.M)
_TIME = re.compile(rb"\d{1,2}:\d{2}:\d{2} [AP]M")
_RANDOM_LOG = re.compile(rb'"level":"\w+","data":"\w+[ -]level[ -]message')
_BLOB = re.compile(rb'("blob": ?")([A-Za-z0-9+/=]+)"')


def _blob(m: re.Match[bytes]) -> bytes:
    try:
        text = base64.b64decode(m.group(2), validate=True)
    except binascii.Error:
        return m.group(0)
    return m.group(1) + base64.b64encode(_TIME.sub(b"TIME", text)) + b'"'


def normalized(body: bytes, session_id: str) -> bytes:
    """A body with what differs between two sessions of the server replaced: its event ids
    (random UUIDs), its session id, the clock time in generated resources (in their text
    or their base64 blob), and the level
    of a simulated log message (drawn at random)."""
    body = _EVENT_ID.sub(b"id: EVENT", body)
    body = body.replace(session_id.encode(), b"SESSION") if session_id else body
    body = _BLOB.sub(_blob, _TIME.sub(b"TIME", body))
    return _RANDOM_LOG.sub(b'"level":"LEVEL","data":"LEVEL message', body)


def note(n: dict[str, Any], session_id: str) -> bytes:
    """A notification as the client read it, normalized."""
    return normalized(json.dumps(n, separators=(",", ":"), ensure_ascii=False).encode(), session_id)


def events(body: bytes) -> list[bytes]:
    """The SSE events of a body, each as its bytes; comments alone (the server's timed
    ``: keepalive``) left out."""
    return [e + b"\n\n" for e in body.replace(b"\r\n", b"\n").split(b"\n\n")
            if e and not all(line.startswith(b":") for line in e.split(b"\n"))]
