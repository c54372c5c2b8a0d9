"""``agent-saga mcp``: build the proxy from its options and run one session over stdio.

    agent-saga mcp --policy saga-policy.json --name payments -- python -m my_mcp_server
    agent-saga mcp --observe --emit-policy saga-policy.yaml -- python -m my_mcp_server

``ProxyOptions`` holds what the command line says; ``run_proxy`` wires the WAL, the
policy source, the gate (the process's kill switch, breaker and limits — from the policy
plane when ``AGENT_SAGA_REDIS_URL`` is set — the policy, and approvals), starts the
upstream and serves the session on the proxy's own stdin/stdout. Logs go to stderr
(stdout is the protocol). When ``$AGENT_SAGA_MCP_UPSTREAMS`` names an upstream ``--name``,
the proxy holds its ``credentials`` (``_custody``): the same references recoveryd
resolves, from this process's own mount.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..controls import ApprovalGateway, ApprovalPolicy, PreFlightGate, open_approval_store
from ..controls.policy import PolicySource, StaticPolicySource
from ..errors import ConfigurationError
from ..wal import get_default_wal, open_wal
from ..wal.base import BaseWAL
from ._custody import Custody
from ._httpproxy import HttpProxy
from ._observe import Surface
from ._plane import plane_policy
from ._proxy import McpProxy, stdio_client_channel
from ._session import Boundary, ToolSession
from ._stdio import MAX_LINE, StdioUpstream
from .upstreams import UpstreamSpec, check_name, named_upstream

__all__ = ["ProxyOptions", "run_proxy"]

log = logging.getLogger("agent_saga.mcp")

BOUNDARIES: tuple[Boundary, ...] = ("session", "explicit", "none")


@dataclass
class ProxyOptions:
    """What ``agent-saga mcp`` was told (see ``agent-saga mcp --help``)."""

    command: Sequence[str]
    policy: str | None = None
    policy_from_plane: str | None = None
    observe: bool = False
    emit_policy: str | None = None
    boundary: Boundary = "session"
    name: str = "mcp"
    agent: str = "mcp-proxy"
    wal: str | None = None
    approvals: str | None = None
    approval_timeout: float = 900.0
    lease_seconds: float | None = None
    listen: str | None = None
    upstream: str | None = None
    session_idle: float = 300.0
    allow_hosts: Sequence[str] = ()
    max_message: int = MAX_LINE
    policy_source: PolicySource | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def check(self) -> None:
        """Refuse contradictory or missing options, naming the flag and the fix."""
        if (self.listen is None) != (self.upstream is None):
            raise ConfigurationError("--listen ADDR and --upstream URL go together (a Streamable HTTP server); for a "
                                     "stdio server, name its command after --")
        if self.listen is not None:
            if self.command:
                raise ConfigurationError("--listen/--upstream proxy an HTTP server: drop the command after --")
            listen_address(self.listen)
            if not str(self.upstream).startswith(("http://", "https://")):
                raise ConfigurationError(f"--upstream {self.upstream!r}: the server's MCP endpoint URL, "
                                         f"http://host:port/mcp")
        elif not self.command:
            raise ConfigurationError("name the upstream MCP server after --: agent-saga mcp --policy FILE -- python "
                                     "-m my_mcp_server (or --listen ADDR --upstream URL for an HTTP server)")
        if self.allow_hosts and self.listen is None:
            raise ConfigurationError("--allow-host names a Host the --listen proxy answers: it goes with --listen")
        for h in self.allow_hosts:
            if not h or any(c in h for c in "/:@ ") and not h.startswith("["):
                raise ConfigurationError(f"--allow-host {h!r}: a host name or address as clients write it in the "
                                         f"Host header, without a port (mcp.payments.svc, 10.0.0.5, [fd00::5])")
        if self.max_message < 1024:
            raise ConfigurationError(f"--max-message-bytes {self.max_message}: at least 1024 (default {MAX_LINE})")
        if self.boundary not in BOUNDARIES:
            raise ConfigurationError(f"--boundary {self.boundary!r}: choose session, explicit or none")
        check_name(self.name, "--name")
        if self.observe:
            if self.policy or self.policy_from_plane or self.policy_source is not None:
                raise ConfigurationError("--observe forwards everything and enforces nothing: drop --policy")
            if not self.emit_policy:
                raise ConfigurationError("--observe needs --emit-policy FILE: where the skeleton is written")
            if os.path.exists(self.emit_policy):
                raise ConfigurationError(f"--emit-policy {self.emit_policy} exists: a reviewed policy is never "
                                         f"overwritten by a skeleton; name a new file")
        elif self.policy and self.policy_from_plane:
            raise ConfigurationError("--policy and --policy-from-plane: choose one source of the policy")
        elif self.policy is None and self.policy_from_plane is None and self.policy_source is None:
            raise ConfigurationError("name the policy: --policy saga-policy.json (or --observe --emit-policy FILE to "
                                     "write one from what the agent calls)")
        if self.emit_policy and not self.observe:
            raise ConfigurationError("--emit-policy goes with --observe")


def listen_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (or ``:PORT``, all interfaces) as a pair; ``ConfigurationError`` otherwise."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigurationError(f"--listen {text!r}: an address like 127.0.0.1:8931 (or :8931 for all interfaces)")
    return host.strip("[]") or "0.0.0.0", int(port)


def _wal(target: str | None) -> BaseWAL:
    return open_wal(target) if target else get_default_wal()


def build_gate(opts: ProxyOptions, wal: BaseWAL, policy: PolicySource) -> PreFlightGate:
    """The gate every call passes: the process's controls, this policy, these approvals."""
    if opts.approvals:
        provider = ApprovalGateway(open_approval_store(opts.approvals), wal=wal,
                                   policy=ApprovalPolicy(opts.approval_timeout), poll=0.1, agent=opts.agent)
        return PreFlightGate(approval_provider=provider, policy=policy)
    return PreFlightGate(policy=policy)


