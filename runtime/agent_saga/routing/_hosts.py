"""Model hosts: an OpenAI-compatible HTTP endpoint, or a Python callable in this process.

    local = OpenAIHost("local-7b", "http://127.0.0.1:8080/v1", "llama-3.1-8b-instruct",
                       Capabilities(context_tokens=8192, cost_class="Free"))
    api = OpenAIHost("frontier", "https://api.example.com/v1", "big-model",
                     Capabilities(context_tokens=200_000, tools=True, json_mode=True, cost_class="High"),
                     credential_ref="frontier-api-key")
    echo = CallableHost("echo", lambda request: HostAnswer(content="hi"), Capabilities(4096))

Invariants:
- Capabilities are declared, never guessed: the router filters on what a host says it can do.
- A host failure is a ``HostError`` whose ``kind`` says what went wrong (``rate_limited``,
  ``server_error``, ``timeout``, ``slow_stream``, ``unreachable``, ``client_error``,
  ``bad_response``, ``error``); the router fails over on every kind.
- The API key is resolved through ``resolve_credential(credential_ref)`` at the moment of
  the call and sent only in the ``Authorization`` header; no message, record or log line
  carries it (error texts pass through the secret scrubber).
- HTTP is the standard library's ``http.client``: no SDK in the runtime. ``stream=True``
  reads server-sent events and gives up when no chunk arrives for ``stall_timeout``
  seconds or the whole answer takes longer than ``timeout`` (a slow stream).
"""

from __future__ import annotations

import abc
import http.client
import json
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from ..credentials import redact_secrets, resolve_credential
from ..errors import ConfigurationError
from ._ir import HostAnswer, ModelRequest, ToolCall, Usage

__all__ = ["COST_CLASSES", "CallableHost", "Capabilities", "Host", "HostError", "OpenAIHost"]

CostClass = Literal["Free", "Low", "Medium", "High"]
#: The cost classes, cheapest first (what ``max_cost_class`` compares by).
COST_CLASSES: tuple[str, ...] = ("Free", "Low", "Medium", "High")
HostErrorKind = Literal["rate_limited", "server_error", "timeout", "slow_stream", "unreachable",
                        "client_error", "bad_response", "error"]


class HostError(Exception):
    """A host did not produce an answer; ``kind`` says how (see the module doc)."""

    def __init__(self, kind: HostErrorKind, message: str, *, status: int | None = None) -> None:
        self.kind = kind
        self.status = status
        super().__init__(redact_secrets(message))


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a host can do, as declared: its context window (tokens), native tool calling,
    constrained JSON output, and its cost class (Free, Low, Medium, High)."""

    context_tokens: int
    tools: bool = False
    json_mode: bool = False
    cost_class: CostClass = "Medium"

    def __post_init__(self) -> None:
        if isinstance(self.context_tokens, bool) or not isinstance(self.context_tokens, int) \
                or self.context_tokens < 1:
            raise ConfigurationError(f"Capabilities context_tokens must be a positive integer, got "
                                     f"{self.context_tokens!r}")
        if self.cost_class not in COST_CLASSES:
            raise ConfigurationError(f"Capabilities cost_class must be one of {', '.join(COST_CLASSES)}, got "
                                     f"{self.cost_class!r}")

    def to_doc(self) -> dict[str, Any]:
        """The capabilities as JSON (ModelRoute's field names)."""
        return {"contextTokens": self.context_tokens, "tools": self.tools, "jsonMode": self.json_mode,
                "costClass": self.cost_class}


class Host(abc.ABC):
    """One model behind one endpoint: a name, a model id, declared capabilities."""

    name: str
    model: str
    capabilities: Capabilities

    def __init__(self, name: str, model: str, capabilities: Capabilities) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"a host needs a name (what decisions call it), got {name!r}")
        if not isinstance(capabilities, Capabilities):
            raise ConfigurationError(f"host {name}: capabilities must be Capabilities(context_tokens=...), got "
                                     f"{capabilities!r}")
        self.name, self.model, self.capabilities = name, model, capabilities

    @abc.abstractmethod
    def complete(self, request: ModelRequest, *, timeout: float) -> HostAnswer:
        """Answer ``request`` within ``timeout`` seconds, or raise ``HostError``."""

    def describe(self) -> str:
        """How decisions name the host (never a credential)."""
        return f"{self.name} ({self.model})"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, model={self.model!r})"


