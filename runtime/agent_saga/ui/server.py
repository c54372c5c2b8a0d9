"""The debugger's HTTP server: the standard library's, read-only, loopback unless a token.

    GET /                      the page (static HTML, JS and CSS shipped in the package)
    GET /api/status            the index's progress and the chain's state
    GET /api/sagas?status=&q=&offset=&limit=&asof=
    GET /api/saga?id=&asof=    one saga: steps, compensations, records
    GET /api/log?page=N        one page of the whole log
    GET /api/events?asof=      kill switch, breaker and WAL records
    GET /api/proof?id=         a selective-disclosure proof of one saga (a download)

Rules: only GET and HEAD (anything else is 405: the debugger never writes); with a token
every ``/api/`` request needs ``Authorization: Bearer TOKEN`` (else 401); the static files
carry no log data. Without a token the server binds only a loopback address and answers
only requests whose ``Host`` is a loopback name (a page elsewhere cannot rebind a DNS name
to it). Every response carries a Content-Security-Policy that allows no inline script.
"""

from __future__ import annotations

import hmac
import json
import threading
import urllib.parse
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any

from ..audit.encryption import PayloadEncryptor
from ..audit.merkle import build_disclosure
from ..errors import ConfigurationError, SagaError
from ..hosts import host_allowed, is_loopback
from ..records import Record
from . import views
from .index import LogIndex

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_STATIC = {"/": ("index.html", "text/html; charset=utf-8"),
           "/app.js": ("app.js", "text/javascript; charset=utf-8"),
           "/app.css": ("app.css", "text/css; charset=utf-8")}
__all__ = ["DebuggerServer", "check_bind", "is_loopback", "start"]


def check_bind(host: str, token: str | None) -> None:
    """Refuse to expose a log beyond this machine without a bearer token."""
    if not is_loopback(host) and not token:
        raise ConfigurationError(
            f"--host {host} would serve the log to other machines without authentication: "
            f"pass --token TOKEN or --token-file FILE (or set AGENT_SAGA_UI_TOKEN), or bind 127.0.0.1 and reach it "
            f"through an SSH tunnel or `kubectl port-forward`"
        )


class DebuggerServer(ThreadingHTTPServer):
    """A ThreadingHTTPServer that serves one ``LogIndex``."""

    daemon_threads = True

    def __init__(self, index: LogIndex, host: str, port: int, *, token: str | None = None,
                 encryptor: PayloadEncryptor | None = None) -> None:
        check_bind(host, token)
        self.index = index
        self.token = token
        self.encryptor = encryptor
        super().__init__((host, port), _Handler)

    @property
    def url(self) -> str:
        """The address to open (with a token: append ``#token=TOKEN``, which is never sent)."""
        host, port = self.server_address[:2]
        name = host.decode() if isinstance(host, bytes) else str(host)
        shown = f"[{name}]" if ":" in name else name
        return f"http://{shown}:{port}/"


def start(index: LogIndex, host: str = "127.0.0.1", port: int = 8080, **kw: Any) -> DebuggerServer:
    """Build the index on a thread and return the (not yet serving) server for it."""
    server = DebuggerServer(index, host, port, **kw)
    threading.Thread(target=index.build, name="agent-saga-ui-index", daemon=True).start()
    return server


