"""What the node's effector tests run INSIDE the application container (`kubectl exec ...
python -c`): the attacker's code. Standard library only (the app's image has python and
nothing else). Each script reads its parameters as JSON on stdin (so no secret it looks
for is ever on its own command line) and prints one JSON line."""

from __future__ import annotations

# Where may a secret be read from this container? Its environment, every file it can open
# (the whole filesystem but /proc, /sys, /dev), every visible process's environ and cmdline.
LOOK = r'''
import json, os, sys
wanted = json.load(sys.stdin)["secrets"]
needles = [w.encode() for w in wanted]
me = str(os.getpid())
out = {"env": [], "files": [], "proc": [], "pids": {}, "unreadable_proc": 0, "files_read": 0}
for k, v in os.environ.items():
    if any(w in v for w in wanted):
        out["env"].append(k)
for top, dirs, files in os.walk("/"):
    if top == "/":
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for f in files:
        path = os.path.join(top, f)
        try:
            if not os.path.isfile(path) or os.path.getsize(path) > 64 << 20:
                continue
            with open(path, "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        out["files_read"] += 1
        if any(n in data for n in needles):
            out["files"].append(path)
for pid in os.listdir("/proc"):
    if not pid.isdigit() or pid == me:
        continue
    for part in ("environ", "cmdline"):
        try:
            with open(f"/proc/{pid}/{part}", "rb") as fh:
                data = fh.read()
        except OSError:
            out["unreadable_proc"] += 1
            continue
        if part == "cmdline":
            out["pids"][pid] = data.replace(b"\0", b" ").decode(errors="replace").strip()
        if any(n in data for n in needles):
            out["proc"].append(f"/proc/{pid}/{part}")
print(json.dumps(out))
'''

# The proxy's processes and files, from here: the processes this container sees, and
# whether the proxy's mounts (or, through a shared process namespace, its root) open.
SEE = r'''
import json, os, sys
args = json.load(sys.stdin)
me = str(os.getpid())
procs = {}
for pid in os.listdir("/proc"):
    if pid.isdigit() and pid != me:
        try:
            procs[pid] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode().strip()
        except OSError:
            procs[pid] = None
opened = []
for path in args["paths"]:
    for pid in [None, *procs]:
        p = path if pid is None else f"/proc/{pid}/root{path}"
        try:
            with open(p, "rb"):
                opened.append(p)
        except OSError:
            pass
print(json.dumps({"procs": procs, "opened": opened}))
'''

# The policy plane's Redis, by hand: without a credential, with a guess, with $AGENT_SAGA_REDIS_URL
# if this container has one.
REDIS = r'''
import json, os, socket, sys, urllib.parse
args = json.load(sys.stdin)
def ask(*cmds):
    s = socket.create_connection((args["host"], args["port"]), timeout=20)
    out = []
    for c in cmds:
        s.sendall(("*%d\r\n" % len(c) + "".join("$%d\r\n%s\r\n" % (len(x.encode()), x) for x in c)).encode())
        out.append(s.recv(4096).decode(errors="replace").strip())
    s.close()
    return out
res = {"anonymous": ask(["PING"], ["GET", "x"]), "default_empty": ask(["AUTH", "default", ""], ["PING"]),
       "agent_guess": ask(["AUTH", "agent-saga-agent", "guess"], ["PING"])}
url = os.environ.get("AGENT_SAGA_REDIS_URL")
if url:
    u = urllib.parse.urlparse(url)
    res["with_env"] = ask(["AUTH", urllib.parse.unquote(u.username or "default"), urllib.parse.unquote(u.password or "")], ["PING"])
print(json.dumps(res))
'''

# A Streamable HTTP MCP client in twenty lines: initialize, tools/call each of `calls`, and
# DELETE the session unless `drop` (then the session is abandoned: the proxy drops it after
# --session-idle). `url` and `headers` let the attacker aim at the upstream directly.
MCP = r'''
import json, sys, urllib.request, urllib.error
args = json.load(sys.stdin)
URL = args.get("url", "http://127.0.0.1:8931/mcp")
def req(method, body=None, sid=None):
    h = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
         "MCP-Protocol-Version": "2025-06-18", **args.get("headers", {})}
    if sid:
        h["Mcp-Session-Id"] = sid
    r = urllib.request.Request(URL, None if body is None else json.dumps(body).encode(), h, method=method)
    try:
        with urllib.request.urlopen(r, timeout=args.get("timeout", 300)) as resp:
            text, ctype = resp.read().decode(), resp.headers.get("content-type", "")
            msgs = ([json.loads(l[5:]) for l in text.splitlines() if l.startswith("data:") and l[5:].strip()]
                    if "text/event-stream" in ctype else [json.loads(text)] if text.strip() else [None])
            return resp.status, resp.headers.get("mcp-session-id"), msgs[-1]
    except urllib.error.HTTPError as e:
        return e.code, None, e.read().decode(errors="replace")
    except OSError as e:
        return 0, None, repr(e)
status, sid, init = req("POST", {"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "app", "version": "1"}}})
out = {"init": status, "calls": []}
if status == 200 and sid:
    req("POST", {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid)
    for n, (tool, arguments) in enumerate(args["calls"], 1):
        s, _, msg = req("POST", {"jsonrpc": "2.0", "id": n, "method": "tools/call",
                                 "params": {"name": tool, "arguments": arguments}}, sid)
        res = msg.get("result") if isinstance(msg, dict) else None
        value = None
        if res and not res.get("isError"):
            value = res.get("structuredContent") or json.loads(res["content"][0]["text"])
        out["calls"].append({"status": s, "value": value, "error": msg.get("error") if isinstance(msg, dict) else msg,
                             "isError": bool(res and res.get("isError"))})
    if not args.get("drop"):
        req("DELETE", None, sid)
else:
    out["body"] = init
print(json.dumps(out))
'''
