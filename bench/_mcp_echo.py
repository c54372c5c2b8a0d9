"""A minimal stdio MCP server for bench_mcp.py: answers at once, so what is measured is
the transport and the proxy, not a tool. Speaks JSON-RPC lines with the standard library."""

import json
import sys
from typing import Any

TOOLS = [{"name": n, "inputSchema": {"type": "object"}} for n in ("echo", "charge", "refund")]


def main() -> None:
    n = 0
    out = sys.stdout
    for line in sys.stdin:
        msg = json.loads(line)
        if "id" not in msg:
            continue
        method = msg.get("method")
        result: dict[str, Any]
        if method == "initialize":
            result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                      "serverInfo": {"name": "echo", "version": "1"}}
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            n += 1
            result = {"content": [{"type": "text", "text": "ok"}], "structuredContent": {"id": f"ch_{n}"}}
        else:
            result = {}
        out.write(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
