"""``agent-saga reconcile``: ask the systems of record whether the log's claims are true.

    agent-saga reconcile --wal-path ./agent-saga.wal --import myapp.reconcilers
    agent-saga reconcile --wal-url 'postgresql://u@h/db?table=saga_wal' \\
        --import agent_saga.connectors.stripe --import agent_saga.connectors.postgres \\
        --since 24h --timeout 5 --rate 10 --json

Exit codes: 0 every effect checked was confirmed (or there was nothing to check); 1 drift:
the system of record contradicts the log; 3 no drift was seen but at least one effect
could not be verified (no reconciler, it raised, timed out or did not know) - never
counted as clean; 2 bad usage or an unreadable log.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import time
from typing import Any

from ..errors import ConfigurationError
from ..wal.readers import FileLogReader, open_reader
from .keys import add_key_option, encryptor_from_args

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNIT = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def register(sub: Any) -> None:
    """Add ``reconcile`` to the command line."""
    p = sub.add_parser(
        "reconcile",
        help="re-read every undone or in-doubt effect from the system of record; report drift",
        description=(
            "Ask each effect's @reconciler what the external system says, ignoring what the log "
            "concluded. Exit 0 clean, 1 drift, 3 something could not be verified, 2 bad usage."
        ),
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--wal-path", help="a FileWAL log")
    src.add_argument("--wal-url", help="a log by URL: redis://...?key=K or postgresql://...?table=T")
    p.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="a module declaring @reconciler functions, e.g. agent_saga.connectors.stripe (repeatable)",
    )
    p.add_argument("--since", help="only sagas started at or after this: an ISO-8601 time, or an age such as 30m, 24h, 7d")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds each check may take before it is unverifiable (default 10)")
    p.add_argument("--rate", type=float, default=None, help="at most this many checks per second (default: no limit)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_key_option(p)
    p.set_defaults(handler=cmd_reconcile)


def parse_since(value: str | None, now: float | None = None) -> int | None:
    """``--since`` as µs since the epoch; raises ``ConfigurationError`` naming the fix."""
    if value is None:
        return None
    m = _DURATION.match(value.strip())
    if m:
        ago = float(m.group(1)) * _UNIT[m.group(2)]
        return int(((time.time() if now is None else now) - ago) * 1_000_000)
    try:
        t = _dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise ConfigurationError(
            f"--since {value!r} is not a time: give an ISO-8601 time such as 2026-01-31T09:00:00Z "
            f"or an age such as 30m, 24h or 7d"
        ) from None
    if t.tzinfo is None:
        t = t.replace(tzinfo=_dt.UTC)
    return int(t.timestamp() * 1_000_000)


def cmd_reconcile(args: argparse.Namespace) -> int:
    """Run the pass and print it; the exit code is the report's."""
    if args.timeout <= 0:
        raise ConfigurationError(f"--timeout must be a positive number of seconds, got {args.timeout}")
    if args.rate is not None and args.rate <= 0:
        raise ConfigurationError(f"--rate must be a positive number of checks per second, got {args.rate}")
    from ..audit.encryption import decrypting
    from ..recovery.daemon import import_modules
    from ..recovery.reconciliation import reconcile_log

    since = parse_since(args.since)
    import_modules(args.imports)
    encryptor = encryptor_from_args(args)
    reader = open_reader(args.wal_url) if args.wal_url else FileLogReader(args.wal_path)
    try:
        records = list(decrypting(reader.records(), encryptor))
    finally:
        reader.close()
    report = reconcile_log(records, since_us=since, timeout=args.timeout, rate=args.rate)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2, default=str))
    else:
        for f in report.findings:
            print(f.line())
        print(report.summary())
    return report.exit_code
