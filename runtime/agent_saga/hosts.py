"""Which ``Host`` (and ``Origin``) an HTTP server of ours answers: the guard against DNS
rebinding, shared by the debugger UI and the MCP proxy's ``--listen``.

A page on ``evil.example`` can make its DNS name resolve to 127.0.0.1 and then drive a
local server from the browser: the request arrives on the loopback interface, but its
``Host`` (and ``Origin``) still name ``evil.example``. So a server reachable without a
credential answers only a ``Host`` that is a loopback name, or one of the names it was
told to serve (``allowed``).

Invariants:
- The port is ignored: the name decides (``[::1]:8080`` is ``[::1]``).
- ``allowed`` names compare case-insensitively; nothing else is allowed by default.
- An ``Origin`` is allowed only when its host would be allowed as a ``Host``; ``null``
  (a sandboxed page, a file) never is. A request without ``Origin`` is not from a page.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from urllib.parse import urlsplit

__all__ = ["LOOPBACK_NAMES", "host_allowed", "host_name", "is_loopback", "origin_allowed"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "[::1]")


def is_loopback(host: str) -> bool:
    """Is ``host`` (an address or ``localhost``) a loopback address?"""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_name(value: str) -> str:
    """The name of a ``Host`` header value, without its port."""
    return value.split("]")[0] + "]" if value.startswith("[") else value.rsplit(":", 1)[0]


def host_allowed(value: str, allowed: Collection[str] = ()) -> bool:
    """Does a server answer the ``Host`` header ``value``? A loopback name, or one of
    ``allowed`` (lowercase names)."""
    name = host_name(value.strip()).lower()
    return bool(name) and (name in LOOPBACK_NAMES or is_loopback(name) or name in allowed)


def origin_allowed(value: str, allowed: Collection[str] = ()) -> bool:
    """Does a server answer a page of the ``Origin`` ``value``? Its host is allowed."""
    try:
        parts = urlsplit(value.strip())
    except ValueError:
        return False
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False
    return host_allowed(parts.netloc.rpartition("@")[2], allowed)