async def run_proxy(opts: ProxyOptions) -> int:
    """Serve one session on stdin/stdout (see the module doc). The exit code: 0 the
    session ended cleanly (committed), 1 it was dropped (rolled back)."""
    opts.check()
    if opts.listen is not None:
        return await _run_http(opts)
    uses = _credentials(opts.name)
    upstream = StdioUpstream(opts.command, limit=opts.max_message, custody=Custody(uses))
    spec = UpstreamSpec(opts.name, tuple(opts.command), credentials=uses)
    if opts.observe:
        surface = Surface()
        proxy = McpProxy(upstream, on_tools=surface.listed, on_call=surface.called)
        client = await stdio_client_channel(opts.max_message)  # (no channel, no session: no skeleton)
        try:
            return await proxy.serve(client)
        finally:
            assert opts.emit_policy is not None
            written = surface.write(opts.emit_policy, name=opts.name, source=" ".join(opts.command))
            log.warning("agent-saga mcp: wrote the policy skeleton %s (every tool IRREVERSIBLE: review it)",
                        ", ".join(written))
    # The policy first: --policy-from-plane connects the policy plane, whose WAL stream
    # (AGENT_SAGA_WAL_STREAM) is then the process's WAL; the other way round, a file was made.
    source = _policy(opts)
    wal = _wal(opts.wal)
    gate = build_gate(opts, wal, source)
    proxy = McpProxy(upstream, inject_boundary_tools=opts.boundary == "explicit")
    proxy.session = ToolSession(wal=wal, gate=gate, policy=source, boundary=opts.boundary, upstream_name=opts.name,
                                upstream=upstream, spec=spec, forward=proxy.forward_call,
                                lease_seconds=opts.lease_seconds, agent=opts.agent)
    try:
        return await proxy.serve(await stdio_client_channel(opts.max_message))
    finally:
        if opts.wal:
            wal.close()


def _credentials(name: str) -> tuple[Any, ...]:
    """The credentials of the upstream registered as ``name`` (none: not registered)."""
    named = named_upstream(name)
    if named is None or not named.credentials:
        return ()
    log.info("agent-saga mcp: holding %d credential(s) of upstream %s: %s", len(named.credentials), name,
             ", ".join(u.ref for u in named.credentials))
    return named.credentials


def _policy(opts: ProxyOptions) -> PolicySource:
    if opts.policy_source is not None:
        return opts.policy_source
    if opts.policy_from_plane:
        return plane_policy(opts.policy_from_plane, opts.agent)
    return StaticPolicySource.from_file(str(opts.policy), agent=opts.agent)


async def _run_http(opts: ProxyOptions) -> int:
    assert opts.listen is not None and opts.upstream is not None
    host, port = listen_address(opts.listen)
    uses = _credentials(opts.name)
    if opts.observe:
        surface = Surface()
        proxy = HttpProxy(opts.upstream, new_session=None, on_tools=surface.listed, on_call=surface.called,
                          allowed_hosts=opts.allow_hosts, max_message=opts.max_message, custody=Custody(uses))
        try:
            return await proxy.serve(host, port)
        finally:
            assert opts.emit_policy is not None
            written = surface.write(opts.emit_policy, name=opts.name, source=opts.upstream)
            log.warning("agent-saga mcp: wrote the policy skeleton %s (every tool IRREVERSIBLE: review it)",
                        ", ".join(written))
    # The policy first: --policy-from-plane connects the policy plane, whose WAL stream
    # (AGENT_SAGA_WAL_STREAM) is then the process's WAL; the other way round, a file was made.
    source = _policy(opts)
    wal = _wal(opts.wal)
    gate = build_gate(opts, wal, source)
    spec = UpstreamSpec(opts.name, url=opts.upstream, credentials=uses)

    async def not_used(msg: dict[str, Any]) -> dict[str, Any]:  # pragma: no cover - each call brings its own
        raise RuntimeError("an HTTP session forwards each call itself")

    def new_session() -> ToolSession:
        return ToolSession(wal=wal, gate=gate, policy=source, boundary=opts.boundary, upstream_name=opts.name,
                           upstream=None, spec=spec, forward=not_used, lease_seconds=opts.lease_seconds,
                           agent=opts.agent)

    proxy = HttpProxy(opts.upstream, new_session=new_session, inject_boundary_tools=opts.boundary == "explicit",
                      session_idle=opts.session_idle, allowed_hosts=opts.allow_hosts, max_message=opts.max_message,
                      custody=Custody(uses))
    try:
        return await proxy.serve(host, port)
    finally:
        if opts.wal:
            wal.close()