class _Handler(BaseHTTPRequestHandler):
    server: DebuggerServer
    protocol_version = "HTTP/1.1"
    server_version = "agent-saga-ui"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # no access log: a query may name a saga

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        self._serve(head=True)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(head=False)

    def _refuse_write(self) -> None:
        self._send(HTTPStatus.METHOD_NOT_ALLOWED, {"error": "the debugger is read-only"}, extra={"Allow": "GET, HEAD"})

    do_POST = do_PUT = do_DELETE = do_PATCH = _refuse_write  # noqa: N815

    def _serve(self, head: bool) -> None:
        url = urllib.parse.urlsplit(self.path)
        if not self.server.token and not self._loopback_host():
            self._send(HTTPStatus.FORBIDDEN, {"error": "Host is not a loopback name"})
            return
        static = _STATIC.get(url.path)
        if static is not None:
            body = resources.files(__package__).joinpath("static", static[0]).read_bytes()
            self._send(HTTPStatus.OK, body, content_type=static[1], head=head)
            return
        route = _ROUTES.get(url.path)
        if route is None:
            self._send(HTTPStatus.NOT_FOUND, {"error": f"no such page {url.path}"}, head=head)
            return
        if self.server.token and not self._authorized():
            self._send(HTTPStatus.UNAUTHORIZED, {"error": "a bearer token is required"},
                       extra={"WWW-Authenticate": 'Bearer realm="agent-saga"'}, head=head)
            return
        query = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        try:
            reply = route(self.server, query)
        except (ValueError, SagaError) as exc:
            reply = HTTPStatus.BAD_REQUEST, {"error": str(exc)}, {}
        self._send(reply[0], reply[1], extra=reply[2], head=head)

    def _loopback_host(self) -> bool:
        return host_allowed(self.headers.get("Host") or "")

    def _authorized(self) -> bool:
        got = self.headers.get("Authorization") or ""
        scheme, _, value = got.partition(" ")
        token = self.server.token or ""
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(), token.encode())

    def _send(self, status: int, body: Any, *, content_type: str = "application/json",
              extra: dict[str, str] | None = None, head: bool = False) -> None:
        data = body if isinstance(body, bytes) else json.dumps(body, separators=(",", ":")).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Content-Security-Policy", CSP)
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(data)


Reply = tuple[int, Any, dict[str, str]]


def _int(query: dict[str, str], name: str, default: int | None) -> int | None:
    raw = query.get(name, "")
    if raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"?{name}={raw!r} is not an integer") from None


def _entry(server: DebuggerServer, query: dict[str, str]) -> Any:
    saga = query.get("id", "")
    entry = server.index.sagas.get(saga)
    if entry is None:
        raise ValueError(f"saga {saga!r} is not in this log (yet: the index is still being built)"
                         if not server.index.done else f"saga {saga!r} is not in this log")
    return entry


def _status(server: DebuggerServer, query: dict[str, str]) -> Reply:
    return HTTPStatus.OK, server.index.to_status(), {}


def _sagas(server: DebuggerServer, query: dict[str, str]) -> Reply:
    body = views.list_sagas(server.index, status=query.get("status", ""), query=query.get("q", ""),
                            offset=_int(query, "offset", 0) or 0, limit=_int(query, "limit", 50) or 50,
                            asof=_int(query, "asof", None))
    return HTTPStatus.OK, body, {}


def _saga(server: DebuggerServer, query: dict[str, str]) -> Reply:
    entry = _entry(server, query)
    return HTTPStatus.OK, views.saga_detail(server.index, entry, _int(query, "asof", None), server.encryptor), {}


def _log(server: DebuggerServer, query: dict[str, str]) -> Reply:
    return HTTPStatus.OK, views.log_page(server.index, _int(query, "page", 0) or 0, server.encryptor), {}


def _events(server: DebuggerServer, query: dict[str, str]) -> Reply:
    return HTTPStatus.OK, views.events(server.index, _int(query, "asof", None), server.encryptor), {}


def _proof(server: DebuggerServer, query: dict[str, str]) -> Reply:
    index = server.index
    entry = _entry(server, query)
    if not index.done or len(index.chains) != 1 or not index.chains[0][1].ok:
        return HTTPStatus.CONFLICT, {"error": "a disclosure proof needs one intact, fully indexed chain "
                                     "(`agent-saga verify` says what is wrong)"}, {}
    records = (r for _p, r in index.all_records() if isinstance(r, Record))
    proof = build_disclosure(records, entry.saga_id)
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in entry.saga_id)
    return HTTPStatus.OK, proof, {"Content-Disposition": f'attachment; filename="disclosure-{name}.json"'}


_ROUTES: dict[str, Callable[[DebuggerServer, dict[str, str]], Reply]] = {
    "/api/status": _status, "/api/sagas": _sagas, "/api/saga": _saga, "/api/log": _log,
    "/api/events": _events, "/api/proof": _proof,
}
