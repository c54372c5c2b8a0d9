"""``agent-saga wal quarantine``: set a RedisWAL writer aside, so recovery and certify skip it.

    agent-saga wal quarantine --wal-url 'redis://op:PW@redis:6379/0?key=agent-saga:wal' \\
        --writer payments/payments-7@4242-a1b2c3 --by oncall@corp --reason 'poisoned entry, INC-1234'
    agent-saga wal quarantine --wal-url URL --writer W --by NAME --reason TEXT --lift
    agent-saga wal quarantine --wal-url URL --list

A broken agent identity writer (a record that fails verification or cannot be read)
already holds back only its own sagas; quarantine is the operator's decision about it:
``verify`` no longer counts it (it prints it, QUARANTINED), ``certify`` and recovery skip
it and say so. Only agent identity writers (``<namespace>/<pod>[@...]``) can be
quarantined: a service writer's records (recovery's) close other agents' sagas, so
skipping them could compensate a saga twice. The quarantine is kept in
``<key>:quarantine`` and every quarantine and lift in ``<key>:quarantine:journal``
(who, why, when); it needs the operator's Redis credential (``agent-saga acl operator
--wal-key KEY``). A running recoveryd stops acting on a newly quarantined writer's sagas
at its next read; restart it after a lift, so it reads that writer from the start.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from ..errors import ConfigurationError, WALError
from ..wal.writers import is_identity_writer

__all__ = ["register"]


def cmd_quarantine(args: argparse.Namespace) -> int:
    """``agent-saga wal quarantine``: quarantine a writer, lift it, or list them."""
    from ..wal.readers import RedisLogReader, open_reader

    reader = open_reader(args.wal_url)
    try:
        if not isinstance(reader, RedisLogReader):
            raise ConfigurationError("--wal-url must name a RedisWAL (redis://...?key=KEY): writer quarantine "
                                     "is kept beside its streams")
        log: Any = reader._log
        if args.list:
            held = log.quarantined()
            if args.json:
                print(json.dumps([{"writer": w, **q} for w, q in sorted(held.items())], indent=2))
            else:
                for w, q in sorted(held.items()):
                    print(f"{w}  by {q.get('by')}  {q.get('reason')}")
                if not held:
                    print("no writer is quarantined")
            return 0
        if not (args.writer and args.by and args.reason):
            raise ConfigurationError("give --writer, --by and --reason (or --list)")
        if not is_identity_writer(args.writer):
            raise ConfigurationError(
                f"writer {args.writer!r} is not an agent identity writer (<namespace>/<pod>[@...]): its records "
                f"may close other agents' sagas, so recovery cannot skip them. Repair its stream instead")
        if not args.lift and args.writer not in log.writers():
            raise ConfigurationError(f"writer {args.writer!r} has not written to {reader.description}; "
                                     f"check --writer (agent-saga verify --wal-url URL lists them)")
        try:
            log.quarantine(args.writer, by=args.by, reason=args.reason, ts=time.time(), lift=args.lift)
        except reader._errors as exc:
            raise WALError(f"cannot write the quarantine of {reader.description}: "
                           f"{reader._scrub(f'{type(exc).__name__}: {exc}')}") from exc
    finally:
        reader.close()
    what = "lifted the quarantine of" if args.lift else "quarantined"
    print(f"{what} writer {args.writer} in {reader.description} (by {args.by}: {args.reason})")
    if args.lift:
        print("restart recovery (recoveryd) so it reads this writer from the start")
    return 0


def register(sub: Any) -> None:
    """Add ``wal quarantine`` to the command line."""
    wal = sub.add_parser("wal", help="administer a fleet log (quarantine a writer)")
    wsub = wal.add_subparsers(dest="wal_command", required=True, metavar="COMMAND")
    p = wsub.add_parser("quarantine", help="set a RedisWAL writer aside: recovery and certify skip it")
    p.add_argument("--wal-url", required=True,
                   help="the RedisWAL, redis://[USER:PASSWORD@]HOST:PORT/DB?key=KEY (the operator's credential)")
    p.add_argument("--writer", help="the writer id (<namespace>/<pod>[@...]), as `agent-saga verify` names it")
    p.add_argument("--by", help="who decides (recorded)")
    p.add_argument("--reason", help="why (recorded)")
    p.add_argument("--lift", action="store_true", help="end the writer's quarantine")
    p.add_argument("--list", action="store_true", help="list the quarantined writers")
    p.add_argument("--json", action="store_true", help="with --list: as JSON")
    p.set_defaults(handler=cmd_quarantine)
