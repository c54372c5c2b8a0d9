"""A minimal Streamable HTTP MCP server for bench_effector.py: answers at once (JSON, HTTP/1.1
keep-alive), and with ``$ECHO_TOKEN`` set refuses (401) any request without
``Authorization: Bearer $ECHO_TOKEN``, as the effector example's payments server does.
Standard library only, so what is measured is the proxy, not a server framework.

    python bench/_mcp_http_echo.py PORT_FILE
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("echo", "charge", "refund")]
TOKEN = os.environ.get("ECHO_TOKEN")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    wbufsize = 1 << 16  # a response leaves in one write (flushed by _send)
    n = 0

    def log_message(self, *args: object) -> None:
        pass

    def _send(self, status: int, body: bytes = b"", headers: tuple[tuple[str, str], ...] = ()) -> None:
        self.send_response(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()

    def _authorized(self) -> bool:
        return TOKEN is None or self.headers.get("Authorization") == f"Bearer {TOKEN}"

    def do_DELETE(self) -> None:
        self._send(200 if self._authorized() else 401)

    def do_GET(self) -> None:
        self._send(405)

    def do_POST(self) -> None:
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        if not self._authorized():
            self._send(401, b'{"error": "a bearer token is required"}', (("Content-Type", "application/json"),))
            return
        msg = json.loads(raw)
        if "id" not in msg:
            self._send(202)
            return
        method = msg.get("method")
        result: dict[str, Any]
        extra: tuple[tuple[str, str], ...] = ()
        if method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "echo", "version": "1"}}
            extra = (("Mcp-Session-Id", "bench-session"),)
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            Handler.n += 1
            result = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"id": f"ch_{Handler.n}"}}
        else:
            result = {}
        body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}).encode()
        self._send(200, body, (("Content-Type", "application/json"), *extra))


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(server.server_address[1]))
    os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    server.serve_forever()


if __name__ == "__main__":
    main()
