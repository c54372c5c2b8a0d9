"""Server addresses without their secrets: what a WAL may print about where it writes.

A Redis URL or a PostgreSQL DSN may carry a password (``redis://:pw@host``,
``postgresql://user:pw@host/db``, ``?password=pw``, libpq's ``password=pw``). It must
never reach a WAL record, a log line or an exception message, so every backend names its
server through ``redact`` and passes every message it builds through ``Scrubber``, which
also covers text a client library produced (an error that echoes its connection string).
"""

from __future__ import annotations

import re
import urllib.parse
from collections.abc import Iterable

MASK = "***"

_CONNINFO_PASSWORD = re.compile(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)
_QUERY_SECRETS = frozenset({"password", "pass", "passwd", "sslpassword", "token", "sentinel_password"})


def _is_url(target: str) -> bool:
    return "://" in target


def secrets_in(target: str) -> tuple[str, ...]:
    """Every form in which ``target``'s password could be echoed (raw, decoded)."""
    found: list[str] = []
    if _is_url(target):
        parts = urllib.parse.urlsplit(target)
        netloc = parts.netloc
        if "@" in netloc:
            userinfo = netloc.rsplit("@", 1)[0]
            if ":" in userinfo:
                found.append(userinfo.split(":", 1)[1])
        for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
            if k.lower() in _QUERY_SECRETS:
                found.append(v)
        raw_query = parts.query
        for piece in raw_query.split("&"):
            k, _, v = piece.partition("=")
            if k.lower() in _QUERY_SECRETS:
                found.append(v)
    else:
        for m in _CONNINFO_PASSWORD.finditer(target):
            v = m.group(2)
            found.append(v)
            if v.startswith("'") and v.endswith("'"):
                found.append(re.sub(r"\\(.)", r"\1", v[1:-1]))
    out: set[str] = set()
    for s in found:
        if s:
            out.add(s)
            out.add(urllib.parse.unquote(s))
            out.add(urllib.parse.quote(s, safe=""))
    return tuple(sorted((s for s in out if s), key=len, reverse=True))


def redact(target: str) -> str:
    """``target`` with any password replaced by ``***`` (safe to print and log)."""
    if not _is_url(target):
        return _CONNINFO_PASSWORD.sub(lambda m: m.group(1) + MASK, target)
    parts = urllib.parse.urlsplit(target)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, host = netloc.rsplit("@", 1)
        if ":" in userinfo:
            userinfo = userinfo.split(":", 1)[0] + ":" + MASK
        netloc = f"{userinfo}@{host}"
    query = "&".join(
        f"{k}={MASK}" if k.lower() in _QUERY_SECRETS else piece
        for piece in parts.query.split("&")
        if piece
        for k in (piece.partition("=")[0],)
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


class Scrubber:
    """Removes known secrets from text before it is logged, raised or written."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self._secrets = tuple(sorted({s for s in secrets if s}, key=len, reverse=True))

    def __call__(self, text: str) -> str:
        """``text`` with every known secret replaced by ``***``."""
        for s in self._secrets:
            if s in text:
                text = text.replace(s, MASK)
        return text
