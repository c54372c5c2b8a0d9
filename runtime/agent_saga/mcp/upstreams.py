"""Named upstreams: how a process other than the proxy reaches an MCP server to undo a call.

A COMPENSABLE call through ``agent-saga mcp --name payments`` is logged with the
compensation handler ``mcp:payments`` and kwargs ``{"tool": <inverse>, "arguments":
{...}}``. The proxy runs it itself over its open session; after a crash the recovery
daemon runs it, and finds the server by that name:

    # /etc/agent-saga/mcp-upstreams.json
    {"payments": {"command": ["python", "-m", "my_mcp_server"], "env": {"LOG_LEVEL": "info"}}}

    AGENT_SAGA_MCP_UPSTREAMS=/etc/agent-saga/mcp-upstreams.json \\
        agent-saga-recoveryd --import agent_saga.mcp.upstreams ...

An entry may list ``credentials`` — references, never values — injected into every call
as a header (an HTTP upstream) or an environment variable (a stdio one); the proxy
serving ``--name payments`` takes them from the same entry (``_custody``).

Importing this module registers one ``@compensator("mcp:<name>")`` per entry of the file
``$AGENT_SAGA_MCP_UPSTREAMS`` names (handlers are registered by import, like any other);
``register_upstream`` does the same from code. The handler starts the server, calls the
inverse tool once, and stops it; the call carries the step's idempotency key in
``_meta["agentsaga.dev/idempotency-key"]`` for a server that de-duplicates.

Invariants:
- A file that cannot be read or has a bad entry fails the import with
  ``ConfigurationError`` naming the file, the entry and the fix (a daemon that cannot
  reach an upstream must not start as if it could).
- The handler raises when the inverse did not happen (an error response, ``isError``, a
  server that dies): the daemon records COMPENSATION_FAILED and escalates; it never
  reports an undo that nothing confirmed.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..compensation import compensator, get_compensator
from ..credentials import install_mounted_resolver
from ..errors import ConfigurationError, HandlerNotRegistered
from ._custody import CredentialUse, Custody, parse_credentials
from ._stdio import call_tool_once

__all__ = ["ENV_UPSTREAMS", "IDEMPOTENCY_META", "UpstreamSpec", "handler_name", "load_upstreams",
           "named_upstream", "register_upstream"]

ENV_UPSTREAMS = "AGENT_SAGA_MCP_UPSTREAMS"
IDEMPOTENCY_META = "agentsaga.dev/idempotency-key"
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


def handler_name(name: str) -> str:
    """The compensation handler of the upstream named ``name``: ``mcp:<name>``."""
    return f"mcp:{name}"


def check_name(name: object, where: str = "the upstream name") -> str:
    if not isinstance(name, str) or not NAME.match(name):
        raise ConfigurationError(f"{where} {name!r} is not valid: 1-63 characters from [A-Za-z0-9._-], "
                                 f"starting with a letter or digit (e.g. 'payments')")
    return name


@dataclass(frozen=True, slots=True)
class UpstreamSpec:
    """How to reach an upstream MCP server: start ``command`` (stdio; ``env``, ``cwd``)
    or post to ``url`` (Streamable HTTP). Exactly one of the two."""

    name: str
    command: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    credentials: tuple[CredentialUse, ...] = ()

    async def call_tool(self, tool: str, arguments: Mapping[str, Any], idempotency_key: str | None = None
                        ) -> dict[str, Any]:
        """Call ``tool`` once on a fresh session; its result (raises if it did not happen)."""
        meta = {IDEMPOTENCY_META: idempotency_key} if idempotency_key else None
        custody = Custody(self.credentials)
        if self.url is not None:
            from ._httpcall import call_tool_http

            return await call_tool_http(self.url, tool, arguments, meta=meta, custody=custody)
        return await call_tool_once(self.command, tool, arguments, meta=meta, env=self.env or None, cwd=self.cwd,
                                    custody=custody)


_SPECS: dict[str, UpstreamSpec] = {}


def named_upstream(name: str) -> UpstreamSpec | None:
    """The upstream registered as ``name`` (from the file or ``register_upstream``), if any."""
    return _SPECS.get(name)


def register_upstream(name: str, *, command: Sequence[str] | None = None, url: str | None = None,
                      env: Mapping[str, str] | None = None, cwd: str | None = None,
                      credentials: Any = None) -> UpstreamSpec:
    """Register the compensation handler ``mcp:<name>`` for the server ``command`` starts
    (stdio) or the one at ``url`` (Streamable HTTP); ``credentials`` as in the file."""
    check_name(name)
    uses = credentials if isinstance(credentials, tuple) else parse_credentials(
        credentials, f"upstream {name!r}", http=url is not None)
    if uses:
        install_mounted_resolver()
    if (command is None) == (url is None):
        raise ConfigurationError(f"upstream {name!r}: give exactly one of command (a stdio server) and url (a "
                                 f"Streamable HTTP server, http://host:port/mcp)")
    if url is not None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigurationError(f"upstream {name!r}: url must be http:// or https://, got {url!r}")
        spec = UpstreamSpec(name, url=url, credentials=uses)
        _register(spec)
        return spec
    if isinstance(command, str) or not command or not all(isinstance(c, str) and c for c in command):
        raise ConfigurationError(f"upstream {name!r}: command must be a non-empty list of strings "
                                 f"(['python', '-m', 'my_mcp_server']), got {command!r}")
    if env is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ConfigurationError(f"upstream {name!r}: env must map names to string values")
    spec = UpstreamSpec(name, tuple(command), dict(env or {}), cwd, credentials=uses)
    _register(spec)
    return spec


def _register(spec: UpstreamSpec) -> None:
    name = spec.name
    _SPECS[name] = spec

    async def undo(tool: str, arguments: Mapping[str, Any], idempotency_key: str | None = None) -> None:
        await spec.call_tool(tool, arguments, idempotency_key)

    undo.__qualname__ = f"upstream[{name}]"
    hname = handler_name(name)
    try:
        get_compensator(hname)
        from ..compensation import unregister_compensator

        unregister_compensator(hname)  # a re-registration replaces the spec (the same name, a new command)
    except HandlerNotRegistered:
        pass
    compensator(hname)(undo)


def load_upstreams(path: str) -> list[UpstreamSpec]:
    """Register every upstream of the JSON file at ``path`` (see the module doc)."""
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise ConfigurationError(f"{ENV_UPSTREAMS}: cannot read {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ConfigurationError(f"{ENV_UPSTREAMS}: {path} is not JSON ({exc})") from None
    if not isinstance(doc, dict):
        raise ConfigurationError(f"{path}: must be an object of name -> {{\"command\": [...]}}")
    out = []
    for name, entry in doc.items():
        where = f"{path}: upstream {name!r}"
        check_name(name, where)
        if not isinstance(entry, dict) or set(entry) - {"command", "env", "cwd", "url", "credentials"}:
            raise ConfigurationError(f"{where} must be {{\"command\": [\"python\", \"-m\", \"server\"]"
                                     f"[, \"env\": {{...}}, \"cwd\": DIR]}} or {{\"url\": \"http://host:port/mcp\"}}"
                                     f", each with an optional \"credentials\": [...]")
        try:
            out.append(register_upstream(name, command=entry.get("command"), url=entry.get("url"),
                                         env=entry.get("env"), cwd=entry.get("cwd"),
                                         credentials=entry.get("credentials")))
        except ConfigurationError as exc:
            raise ConfigurationError(f"{path}: {exc.message}") from None
    return out


_from_env = os.environ.get(ENV_UPSTREAMS, "").strip()
if _from_env:
    load_upstreams(_from_env)
