"""``agent-saga recover``: resolve orphaned sagas once, or read the human escalation queue.

    agent-saga recover --wal-path P --import myapp.handlers [--dry-run] [--json]
    agent-saga recover --wal-url 'redis://h:6379/0?key=agent-saga:wal' --redis-url redis://h:6379/0 \\
                       --import myapp.handlers
    agent-saga recover --wal-path P --escalations [--all]
    agent-saga recover --wal-path P --resolve-escalation ID --by NAME [--note TEXT]

Exit codes: 0 every orphan resolved cleanly (or nothing to do; for ``--escalations``: the
queue is empty); 1 something needs a human (a saga closed PARTIAL, escalations open, a
saga left for later: the sweep stopped early, e.g. on a location it cannot write; a broken
writer whose sagas were left alone; records a writer wrote into sagas it does not own); 2 bad
usage, or the sweep halted on a log it cannot read or verify (fail-closed: nothing was
acted on). An encrypted log is read with the key ``certify`` uses (``--wal-key-file``,
``AGENT_SAGA_WAL_KEY_FILE`` or ``AGENT_SAGA_WAL_KEY``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as _dt
import json
import os
import sys
from typing import Any

from ..audit.encryption import EncryptedWAL
from ..errors import ConfigurationError
from ..recovery.claims import ClaimLock
from ..recovery.daemon import RecoveryDaemon, SweepReport
from ..recovery.ledger import Escalation, FileLedger, RecoveryLedger
from ..recovery.targets import default_file_paths, open_claim_lock, open_fleet_wal
from ..wal.base import BaseWAL
from .keys import add_key_option, encryptor_from_args


def register(sub: Any) -> None:
    """Add ``recover`` to the command line."""
    p = sub.add_parser(
        "recover",
        help="resolve sagas whose owner died (compensate, or escalate to a human); list escalations",
        description="Run one recovery sweep over a log, or read the human escalation queue.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--wal-path", help="the FileWAL log of the dead process")
    src.add_argument(
        "--wal-url",
        help="a fleet log: redis://[:PASSWORD@]HOST:PORT/DB?key=KEY or postgresql://...?table=T "
        "(needs --redis-url, or --ledger and --claims, shared by every daemon)",
    )
    p.add_argument(
        "--import", dest="imports", action="append", default=[], metavar="MODULE",
        help="a module declaring @compensator handlers / @reconciler functions (repeatable)",
    )
    p.add_argument("--dry-run", action="store_true", help="print what would be done; claim and write nothing")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("--redis-url", help="share the ledger and the claims through this Redis (a fleet)")
    p.add_argument("--namespace", default="agent-saga", help="Redis key namespace (default: agent-saga)")
    p.add_argument("--ledger", help="the recovery journal file (default: <wal-path>.recovery.jsonl)")
    p.add_argument("--claims", help="the claims directory (default: <wal-path>.recovery-claims)")
    add_key_option(p)
    p.add_argument(
        "--lease-grace", type=float, default=5.0,
        help="seconds added to every lease for clock skew before a saga counts as orphaned (default 5)",
    )
    p.add_argument(
        "--allow", action="append", default=None, metavar="'WRITERS HANDLERS [REFS]'",
        help="which compensations may run for which writer: writer globs, handler globs, credential_ref "
        "globs, each comma-separated (repeatable). Without any: every registered handler, never with a "
        "credential_ref (docs/recovery.md)",
    )
    p.add_argument("--escalations", action="store_true", help="list the open escalations and exit")
    p.add_argument("--all", action="store_true", help="with --escalations: include resolved ones")
    p.add_argument("--resolve-escalation", metavar="ID", help="close an escalation a human has dealt with")
    p.add_argument("--by", help="with --resolve-escalation: who resolved it")
    p.add_argument("--note", default="", help="with --resolve-escalation: what was done")
    p.set_defaults(handler=cmd_recover)


def _ledger_and_lock(args: argparse.Namespace) -> tuple[RecoveryLedger | None, ClaimLock | None]:
    if args.redis_url:
        from ..recovery.redis import RedisLedger

        return (
            RedisLedger(args.redis_url, namespace=args.namespace),
            open_claim_lock(args.redis_url, namespace=args.namespace),
        )
    ledger_path, claims_dir = default_file_paths(args.wal_path) if args.wal_path else (None, None)
    ledger_path = args.ledger or ledger_path
    claims_dir = args.claims or claims_dir
    ledger = FileLedger(ledger_path) if ledger_path else None
    lock = open_claim_lock(claims_dir) if claims_dir else None
    return ledger, lock


def cmd_recover(args: argparse.Namespace) -> int:
    """``agent-saga recover``: resolve orphaned sagas once."""
    if args.wal_path and not (args.escalations or args.resolve_escalation) and not os.path.exists(args.wal_path):
        raise ConfigurationError(f"WAL file {args.wal_path!r} does not exist; check --wal-path")
    return asyncio.run(_recover(args))


async def _recover(args: argparse.Namespace) -> int:
    ledger, lock = _ledger_and_lock(args)
    if args.escalations or args.resolve_escalation:
        if ledger is None:
            raise ConfigurationError("name the ledger: --ledger PATH or --redis-url URL")
        try:
            if args.resolve_escalation:
                if not args.by:
                    raise ConfigurationError("--resolve-escalation needs --by NAME (who dealt with it)")
                ok = await ledger.resolve_escalation(args.resolve_escalation, by=args.by, note=args.note)
                print(f"escalation {args.resolve_escalation}: {'resolved' if ok else 'not found or already resolved'}")
                return 0 if ok else 1
            items = await ledger.escalations(include_resolved=args.all)
            _print_escalations(items, args.json)
            return 1 if any(e.open for e in items) else 0
        finally:
            await ledger.close()
    encryptor = encryptor_from_args(args)
    wal: BaseWAL | str
    opened: BaseWAL | None = None
    if args.wal_url:
        opened = wal = open_fleet_wal(args.wal_url)
        if encryptor is not None:
            wal = EncryptedWAL(opened, encryptor)
    else:
        wal = args.wal_path
    try:
        daemon = RecoveryDaemon(
            wal, ledger=ledger, lock=lock, imports=args.imports, lease_grace=args.lease_grace,
            encryptor=encryptor if args.wal_path else None, allow=args.allow,
        )
        try:
            report = await daemon.sweep(dry_run=args.dry_run)
        finally:
            await daemon.close()
    finally:
        if opened is not None:
            opened.close()
    _print_report(report, args.json)
    if report.halted:
        return 2
    needs_human = any(r.status not in ("ROLLED_BACK", "PLANNED", "RESOLVED", "LIVE") for r in report.results)
    # A broken writer's sagas, or records one writer forged into another's saga, wait for a human.
    needs_human = needs_human or report.awaits_human
    return 1 if needs_human or report.error else 0


def _print_report(report: SweepReport, as_json: bool) -> None:
    if as_json:
        print(json.dumps(report.to_dict(), indent=2, sort_keys=True))
        return
    print(report.summary())
    for r in report.results:
        line = f"  {r.saga_id:<40} {r.status}"
        if r.escalations:
            line += f"  escalated: {', '.join(r.escalations)}"
        if r.error:
            line += f"  ({r.error})"
        print(line)
        if r.plan is not None and (report.dry_run or r.status == "ROLLBACK_PARTIAL"):
            for s in r.plan.steps:
                print(f"      {s.describe()}")
    if report.halted:
        print(f"HALTED (fail-closed, nothing was acted on): {report.halted}", file=sys.stderr)
    elif report.error:
        print(f"STOPPED (the sweep ended early; what is left waits for the next run): {report.error}", file=sys.stderr)


def _when(ts: float) -> str:
    return _dt.datetime.fromtimestamp(ts, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _print_escalations(items: list[Escalation], as_json: bool) -> None:
    if as_json:
        print(json.dumps([e.to_json() for e in items], indent=2, sort_keys=True))
        return
    if not items:
        print("no open escalations")
        return
    for e in items:
        state = "OPEN" if e.open else f"resolved by {e.resolved_by}"
        print(f"{e.id}  {_when(e.ts)}  {e.kind:<22} {state}")
        print(f"    saga {e.saga_id} step {e.step_id} ({e.tool}, {e.semantics}) from {e.source}")
        print(f"    {e.reason}")
        if e.compensation:
            print(f"    compensation: {json.dumps(e.compensation, sort_keys=True)}")
        if e.note:
            print(f"    note: {e.note}")
