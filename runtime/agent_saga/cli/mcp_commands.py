"""``agent-saga mcp [--policy FILE | --policy-from-plane NS/NAME | --observe --emit-policy FILE] -- CMD ARGS...``.

    agent-saga mcp --observe --emit-policy saga-policy.yaml -- python -m my_mcp_server
    agent-saga mcp --policy saga-policy.json --name payments -- python -m my_mcp_server
    agent-saga mcp --policy-from-plane payments/payments-agent -- python -m my_mcp_server
    agent-saga mcp --policy saga-policy.json --listen 127.0.0.1:8931 --upstream http://127.0.0.1:8000/mcp

Runs in place of the MCP server an agent starts over stdio: the agent's MCP client talks
to the proxy on stdin/stdout, the proxy starts ``CMD ARGS`` and talks to it. See
docs/mcp.md. Logs go to stderr. Exit codes: 0 the session ended cleanly (committed), 1 it
was dropped (rolled back), 2 bad usage.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

__all__ = ["register"]


def register(sub: Any) -> None:
    """Add ``mcp`` to the command line."""
    p = sub.add_parser(
        "mcp", help="run an MCP server behind the gate and the WAL (a proxy; the agent is not changed)",
        description="A JSON-RPC proxy in front of an MCP server: every tools/call passes the gate (kill switch, "
        "breaker, limits, rules, approvals) and is logged as a saga step; undeclared tools are refused; "
        "COMPENSABLE calls are undone when the session fails. Everything else is forwarded verbatim.")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--policy", metavar="FILE", help="the policy file (JSON, or a SagaPolicy manifest in YAML)")
    what.add_argument("--policy-from-plane", metavar="NS/NAME",
                      help="the SagaPolicy resource NS/NAME, read live from the policy plane (AGENT_SAGA_REDIS_URL)")
    what.add_argument("--observe", action="store_true",
                      help="forward everything, record the tools, write a skeleton policy (--emit-policy)")
    p.add_argument("--emit-policy", metavar="FILE", help="with --observe: the skeleton to write (never overwritten)")
    p.add_argument("--boundary", choices=("session", "explicit", "none"), default="session",
                   help="where a saga starts and ends: session (default; a clean disconnect commits, a dropped one "
                   "rolls back), explicit (saga_commit / saga_rollback tools are added), none (no rollback)")
    p.add_argument("--name", default=os.environ.get("AGENT_SAGA_MCP_NAME", "mcp"),
                   help="the upstream's name: compensations are logged as handler mcp:NAME, which a recovery "
                   "daemon finds in $AGENT_SAGA_MCP_UPSTREAMS (default: $AGENT_SAGA_MCP_NAME or 'mcp')")
    p.add_argument("--agent", default=os.environ.get("AGENT_SAGA_AGENT", "mcp-proxy"),
                   help="the agent's name, which a policy's appliesTo matches (default: $AGENT_SAGA_AGENT)")
    p.add_argument("--wal", metavar="TARGET", help="the WAL: a path or a redis:// / postgresql:// URL (default: "
                   "$AGENT_SAGA_WAL_PATH, else ./agent-saga.wal, or the policy plane's stream)")
    p.add_argument("--approvals", metavar="STORE", help="where approval requests go: a directory or redis:// URL "
                   "(default: the policy plane's, when AGENT_SAGA_REDIS_URL is set; else calls needing a human "
                   "are refused)")
    p.add_argument("--approval-timeout", type=float, default=900.0,
                   help="seconds a call waits for a human before it is denied (default 900)")
    p.add_argument("--lease-seconds", type=float, default=None,
                   help="seconds after the proxy's last sign of life before a recovery daemon may take its saga "
                   "over (default 30)")
    p.add_argument("--listen", metavar="ADDR", help="serve Streamable HTTP on ADDR (127.0.0.1:8931), in front of "
                   "--upstream; port 0 takes a free port, named on stderr ('listening on HOST:PORT')")
    p.add_argument("--upstream", metavar="URL", help="with --listen: the Streamable HTTP server's MCP endpoint "
                   "(http://127.0.0.1:8000/mcp)")
    p.add_argument("--session-idle", type=float, default=300.0,
                   help="with --listen: seconds without a request before a session counts as dropped and is rolled "
                   "back (default 300; a DELETE ends it cleanly)")
    p.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                   help="with --listen: a Host name (or address) clients reach the proxy by, besides loopback names "
                   "and the listen address; repeat for several. Other Hosts are refused (421), and so is a web "
                   "page's Origin that names none of them (403)")
    p.add_argument("--max-message-bytes", type=int, default=64 * 1024 * 1024, metavar="N",
                   help="the largest JSON-RPC message read from either side (default 64 MiB); a larger one is "
                   "refused with a JSON-RPC error")
    p.add_argument("server", nargs=argparse.REMAINDER, metavar="-- CMD ARGS...", help="the MCP server to start")
    p.set_defaults(handler=cmd_mcp)


def cmd_mcp(args: argparse.Namespace) -> int:
    """``agent-saga mcp``: serve one session."""
    command = list(args.server)
    if command and command[0] == "--":
        command = command[1:]
    # the proxy and its protocol, for this command only
    from ..mcp import ProxyOptions, loop_factory, run_proxy

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    opts = ProxyOptions(command=command, policy=args.policy, policy_from_plane=args.policy_from_plane, observe=args.observe, emit_policy=args.emit_policy,
                        boundary=args.boundary, name=args.name, agent=args.agent, wal=args.wal,
                        approvals=args.approvals, approval_timeout=args.approval_timeout,
                        lease_seconds=args.lease_seconds, listen=args.listen, upstream=args.upstream,
                        session_idle=args.session_idle, allow_hosts=tuple(args.allow_host),
                        max_message=args.max_message_bytes)
    opts.check()
    # The HTTP proxy runs on uvloop's event loop when it is installed (the fast extra).
    with asyncio.Runner(loop_factory=loop_factory() if opts.listen is not None else None) as runner:
        return runner.run(run_proxy(opts))
