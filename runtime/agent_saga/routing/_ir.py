"""The IR: one request and one answer shape for every model host.

    request = ModelRequest(
        messages=(Message("system", "You book meetings."), Message("user", "Tuesday 3pm?")),
        tools=(Tool("book", "Book a slot", {"type": "object", "properties": {...}}),),
        json_mode=False, max_tokens=256, stop=("\\n\\n",))

A host turns a ``ModelRequest`` into a ``HostAnswer`` (text, tool calls, token usage);
the router wraps it into a ``ModelResponse`` that also carries the ``RoutingDecision``.

Invariants:
- Every value is immutable and JSON-safe (``to_doc``): a request can be recorded, and an
  OpenAI-compatible body is derived from it without loss.
- Tool-call arguments are kept as the raw text the model produced (``arguments_raw``);
  ``arguments`` is the parsed object, ``None`` when the text is not a JSON object (the
  router repairs or refuses such an action, never guesses).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring
from typing import Any, Literal

from ..errors import ConfigurationError
from ..records import canonical_json

__all__ = ["HostAnswer", "Message", "ModelRequest", "Tool", "ToolCall", "Usage", "estimate_tokens"]

Role = Literal["system", "user", "assistant", "tool"]
_ROLES = ("system", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the model asked for: ``name`` and the arguments it wrote."""

    id: str
    name: str
    arguments_raw: str = "{}"

    @property
    def arguments(self) -> dict[str, Any] | None:
        """The arguments as a JSON object, or ``None`` when they are not one."""
        try:
            value = json.loads(self.arguments_raw)
        except (ValueError, TypeError):
            return None
        return value if isinstance(value, dict) else None

    def to_doc(self) -> dict[str, Any]:
        """The OpenAI chat-completions shape of the call."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments_raw}}


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message. ``tool_calls`` on an assistant message; ``tool_call_id`` on a
    ``tool`` message (the answer to that call)."""

    role: Role
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def __post_init__(self) -> None:
        if self.role not in _ROLES:
            raise ConfigurationError(f"Message role must be one of {', '.join(_ROLES)}, got {self.role!r}")
        if not isinstance(self.content, str):
            raise ConfigurationError(f"Message content must be a string, got {type(self.content).__name__}")

    def to_doc(self) -> dict[str, Any]:
        """The OpenAI chat-completions shape of the message."""
        doc: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            doc["tool_calls"] = [c.to_doc() for c in self.tool_calls]
        if self.tool_call_id is not None:
            doc["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            doc["name"] = self.name
        return doc


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model may call: its name, what it does, and its JSON-Schema parameters."""

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = field(default_factory=lambda: {"type": "object", "properties": {}})

    def to_doc(self) -> dict[str, Any]:
        """The OpenAI chat-completions shape of the tool."""
        return {"type": "function",
                "function": {"name": self.name, "description": self.description, "parameters": dict(self.parameters)}}


def estimate_tokens(text: str) -> int:
    """A conservative token estimate for ``text`` (4 characters a token, rounded up): what
    the router compares with a host's declared context window unless told otherwise."""
    return (len(text) + 3) // 4


@dataclass(frozen=True, slots=True)
class ModelRequest:
    """What the agent asks of a model, whatever the host (see the module doc).

    ``json_mode``: the answer must be a JSON object. ``max_tokens``: the most the answer
    may use (``None``: the host's default; counted as 0 toward the context window).
    ``stop``: sequences that end the answer.
    """

    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    json_mode: bool = False
    max_tokens: int | None = None
    stop: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.messages, Message) or not isinstance(self.messages, tuple | list):
            raise ConfigurationError("ModelRequest messages must be a tuple of Message(...)")
        if not self.messages:
            raise ConfigurationError("ModelRequest needs at least one message")
        for i, m in enumerate(self.messages):
            if not isinstance(m, Message):
                raise ConfigurationError(f"ModelRequest messages[{i}] must be a Message(...), got {type(m).__name__}")
        if self.max_tokens is not None and (isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int)
                                            or self.max_tokens < 1):
            raise ConfigurationError(f"ModelRequest max_tokens must be a positive integer or None, got {self.max_tokens!r}")
        if isinstance(self.stop, str):
            raise ConfigurationError(f"ModelRequest stop must be a tuple of strings, not the string {self.stop!r}")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"ModelRequest tools must have unique names, got {names}")
        object.__setattr__(self, "messages", tuple(self.messages))
        object.__setattr__(self, "tools", tuple(self.tools))
        object.__setattr__(self, "stop", tuple(self.stop))

    def prompt_tokens(self) -> int:
        """The estimated tokens of the messages and tool definitions (``estimate_tokens``)."""
        # estimate_tokens(m.content) + 4 per message, without a call per message:
        # (len + 3) // 4 + 4 == (len + 19) // 4
        n = 0
        for m in self.messages:
            n += (len(m.content) + 19) // 4
        if self.tools:
            n += estimate_tokens(json.dumps([t.to_doc() for t in self.tools]))
        return n

    def needed_tokens(self) -> int:
        """The context window this request needs: the prompt plus ``max_tokens``."""
        return self.prompt_tokens() + (self.max_tokens or 0)

    def with_messages(self, *extra: Message) -> ModelRequest:
        """The same request with ``extra`` messages appended."""
        return ModelRequest(self.messages + extra, self.tools, self.json_mode, self.max_tokens, self.stop)

    def canonical_text(self) -> str:
        """``canonical_json(self.to_doc())``, built without the intermediate documents
        (the router hashes it for every call: ``RoutingDecision.prompt_sha256``)."""
        parts = []
        if self.max_tokens is not None:
            parts.append(f'"max_tokens":{int.__repr__(self.max_tokens)}')
        messages = []
        for m in self.messages:  # a plain message without a call per message
            if not m.tool_calls and m.tool_call_id is None and m.name is None and m.content.__class__ is str:
                messages.append(f'{{"content":{encode_basestring(m.content)},"role":"{m.role}"}}')
            else:
                messages.append(canonical_json(m.to_doc()))
        parts.append('"messages":[' + ",".join(messages) + "]")
        if self.json_mode:
            parts.append('"response_format":{"type":"json_object"}')
        if self.stop:
            parts.append(f'"stop":{canonical_json(list(self.stop))}')
        if self.tools:
            parts.append(f'"tools":{canonical_json([t.to_doc() for t in self.tools])}')
        return "{" + ",".join(parts) + "}"

    def to_doc(self) -> dict[str, Any]:
        """The request as JSON (the OpenAI body's fields, without the model)."""
        doc: dict[str, Any] = {"messages": [m.to_doc() for m in self.messages]}
        if self.tools:
            doc["tools"] = [t.to_doc() for t in self.tools]
        if self.json_mode:
            doc["response_format"] = {"type": "json_object"}
        if self.max_tokens is not None:
            doc["max_tokens"] = self.max_tokens
        if self.stop:
            doc["stop"] = list(self.stop)
        return doc


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one call used, as the host reported them (``reported=False``: the host said
    nothing, and these are the router's estimates)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reported: bool = True

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion."""
        return self.prompt_tokens + self.completion_tokens

    def to_doc(self) -> dict[str, Any]:
        """The usage as JSON."""
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.total_tokens, "reported": self.reported}


@dataclass(frozen=True, slots=True)
class HostAnswer:
    """What one host answered: text, tool calls, why it stopped, and the tokens used."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    finish_reason: str = "stop"
    usage: Usage = field(default_factory=lambda: Usage(reported=False))
    model: str = ""

    def as_message(self) -> Message:
        """The answer as the assistant message to append to the conversation."""
        return Message("assistant", self.content, self.tool_calls)