class CallableHost(Host):
    """A model in this process: ``fn(request) -> HostAnswer | str``. An exception it raises
    is a host failure (the router fails over); a ``HostError`` keeps its kind."""

    def __init__(self, name: str, fn: Callable[[ModelRequest], HostAnswer | str], capabilities: Capabilities,
                 *, model: str = "in-process") -> None:
        if not callable(fn):
            raise ConfigurationError(f"CallableHost {name}: fn must be callable(request) -> HostAnswer, got {fn!r}")
        super().__init__(name, model, capabilities)
        self.fn = fn

    def complete(self, request: ModelRequest, *, timeout: float) -> HostAnswer:
        """Call ``fn`` (``timeout`` is not enforced on a callable in this process)."""
        try:
            out = self.fn(request)
        except HostError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of the callable is the host's
            raise HostError("error", f"{type(exc).__name__}: {exc}") from exc
        if isinstance(out, str):
            return HostAnswer(content=out, model=self.model)
        if not isinstance(out, HostAnswer):
            raise HostError("bad_response", f"the callable returned {type(out).__name__}, not a HostAnswer or str")
        return out


class OpenAIHost(Host):
    """An OpenAI-compatible chat-completions endpoint (``POST {endpoint}/chat/completions``).

    ``credential_ref``: the name the credential resolver maps to the API key (``None``: no
    key, e.g. a local server). ``timeout``: seconds for the whole answer (the router's
    per-call timeout, when smaller, wins). ``stream``: read the answer as server-sent
    events, and fail with ``slow_stream`` when no chunk arrives for ``stall_timeout``.
    """

    def __init__(self, name: str, endpoint: str, model: str, capabilities: Capabilities, *,
                 credential_ref: str | None = None, timeout: float = 60.0, stream: bool = False,
                 stall_timeout: float = 10.0) -> None:
        super().__init__(name, model, capabilities)
        parts = urllib.parse.urlsplit(endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigurationError(f"host {name}: endpoint must be an http:// or https:// base URL such as "
                                     f"http://127.0.0.1:8080/v1, got {endpoint!r}")
        if parts.username or parts.password:
            raise ConfigurationError(f"host {name}: the endpoint must not carry credentials; name a Secret in "
                                     f"credential_ref instead")
        self.endpoint = endpoint.rstrip("/")
        self.credential_ref = credential_ref
        self.timeout = float(timeout)
        self.stream = stream
        self.stall_timeout = float(stall_timeout)
        self._https = parts.scheme == "https"
        self._hostport = (parts.hostname, parts.port)
        self._path = (parts.path.rstrip("/") or "") + "/chat/completions"

    def body(self, request: ModelRequest) -> dict[str, Any]:
        """The chat-completions request body for ``request``."""
        doc = {"model": self.model, **request.to_doc()}
        if self.stream:
            doc["stream"] = True
            doc["stream_options"] = {"include_usage": True}
        return doc

    def complete(self, request: ModelRequest, *, timeout: float) -> HostAnswer:
        """One POST; raises ``HostError`` for every way it can fail (module doc)."""
        budget = min(timeout, self.timeout)
        deadline = time.monotonic() + budget
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self.credential_ref is not None:
            try:
                headers["Authorization"] = f"Bearer {resolve_credential(self.credential_ref)}"
            except ConfigurationError as exc:
                raise HostError("error", f"the API key could not be resolved: {exc}") from None
        data = json.dumps(self.body(request)).encode()
        host, port = self._hostport
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        read_timeout = min(budget, self.stall_timeout) if self.stream else budget
        conn = cls(host, port, timeout=read_timeout)
        try:
            try:
                conn.request("POST", self._path, body=data, headers=headers)
                resp = conn.getresponse()
            except TimeoutError:
                raise HostError("timeout", f"no answer within {budget:g}s") from None
            except OSError as exc:
                raise HostError("unreachable", f"{self.endpoint} could not be reached ({type(exc).__name__}: "
                                               f"{exc})") from None
            if resp.status >= 400:
                raw = _read(resp, deadline, budget)
                text = raw.decode(errors="replace")[:300]
                if resp.status == 429:
                    raise HostError("rate_limited", f"429 rate limited: {text}", status=429)
                kind: HostErrorKind = "server_error" if resp.status >= 500 else "client_error"
                raise HostError(kind, f"{resp.status}: {text}", status=resp.status)
            if self.stream:
                return self._read_stream(resp, deadline, budget)
            return _parse(_read(resp, deadline, budget), self.model)
        finally:
            conn.close()

    def _read_stream(self, resp: http.client.HTTPResponse, deadline: float, budget: float) -> HostAnswer:
        content: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        finish, usage, model = "stop", None, self.model
        while True:
            if time.monotonic() > deadline:
                raise HostError("slow_stream", f"the stream did not finish within {budget:g}s")
            try:
                line = resp.readline()
            except TimeoutError:
                raise HostError("slow_stream", f"the stream stalled: no chunk for {self.stall_timeout:g}s") from None
            except OSError as exc:
                raise HostError("unreachable", f"the stream broke ({type(exc).__name__})") from None
            if not line:
                break
            line = line.strip()
            if not line.startswith(b"data:"):
                continue
            payload = line[5:].strip()
            if payload == b"[DONE]":
                break
            try:
                chunk = json.loads(payload)
            except ValueError:
                raise HostError("bad_response", f"a stream chunk is not JSON: {payload[:120]!r}") from None
            model = chunk.get("model") or model
            if chunk.get("usage"):
                usage = _usage(chunk["usage"])
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                content.append(delta.get("content") or "")
                for tc in delta.get("tool_calls") or ():
                    slot = calls.setdefault(int(tc.get("index", 0)), {"id": "", "name": "", "arguments": ""})
                    slot["id"] = tc.get("id") or slot["id"]
                    fn = tc.get("function") or {}
                    slot["name"] += fn.get("name") or ""
                    slot["arguments"] += fn.get("arguments") or ""
                finish = choice.get("finish_reason") or finish
        tool_calls = tuple(ToolCall(c["id"] or f"call_{i}", c["name"], c["arguments"] or "{}")
                           for i, c in sorted(calls.items()))
        return HostAnswer("".join(content), tool_calls, finish, usage or Usage(reported=False), model)


def _read(resp: http.client.HTTPResponse, deadline: float, budget: float) -> bytes:
    chunks: list[bytes] = []
    while True:
        if time.monotonic() > deadline:
            raise HostError("timeout", f"the answer did not arrive within {budget:g}s")
        try:
            chunk = resp.read1(65536)
        except TimeoutError:
            raise HostError("timeout", f"no answer within {budget:g}s") from None
        except OSError as exc:
            raise HostError("unreachable", f"the answer broke off ({type(exc).__name__})") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def _usage(doc: Any) -> Usage | None:
    if not isinstance(doc, dict):
        return None
    return Usage(int(doc.get("prompt_tokens") or 0), int(doc.get("completion_tokens") or 0))


def _parse(raw: bytes, model: str) -> HostAnswer:
    try:
        doc = json.loads(raw)
        choice = doc["choices"][0]
        msg = choice.get("message") or {}
    except (ValueError, KeyError, IndexError, TypeError, AttributeError):
        raise HostError("bad_response", f"not a chat-completions answer: {raw[:200]!r}") from None
    calls = tuple(ToolCall(str(tc.get("id") or f"call_{i}"), str((tc.get("function") or {}).get("name") or ""),
                           str((tc.get("function") or {}).get("arguments") or "{}"))
                  for i, tc in enumerate(msg.get("tool_calls") or ()))
    return HostAnswer(str(msg.get("content") or ""), calls, str(choice.get("finish_reason") or "stop"),
                      _usage(doc.get("usage")) or Usage(reported=False), str(doc.get("model") or model))
