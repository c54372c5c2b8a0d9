"""``agent-saga verify`` and ``agent-saga inspect``: read a log without writing it.

The log is a FileWAL file (``--wal-path``) or any backend named by URL (``--wal-url``:
a path, ``file://``, ``redis://...?key=K[&writer=W]``,
``postgresql://...?table=T[&writer=W]``; see ``agent_saga.wal.readers``). A fleet log
holds one chain per writer; verify checks each and exits 0 only if all are intact.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
from typing import Any

from ..chain import VerifyResult, verify_records
from ..errors import ConfigurationError
from ..history import fold
from ..wal.readers import FileLogReader, LogReader, open_reader


def _source(p: Any, what: str) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--wal-path", help=f"the FileWAL log {what}")
    g.add_argument(
        "--wal-url",
        help=f"the log {what}, by URL: a path, redis://[:PASSWORD@]HOST:PORT/DB?key=KEY"
        "[&writer=W], postgresql://USER[:PASSWORD]@HOST/DB?table=TABLE[&writer=W] "
        "(passwords are never printed)",
    )


def _open(args: argparse.Namespace) -> LogReader:
    if args.wal_path is not None:
        return FileLogReader(args.wal_path)
    return open_reader(args.wal_url)


def register(sub: Any) -> None:
    """Add ``verify`` and ``inspect`` to the command line."""
    p = sub.add_parser("verify", help="check the hash chain; exit 0 only if intact")
    _source(p, "to check")
    p.add_argument(
        "--head",
        help="a chain head recorded earlier (e.g. in an export manifest): fail unless the log "
        "still contains it, which detects a log truncated after that point (one chain only: "
        "name the writer with &writer= in a fleet URL)",
    )
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(handler=cmd_verify)

    p = sub.add_parser("inspect", help="list the sagas in a log with their status")
    _source(p, "to read")
    p.add_argument("--json", action="store_true", help="print the sagas as JSON")
    p.add_argument("--saga", help="show only this saga, with its steps")
    p.set_defaults(handler=cmd_inspect)


def _verify_chain(reader: LogReader, name: str, head: str | None) -> VerifyResult:
    seen_head = head is None

    def watch(items: Any) -> Any:
        nonlocal seen_head
        for loc, item in items:
            if getattr(item, "hash", None) == head:
                seen_head = True
            yield loc, item

    result = verify_records(watch(reader.chain(name)))
    if result.ok and not seen_head:
        result = VerifyResult(
            False, result.records, result.head, result.last_seq, result.last_seq + 1,
            f"{name} end",
            f"the expected head {head} is not in the log: records after it were removed "
            f"(the log was truncated) or this is a different log",
        )
    return result


def _as_dict(result: VerifyResult) -> dict[str, Any]:
    return {
        "ok": result.ok,
        "records": result.records,
        "head": result.head,
        "last_seq": result.last_seq,
        "first_bad_seq": result.first_bad_seq,
        "location": result.location,
        "reason": result.reason,
        "attested": result.attested,
    }


def cmd_verify(args: argparse.Namespace) -> int:
    """``agent-saga verify``: check the hash chain of a log."""
    reader = _open(args)
    try:
        chains = reader.chains()
        if args.head is not None and len(chains) != 1:
            raise ConfigurationError(
                f"--head names one chain, but {reader.description} holds {len(chains)} writers; "
                f"add &writer=NAME to the URL"
            )
        results = [(name, _verify_chain(reader, name, args.head)) for name in chains]
        torn = reader.torn_tail_bytes()
    finally:
        reader.close()
    ok = all(r.ok for _, r in results)
    if isinstance(reader, FileLogReader):
        result = results[0][1]
        if args.json:
            print(json.dumps({**_as_dict(result), "torn_tail_bytes": torn}, indent=2))
        else:
            print(result.describe())
            if torn:
                print(
                    f"note: the file ends in a torn fragment of {torn} bytes (an unacknowledged "
                    f"write cut by a crash); it is not part of the chain and the next writer moves it aside"
                )
        return 0 if ok else 1
    if args.json:
        out = {
            "ok": ok,
            "log": reader.description,
            "chains": [{"writer": name, **_as_dict(r)} for name, r in results],
        }
        print(json.dumps(out, indent=2))
    else:
        for name, r in results:
            print(f"writer {name}: {r.describe()}")
        print(f"{'OK' if ok else 'BROKEN'}: {len(results)} chain(s) in {reader.description}")
    return 0 if ok else 1


def _when(ts_us: int) -> str:
    return _dt.datetime.fromtimestamp(ts_us / 1e6, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def cmd_inspect(args: argparse.Namespace) -> int:
    """``agent-saga inspect``: what the log says about each saga."""
    reader = _open(args)
    try:
        sagas = fold(reader.records())
    finally:
        reader.close()
    where = reader.description
    if args.saga:
        if args.saga not in sagas:
            print(f"saga {args.saga!r} is not in {where}")
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
        print(f"no sagas in {where}")
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
