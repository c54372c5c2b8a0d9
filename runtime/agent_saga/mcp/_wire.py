"""JSON-RPC 2.0 as the proxy reads it: classify a message, build errors, frame lines.

MCP's stdio transport is one JSON-RPC message (or batch) per line. The proxy parses each
line only to route it; what it forwards is the line it read, byte for byte.

Invariants:
- ``classify`` never raises: anything that is not a request, a notification or a
  response is ``INVALID`` with the reason, and the sender gets an ``Invalid Request``
  error (with the message's id when it had a usable one).
- ``key`` tells ids apart by JSON type: the request id ``1`` and ``"1"`` are different.
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "OUTCOME_UNKNOWN",
    "PARSE_ERROR",
    "REFUSED",
    "UPSTREAM_UNAVAILABLE",
    "batch_refusal",
    "cancelled_key",
    "classify",
    "encode",
    "error",
    "key",
]

PARSE_ERROR: Final = -32700
INVALID_REQUEST: Final = -32600
INVALID_PARAMS: Final = -32602
INTERNAL_ERROR: Final = -32603
#: Server-defined codes (the -32000..-32099 range JSON-RPC leaves to implementations).
REFUSED: Final = -32001               # a control refused the call: nothing was executed
OUTCOME_UNKNOWN: Final = -32002       # the call may have happened (recorded STEP_UNKNOWN)
UPSTREAM_UNAVAILABLE: Final = -32003  # the upstream server is gone; the call was not sent

Kind = Literal["request", "notification", "response", "invalid"]


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
    """A dictionary key for a JSON-RPC id that keeps ``1`` and ``"1"`` apart."""
    return json.dumps(id_)


def cancelled_key(msg: Any) -> str | None:
    """The ``key`` of the request a ``notifications/cancelled`` names, or None."""
    params = msg.get("params") if isinstance(msg, dict) else None
    if not isinstance(params, dict) or "requestId" not in params:
        return None
    return key(params["requestId"])


INTERPRETED = frozenset({"initialize", "tools/list", "tools/call"})


def batch_refusal(batch: list[Any]) -> list[dict[str, Any]] | None:
    """The answer to a batch holding an interpreted request (one Invalid Request per
    request), or None: the batch is forwarded as it is."""
    if not any(isinstance(m, dict) and m.get("method") in INTERPRETED and "id" in m for m in batch):
        return None
    return [error(usable_id(m), INVALID_REQUEST, (
        f"Invalid Request: {m.get('method')} inside a batch is not accepted by the agent-saga proxy; send it as a "
        f"message of its own")) for m in batch if isinstance(m, dict) and "id" in m and "method" in m]


def encode(msg: Any) -> bytes:
    """One message as a line."""
    return json.dumps(msg, separators=(",", ":"), ensure_ascii=False).encode() + b"\n"


def error(id_: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    """A JSON-RPC error response."""
    err: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        err["data"] = data
    return {"jsonrpc": "2.0", "id": id_, "error": err}
