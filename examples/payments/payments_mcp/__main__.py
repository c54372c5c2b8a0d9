"""A payments MCP server (the official ``mcp`` SDK, Streamable HTTP) that refuses every
request without its bearer token: HTTP 401 unless ``Authorization: Bearer <token>``
matches the file ``$PAYMENTS_TOKEN_FILE`` (a mounted Secret; read again on each request,
so a rotated Secret is picked up).

    PAYMENTS_TOKEN_FILE=/var/run/secrets/payments/token python -m payments_mcp --port 8000

In the effector shape (examples/k8s/effector/) only the agent-saga MCP proxy holds the
token: the agent's container can reach this server's address but gets 401 from it.

Tools: ``charge`` (COMPENSABLE, undone by ``refund``), ``refund``, ``wire`` (IRREVERSIBLE)
and ``balance`` (a read). Each executed call prints one JSON line on stdout,
``{"payments": TOOL, ...}``: the server's own ledger (the node tests read it from the
pod's log).
"""

from __future__ import annotations

import argparse
import hmac
import json
import os
import secrets
import threading
from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("payments")
_lock = threading.Lock()
_charges: dict[str, dict[str, Any]] = {}


def _ledger(tool: str, **fields: Any) -> None:
    print(json.dumps({"payments": tool, **fields}), flush=True)


@server.tool()
def charge(amount: int, customer: str = "cus_demo") -> dict[str, Any]:
    """Charge a customer AMOUNT cents; returns the charge (its id undoes it: refund)."""
    ch = {"id": "ch_" + secrets.token_hex(6), "amount": amount, "customer": customer}
    with _lock:
        _charges[ch["id"]] = dict(ch, refunded=False)
    _ledger("charge", **ch)
    return ch


@server.tool()
def refund(charge: str) -> dict[str, Any]:
    """Refund the charge CHARGE (the inverse of charge)."""
    with _lock:
        ch = _charges.get(charge)
        if ch is None:
            raise ValueError(f"no charge {charge}")
        already = ch["refunded"]
        ch["refunded"] = True
    _ledger("refund", charge=charge, already=already)
    return {"refunded": charge, "already": already}


@server.tool()
def wire(amount: int, to: str) -> dict[str, Any]:
    """Send AMOUNT cents to the account TO. Cannot be undone."""
    out = {"id": "wr_" + secrets.token_hex(6), "amount": amount, "to": to}
    _ledger("wire", **out)
    return out


@server.tool()
def balance() -> dict[str, Any]:
    """The charges not refunded, and their total."""
    with _lock:
        open_ = [c for c in _charges.values() if not c["refunded"]]
    return {"open": len(open_), "total": sum(c["amount"] for c in open_)}


class RequireBearer:
    """ASGI middleware: 401 unless the request carries the bearer token."""

    def __init__(self, app: Any, token_file: str) -> None:
        self.app, self.token_file = app, token_file

    def _token(self) -> bytes:
        with open(self.token_file, "rb") as f:
            token = f.read()
        return token[:-1] if token.endswith(b"\n") else token

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            given = dict(scope["headers"]).get(b"authorization", b"")
            if not (self._token() and hmac.compare_digest(given, b"Bearer " + self._token())):
                await send({"type": "http.response.start", "status": 401,
                            "headers": [(b"content-type", b"application/json"),
                                        (b"www-authenticate", b'Bearer realm="payments"')]})
                await send({"type": "http.response.body", "body": b'{"error": "a bearer token is required"}'})
                return
        await self.app(scope, receive, send)


def main() -> None:
    parser = argparse.ArgumentParser(prog="payments_mcp", description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--http-fd", type=int, help="serve on this already-bound socket (tests)")
    args = parser.parse_args()
    token_file = os.environ.get("PAYMENTS_TOKEN_FILE")
    if not token_file:
        parser.error("PAYMENTS_TOKEN_FILE is not set: point it at the file holding the bearer token")
    import uvicorn

    # Reached through a Service by name: the Host is the Service's, not localhost.
    app = RequireBearer(server.streamable_http_app(host="0.0.0.0"), token_file)
    if args.http_fd is not None:
        uvicorn.run(app, fd=args.http_fd, log_level="warning")
    else:
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
