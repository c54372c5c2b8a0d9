"""JSON-RPC 2.0 as the proxy reads it: classify a message, build errors, frame lines.

MCP's stdio transport is one JSON-RPC message (or batch) per line. The proxy parses each
line only to route it; what it forwards is the line it read, byte for byte. So the proxy
must read a line exactly as the server will, or refuse it: ``parse`` refuses what two
readers could read differently or cannot read at all (``Unreadable``):

- a key twice in one object, anywhere (one reader keeps the first, another the last:
  the proxy would see ``ping`` where the server runs ``tools/call``);
- nesting deeper than ``MAX_DEPTH`` (Python's own parser and encoder recurse);
- a lone UTF-16 surrogate (``"\\ud800"``): no UTF-8 text holds one, so it cannot be
  logged or re-encoded; bytes that are not UTF-8.

Invariants:
- ``parse`` and ``classify`` never raise anything but ``Unreadable``: anything that is
  not a request, a notification or a response is ``INVALID`` with the reason, and the
  sender gets an error (with the message's id when it had a usable one, ``top_id``).
- A request the proxy interprets (``INTERPRETED``) without an id is invalid, not a
  notification: a ``tools/call`` is never forwarded ungated, however it is framed.
- ``key`` tells ids apart by JSON type: the request id ``1`` and ``"1"`` are different.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final, Literal

from ..scrubber import redact_text

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "MAX_DEPTH",
    "OUTCOME_UNKNOWN",
    "PARSE_ERROR",
    "REFUSED",
    "UPSTREAM_UNAVAILABLE",
    "Unreadable",
    "batch_refusal",
    "cancelled_key",
    "classify",
    "encode",
    "error",
    "excerpt",
    "key",
    "parse",
    "top_id",
]

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
#: Server-defined codes (the -32000..-32099 range JSON-RPC leaves to implementations).
REFUSED: Final = -32001               # a control refused the call: nothing was executed
OUTCOME_UNKNOWN: Final = -32002       # the call may have happened (recorded STEP_UNKNOWN)
UPSTREAM_UNAVAILABLE: Final = -32003  # the upstream server is gone; the call was not sent

#: How deep a message may nest (objects and arrays): far more than MCP uses, far less
#: than what makes Python's parser, the scrubber or the encoder recurse out of stack.
MAX_DEPTH: Final = 64

Kind = Literal["request", "notification", "response", "invalid"]

#: The methods whose requests the proxy interprets (``tools/call`` is gated).
INTERPRETED = frozenset({"initialize", "tools/list", "tools/call"})


class Unreadable(Exception):  # noqa: N818 - what the proxy says of the message
    """A message the proxy refuses to read (see the module doc): ``code`` and the
    sentence to answer with; ``id`` the message's own when it was found."""

    def __init__(self, code: int, message: str, id_: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.id = id_


class _DuplicateKey(ValueError):
    pass


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _DuplicateKey(k)
            seen.add(k)
    return out


#: ``json.loads(text, object_pairs_hook=_unique)`` with its decoder built once.
_DECODE = json.JSONDecoder(object_pairs_hook=_unique).decode

# A \u escape of a UTF-16 surrogate: only a message holding one can hold a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


def parse(data: bytes | str) -> Any:
    """One message (or batch) as JSON; ``Unreadable`` when the proxy must not read it
    (see the module doc), with the code to answer and the message's id if found."""
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError as exc:
        raise Unreadable(PARSE_ERROR, f"Parse error: the message is not UTF-8 ({exc.reason} at byte {exc.start})",
                         top_id(data.decode("utf-8", "replace") if isinstance(data, bytes) else data)) from None
    try:
        if text.startswith("\ufeff"):  # what json.loads says of it (``_DECODE`` does not look)
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        doc = _DECODE(text)
    except _DuplicateKey as exc:
        raise Unreadable(INVALID_REQUEST, f"Invalid Request: the key {exc.args[0]!r} appears twice in one object; "
                         f"send each key once", top_id(text)) from None
    except RecursionError:
        raise Unreadable(INVALID_REQUEST, _too_deep_text(), top_id(text)) from None
    except ValueError as exc:
        raise Unreadable(PARSE_ERROR, f"Parse error: the message is not JSON ({exc})") from None
    # Nesting deeper than MAX_DEPTH needs more than MAX_DEPTH opening brackets in the text
    # (brackets inside strings only raise the count): most messages skip the walk.
    if text.count("{") + text.count("[") > MAX_DEPTH and _depth_over(doc, MAX_DEPTH):
        raise Unreadable(INVALID_REQUEST, _too_deep_text(), usable_id(doc))
    if _SURROGATE_ESCAPE.search(text) is not None:
        try:
            json.dumps(doc, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise Unreadable(INVALID_REQUEST, "Invalid Request: a string holds a lone UTF-16 surrogate (a \\ud800-"
                             "\\udfff escape that is not half of a pair), which is not text; send valid Unicode",
                             usable_id(doc)) from None
    return doc


def _too_deep_text() -> str:
    return f"Invalid Request: the message nests deeper than {MAX_DEPTH} levels, which the agent-saga proxy refuses"


def _depth_over(doc: Any, limit: int) -> bool:
    """Does ``doc`` nest objects and arrays deeper than ``limit``? (No recursion.)"""
    if doc.__class__ is not dict and doc.__class__ is not list:
        return False
    stack: list[tuple[Any, int]] = [(doc, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        for child in node.values() if node.__class__ is dict else node:
            if child.__class__ is dict or child.__class__ is list:
                stack.append((child, depth + 1))
    return False


_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"|[{}\[\]]|:')
_ID_VALUE = re.compile(r'\s*(-?\d+|"(?:[^"\\]|\\.)*")\s*[,}]')


def top_id(text: str) -> Any:
    """The ``"id"`` of a message that could not be parsed whole (too deep, too large, a
    duplicate key): the value of the one ``"id"`` key at the top level of its object,
    read from the text; None when there is none, more than one, or it is not usable."""
    found: list[Any] = []
    depth = 0
    want = False
    for m in _TOKEN.finditer(text):
        tok = m.group()
        if tok in "{[":
            depth += 1
        elif tok in "}]":
            depth -= 1
        elif tok == ":":
            if want:
                v = _ID_VALUE.match(text, m.end())
                if v is not None:
                    try:
                        found.append(json.loads(v.group(1)))
                    except ValueError:
                        return None
                else:
                    return None
            want = False
            continue
        want = depth == 1 and tok == '"id"'
    if len(found) != 1 or not _valid_id(found[0]):
        return None
    return found[0]


def classify(msg: Any) -> tuple[Kind, str]:
    """What ``msg`` (one parsed message, not a batch) is, and why when it is invalid."""
    if not isinstance(msg, dict):
        return "invalid", f"a JSON-RPC message is an object, got {type(msg).__name__}"
    if msg.get("jsonrpc") != "2.0":
        return "invalid", 'a JSON-RPC 2.0 message has "jsonrpc": "2.0"'
    if "method" in msg:
        if not isinstance(msg["method"], str):
            return "invalid", '"method" must be a string'
        if "id" not in msg:
            if msg["method"] in INTERPRETED:
                return "invalid", f'{msg["method"]} is a request: it needs an "id" (sent as a notification, it is ' \
                    f"neither answered nor, through agent-saga, executed)"
            return "notification", ""
        if not _valid_id(msg["id"]):
            return "invalid", '"id" must be a string or an integer'
        return "request", ""
    if "id" in msg and ("result" in msg or "error" in msg):
        return "response", ""
    return "invalid", 'a message needs "method" (a request or notification) or "id" with "result" or "error"'


def _valid_id(value: Any) -> bool:
    return isinstance(value, str) or (isinstance(value, int) and not isinstance(value, bool))


def usable_id(msg: Any) -> Any:
    """The id to answer ``msg`` with: its own when usable, else null."""
    if isinstance(msg, dict) and _valid_id(msg.get("id")):
        return msg["id"]
    return None


def key(id_: Any) -> str:
    """A dictionary key for a JSON-RPC id that keeps ``1`` and ``"1"`` apart: the id as
    JSON (an integer's digits, a string quoted)."""
    if id_.__class__ is int:
        return int.__repr__(id_)  # = json.dumps(id_), without building an encoder
    return _KEY(id_)


def cancelled_key(msg: Any) -> str | None:
    """The ``key`` of the request a ``notifications/cancelled`` names, or None."""
    params = msg.get("params") if isinstance(msg, dict) else None
    if not isinstance(params, dict) or "requestId" not in params:
        return None
    return key(params["requestId"])


def batch_refusal(batch: list[Any]) -> list[dict[str, Any]] | None:
    """The answer to a batch the proxy will not forward (one error per request in it),
    or None: the batch is forwarded as it is. Refused: an empty batch, and a batch holding
    an interpreted method (request or not: splitting the batch would change what the
    sender sees) or anything that is not a valid message (a nested batch, an invalid
    message: a lenient server might still run it)."""
    if not batch:
        return [error(None, INVALID_REQUEST, "Invalid Request: an empty batch")]
    why = ""
    for m in batch:
        kind, reason = classify(m)
        if isinstance(m, dict) and m.get("method") in INTERPRETED:
            why = f"{m['method']} inside a batch is not accepted by the agent-saga proxy; send it as a message of its own"
            break
        if kind == "invalid":
            why = f"a batch holds an invalid message ({reason}); the proxy forwards no part of it"
            break
    if not why:
        return None
    answers = [error(usable_id(m), INVALID_REQUEST, f"Invalid Request: {why}") for m in batch
               if isinstance(m, dict) and "id" in m and "method" in m]
    return answers or [error(None, INVALID_REQUEST, f"Invalid Request: {why}")]


EXCERPT = 200


def excerpt(data: bytes | str) -> str:
    """What a log may show of a message: its start, credentials redacted (the project's
    scrubber), at most ``EXCERPT`` characters, control characters escaped (``repr``)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    text = redact_text(text[: EXCERPT * 8])  # redacted before the cut: a cut secret would lose its shape
    cut = text[:EXCERPT]
    return repr(cut) + (f"... ({len(data)} in all)" if len(text) > EXCERPT else "")


#: ``json.dumps(msg, separators=(",", ":"), ensure_ascii=False)`` and ``json.dumps(id_)``,
#: each encoder built once (``json.dumps`` with options builds one per call).
_ENCODE = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False).encode
_KEY = json.JSONEncoder().encode


def encode(msg: Any) -> bytes:
    """One message as a line."""
    return _ENCODE(msg).encode() + b"\n"


def error(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response."""
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": err}
