"""A real MCP client process (the official SDK) for the proxy's crash tests.

    python mcp_client.py SCRIPT_JSON PROXY_ARGV_JSON

Starts the proxy (``python PROXY_ARGV``) over stdio, runs each ``{"tool", "args"}`` of
the script, prints each answer as a JSON line (``{"ok": result}`` or ``{"error": text}``),
prints ``ready``, then waits for a line on stdin: ``exit`` ends the session cleanly; a
SIGKILL is a dropped connection.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from mcp import ClientSession, StdioServerParameters, stdio_client


async def main() -> None:
    script = json.loads(sys.argv[1])
    argv = json.loads(sys.argv[2])
    server = StdioServerParameters(command=sys.executable, args=argv, env=dict(os.environ))
    async with stdio_client(server) as (r, w):
        async with ClientSession(r, w) as s:
            await s.initialize()
            for step in script:
                try:
                    res = await s.call_tool(step["tool"], step.get("args") or {})
                    print(json.dumps({"ok": res.model_dump(by_alias=True, exclude_none=True, mode="json")}),
                          flush=True)
                except Exception as exc:  # noqa: BLE001 - the test reads it
                    print(json.dumps({"error": str(exc)}), flush=True)
            print("ready", flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)


if __name__ == "__main__":
    asyncio.run(main())
