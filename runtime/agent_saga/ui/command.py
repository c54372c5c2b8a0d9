"""``agent-saga ui`` and ``python -m agent_saga.ui``: the options and the command.

    agent-saga ui --wal-path ./agent-saga.wal [--port 8080] [--host 127.0.0.1] [--token T]
    agent-saga ui --wal-url 'redis://:PASSWORD@redis:6379/0?key=agent-saga:wal'
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from ..audit.keys import reader_encryptor
from ..errors import ConfigurationError
from ..wal.readers import FileLogReader, open_reader

TOKEN_ENV = "AGENT_SAGA_UI_TOKEN"


def add_arguments(p: Any) -> None:
    """The debugger's options (shared by ``agent-saga ui`` and ``python -m agent_saga.ui``)."""
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--wal-path", help="the FileWAL log to show")
    g.add_argument(
        "--wal-url",
        help="the log to show, by URL: a path, redis://[:PASSWORD@]HOST:PORT/DB?key=KEY[&writer=W], "
        "postgresql://USER[:PASSWORD]@HOST/DB?table=TABLE[&writer=W] (passwords are never printed)",
    )
    p.add_argument("--host", default="127.0.0.1",
                   help="the address to bind (default 127.0.0.1; any other needs --token)")
    p.add_argument("--port", type=int, default=8080, help="the port to bind (default 8080; 0 picks a free one)")
    t = p.add_mutually_exclusive_group()
    t.add_argument("--token", default=None,
                   help=f"a bearer token every API request must carry (default: ${TOKEN_ENV}); "
                   "required to bind a non-loopback address")
    t.add_argument("--token-file", metavar="FILE",
                   help="read the bearer token from this file (keeps it out of the process list)")
    p.add_argument(
        "--wal-key-file", metavar="FILE",
        help="a file holding the log's encryption key(s), to show encrypted payloads (default: "
        "$AGENT_SAGA_WAL_KEY_FILE, else the key itself in $AGENT_SAGA_WAL_KEY)",
    )


def cmd_ui(args: argparse.Namespace) -> int:
    """Serve the debugger until interrupted."""
    from .index import LogIndex  # the index and the HTTP server load for this command only
    from .server import start

    token = _token(args)
    encryptor = reader_encryptor(args.wal_key_file)
    reader = FileLogReader(args.wal_path) if args.wal_path is not None else open_reader(args.wal_url)
    try:
        server = start(LogIndex(reader), args.host, args.port, token=token, encryptor=encryptor)
    except BaseException:
        reader.close()
        raise
    hint = " (append #token=TOKEN to open it)" if token else ""
    print(f"agent-saga ui: {reader.description} at {server.url}{hint} (read-only; Ctrl-C stops)", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        reader.close()
    return 0


def _token(args: argparse.Namespace) -> str | None:
    if args.token_file:
        try:
            with open(args.token_file, encoding="utf-8") as f:
                token = f.read().strip()
        except OSError as exc:
            raise ConfigurationError(f"--token-file {args.token_file!r} cannot be read: {exc.strerror}") from exc
        if not token:
            raise ConfigurationError(f"--token-file {args.token_file!r} is empty: write the token in it")
        return token
    given: str | None = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    if given is not None and not given.strip():
        raise ConfigurationError(f"the token is empty: give --token a value, or unset {TOKEN_ENV}")
    return given.strip() if given else None


def main(argv: list[str] | None = None) -> int:
    """``python -m agent_saga.ui``."""
    from ..errors import SagaError

    parser = argparse.ArgumentParser(prog="python -m agent_saga.ui",
                                     description="The time-travel debugger: a read-only web view of a WAL.")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return cmd_ui(args)
    except (SagaError, OSError) as exc:
        print(f"agent-saga ui: {exc}", file=sys.stderr)
        return 2
