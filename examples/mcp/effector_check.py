"""Run inside the application container of examples/k8s/effector/ to see the shape hold: a
tools/call through the proxy works, the same server called directly refuses.

    kubectl -n agent-saga exec -i deploy/effector-agent -c app -- python - < examples/mcp/effector_check.py

Standard library only (the app's image may have python and nothing else). It prints one
line per attempt and exits 0 when the proxy answered and the server refused the direct
call (HTTP 401, or not reachable at all), 1 otherwise.

A Service is routed a moment after its pods turn Ready (the endpoints reach kube-proxy, or
your CNI, asynchronously). While the proxy answers that it cannot reach the upstream, the
check waits for up to EFFECTOR_CHECK_WAIT seconds (default 60), saying so, before it judges.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request

PROXY = os.environ.get("MCP_SERVER_URL", "http://127.0.0.1:8931/mcp")
SERVER = os.environ.get("UPSTREAM_URL", "http://payments-mcp:8000/mcp")
WAIT = float(os.environ.get("EFFECTOR_CHECK_WAIT", "60"))
HEADERS = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
           "MCP-Protocol-Version": "2025-06-18"}


def post(url, msg, sid=None):
    """(HTTP status, session id, the JSON-RPC answer or the error text)."""
    headers = dict(HEADERS, **({"Mcp-Session-Id": sid} if sid else {}))
    req = urllib.request.Request(url, json.dumps(msg).encode(), headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            text = resp.read().decode()
            data = [line[5:] for line in text.splitlines() if line.startswith("data:") and line[5:].strip()]
            answer = json.loads(data[-1]) if data else json.loads(text) if text.strip() else None
            return resp.status, resp.headers.get("Mcp-Session-Id"), answer
    except urllib.error.HTTPError as e:
        return e.code, None, e.read().decode(errors="replace")[:200]
    except OSError as e:
        return 0, None, str(e)


def initialize(url):
    return post(url, {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "effector-check", "version": "1"}}})


deadline = time.monotonic() + WAIT
status, sid, why = initialize(PROXY)
while status in (0, 502) and time.monotonic() < deadline:  # not routed yet: the pod or its upstream
    print(f"through the proxy ({PROXY}): {f'HTTP {status}' if status else 'not reachable'}, waiting: {why}",
          flush=True)
    time.sleep(2)
    status, sid, why = initialize(PROXY)
through = None
if status == 200 and sid:
    post(PROXY, {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    _, _, answer = post(PROXY, {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                                "params": {"name": "balance", "arguments": {}}}, sid)
    through = answer.get("result") if isinstance(answer, dict) else None
    print(f"through the proxy ({PROXY}): balance -> {json.dumps(through or answer)}")
    urllib.request.urlopen(urllib.request.Request(PROXY, None, dict(HEADERS, **{"Mcp-Session-Id": sid}),
                                                  method="DELETE"), timeout=60).close()
else:
    print(f"through the proxy ({PROXY}): {f'HTTP {status}' if status else 'not reachable'}: {why}")
direct, _, _ = initialize(SERVER)
print(f"straight to the server ({SERVER}): {f'HTTP {direct}' if direct else 'not reachable'}")
governed = bool(through) and not through.get("isError") and direct in (0, 401, 403)
print("the effector shape holds" if governed else "NOT governed: see the lines above")
sys.exit(0 if governed else 1)
