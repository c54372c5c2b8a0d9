"""``agent-saga verify`` and ``agent-saga inspect``: read a FileWAL log without writing it."""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from typing import Any

from ..chain import VerifyResult, verify_records
from ..history import fold
from ..wal.file import iter_file_records, torn_tail_bytes


def register(sub: Any) -> None:
    p = sub.add_parser("verify", help="check the hash chain; exit 0 only if intact")
    p.add_argument("--wal-path", required=True, help="the FileWAL log to check")
    p.add_argument(
        "--head",
        help="a chain head recorded earlier (e.g. in an export manifest): fail unless the log "
        "still contains it, which detects a log truncated after that point",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("inspect", help="list the sagas in a log with their status")
    p.add_argument("--wal-path", required=True, help="the FileWAL log to read")
    p.add_argument("--json", action="store_true", help="print the sagas as JSON")
    p.add_argument("--saga", help="show only this saga, with its steps")
    p.set_defaults(handler=cmd_inspect)


def cmd_verify(args: argparse.Namespace) -> int:
    seen_head = args.head is None
    records = iter_file_records(args.wal_path)
    if args.head is not None:

        def watch(items: Any) -> Any:
            nonlocal seen_head
            for loc, item in items:
                if getattr(item, "hash", None) == args.head:
                    seen_head = True
                yield loc, item

        records = watch(records)
    result = verify_records(records)
    if result.ok and not seen_head:
        result = VerifyResult(
            False, result.records, result.head, result.last_seq, result.last_seq + 1,
            f"{args.wal_path} end",
            f"the expected head {args.head} is not in the log: records after it were removed "
            f"(the log was truncated) or this is a different log",
        )
    torn = torn_tail_bytes(args.wal_path)
    if args.json:
        out = {
            "ok": result.ok,
            "records": result.records,
            "head": result.head,
            "last_seq": result.last_seq,
            "first_bad_seq": result.first_bad_seq,
            "location": result.location,
            "reason": result.reason,
            "torn_tail_bytes": torn,
        }
        print(json.dumps(out, indent=2))
    else:
        print(result.describe())
        if torn:
            print(
                f"note: the file ends in a torn fragment of {torn} bytes (an unacknowledged "
                f"write cut by a crash); it is not part of the chain and the next writer moves it aside"
            )
    return 0 if result.ok else 1


def _when(ts_us: int) -> str:
    return _dt.datetime.fromtimestamp(ts_us / 1e6, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def cmd_inspect(args: argparse.Namespace) -> int:
    records = []
    for _, item in iter_file_records(args.wal_path):
        if isinstance(item, Exception):
            raise item
        records.append(item)
    sagas = fold(records)
    if args.saga:
        if args.saga not in sagas:
            print(f"saga {args.saga!r} is not in {args.wal_path}")
            return 1
        sagas = {args.saga: sagas[args.saga]}
    if args.json:
        out = [
            {
                "saga_id": s.saga_id,
                "name": s.name,
                "status": s.status,
                "started": _when(s.started_ts),
                "steps": [
                    {
                        "step_id": st.step_id,
                        "tool": st.tool,
                        "semantics": st.semantics,
                        "state": st.state,
                        "compensation": st.compensation,
                        "error": st.error,
                    }
                    for st in s.steps.values()
                ],
                "dangling": [st.step_id for st in s.dangling],
            }
            for s in sagas.values()
        ]
        print(json.dumps(out, indent=2))
        return 0
    if not sagas:
        print(f"no sagas in {args.wal_path}")
        return 0
    for s in sagas.values():
        dangling = s.dangling
        flag = f"  DANGLING: {', '.join(d.step_id for d in dangling)}" if dangling else ""
        print(f"{s.saga_id:40} {s.status:17} {len(s.steps):3} steps  {_when(s.started_ts)}{flag}")
        if args.saga:
            for st in s.steps.values():
                handler = (st.compensation or {}).get("handler") or "-"
                err = f"  error: {st.error}" if st.error else ""
                print(f"    {st.step_id:36} {st.tool:28} {st.semantics:12} {st.state:20} undo: {handler}{err}")
    return 0
