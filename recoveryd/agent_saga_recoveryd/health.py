"""A tiny HTTP/1.1 server on the event loop: /metrics, /livez, /readyz (and /healthz).

- ``/livez``: 200 while the event loop answers (the process is not wedged). A halted
  daemon is alive: restarting it would not repair the log, and the alert must stay up.
- ``/readyz``: 200 once a sweep completed, while no daemon is halted, the last sweeps
  finished without error and the process is not draining; else 503 with the reason.
- ``/metrics``: the Prometheus text exposition.

One request per connection, bounded header size and read time; nothing else is served.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

log = logging.getLogger("agent_saga_recoveryd")

Handler = Callable[[], tuple[int, str, bytes]]
_REASONS = {200: "OK", 404: "Not Found", 405: "Method Not Allowed", 501: "Not Implemented", 503: "Service Unavailable"}


class HealthServer:
    """Serves ``routes`` (path -> handler returning status, content type, body)."""

    def __init__(self, routes: dict[str, Handler], host: str, port: int) -> None:
        self.routes = routes
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None

    async def start(self) -> int:
        """Listen; returns the port bound."""
        self._server = await asyncio.start_server(self._serve, self.host, self.port)
        sock = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])
        return self.port

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            parts = request_line.split()
            method, path = (parts[0], parts[1]) if len(parts) >= 2 else ("", "")
            path = path.split("?", 1)[0]
            handler = self.routes.get(path)
            if method not in ("GET", "HEAD"):
                status, ctype, body = 405, "text/plain", b"only GET\n"
            elif handler is None:
                status, ctype, body = 404, "text/plain", b"not found: /metrics /livez /readyz\n"
            else:
                status, ctype, body = handler()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        except Exception:  # noqa: BLE001 - a broken handler must not kill the server
            log.exception("health endpoint failed")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def close(self) -> None:
        """Stop listening."""
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
