"""``agent-saga verify`` and ``agent-saga inspect``: read a log without writing it.

The log is a FileWAL file (``--wal-path``) or any backend named by URL (``--wal-url``:
a path, ``file://``, ``redis://...?key=K[&writer=W]``,
``postgresql://...?table=T[&writer=W]``; see ``agent_saga.wal.readers``). A fleet log
holds one chain per writer; verify checks each and exits 0 only if all are intact.

Records of a type this version does not know are verified like any other and reported
(verify: a note and ``unknown_types``; inspect: flagged on their saga). Inspect reads an
encrypted log with the key every command uses (``cli.keys``), or says what it could not show.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import sys
from collections.abc import Iterator
from typing import Any

from ..audit.encryption import PayloadEncryptor, decrypt_record, is_envelope
from ..chain import RESERVED_SAGA, VerifyResult, verify_records
from ..errors import ConfigurationError
from ..history import fold
from ..records import Record, is_known_type
from ..wal.readers import FileLogReader, LogReader, open_reader
from ..wal.writers import SagaOwners, is_identity_writer
from .keys import add_key_option, encryptor_from_args


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
    add_key_option(p)
    p.add_argument("--json", action="store_true", help="print the sagas as JSON")
    p.add_argument("--saga", help="show only this saga, with its steps")
    p.set_defaults(handler=cmd_inspect)


class _Unknown:
    """Records of types this version does not know: how many of each, and the first one."""

    def __init__(self) -> None:
        self.types: dict[str, dict[str, Any]] = {}

    def see(self, location: str, rec: Record) -> None:
        if is_known_type(rec.type):
            return
        entry = self.types.setdefault(rec.type, {"type": rec.type, "count": 0, "first": location, "sagas": []})
        entry["count"] += 1
        if rec.saga not in entry["sagas"]:
            entry["sagas"].append(rec.saga)

    def note(self) -> str | None:
        if not self.types:
            return None
        parts = ", ".join(
            f"{e['type']} x{e['count']} (first at {e['first']}; saga {', '.join(e['sagas'][:3])}"
            f"{' ...' if len(e['sagas']) > 3 else ''})"
            for e in self.types.values()
        )
        return (
            f"note: records of a type this version of agent-saga does not know: {parts}. They are "
            f"part of the chain and verified like any other, but what they say cannot be read: "
            f"recovery does not act on a saga holding one and certify does not certify it. "
            f"Upgrade agent-saga to read them"
        )


class _Owners:
    """Which agent identity writer owns each saga (the first to write it, by ``gseq``), and
    the records other identity writers wrote of it (``wal.writers``)."""

    def __init__(self) -> None:
        self.sagas: dict[str, dict[str, tuple[int, int, str]]] = {}  # chain -> saga -> (first gseq, n, loc)

    def see(self, chain: str, location: str, rec: Record) -> None:
        g = rec.extra.get("gseq")
        mine = self.sagas.setdefault(chain, {})
        first, n, loc = mine.get(rec.saga, (g if isinstance(g, int) else 0, 0, location))
        mine[rec.saga] = (first, n + 1, loc)

    def foreign(self) -> dict[str, str]:
        """Each identity writer that wrote records of sagas another one owns: what it wrote."""
        owner: dict[str, tuple[int, str]] = {}
        for chain, sagas in self.sagas.items():
            for saga, (first, _n, _loc) in sagas.items():
                if saga not in owner or first < owner[saga][0]:
                    owner[saga] = (first, chain)
        out: dict[str, str] = {}
        for chain, sagas in sorted(self.sagas.items()):
            bad = [(saga, n, loc) for saga, (_f, n, loc) in sagas.items() if owner[saga][1] != chain]
            if bad:
                saga, _n, loc = bad[0]
                out[chain] = (
                    f"FOREIGN: {sum(n for _s, n, _l in bad)} record(s) of {len(bad)} saga(s) it does not own "
                    f"(first: {loc}, saga {saga}, owned by writer {owner[saga][1]}); certify and recovery "
                    f"ignore them. Find out how this writer came to write them; `agent-saga wal quarantine` "
                    f"sets it aside")
        return out


def _verify_chain(
    reader: LogReader, name: str, head: str | None, unknown: _Unknown, owners: _Owners | None = None
) -> VerifyResult:
    seen_head = head is None

    def watch(items: Any) -> Any:
        nonlocal seen_head
        for loc, item in items:
            if isinstance(item, Record):
                unknown.see(loc, item)
                if item.hash == head:
                    seen_head = True
                if owners is not None and item.saga != RESERVED_SAGA:
                    owners.see(name, loc, item)
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
        unknown = _Unknown()
        quarantined = reader.quarantined()
        owners = _Owners()
        results = [(name, _verify_chain(reader, name, args.head, unknown,
                                        owners if is_identity_writer(name) else None))
                   for name in chains if name not in quarantined]
        torn = reader.torn_tail_bytes()
    finally:
        reader.close()
    foreign = owners.foreign() if not isinstance(reader, FileLogReader) else {}
    ok = all(r.ok for _, r in results) and not foreign
    unknown_types = list(unknown.types.values())
    if isinstance(reader, FileLogReader):
        result = results[0][1]
        if args.json:
            print(json.dumps({**_as_dict(result), "torn_tail_bytes": torn, "unknown_types": unknown_types}, indent=2))
        else:
            print(result.describe())
            if torn:
                print(
                    f"note: the file ends in a torn fragment of {torn} bytes (an unacknowledged "
                    f"write cut by a crash); it is not part of the chain and the next writer moves it aside"
                )
            if unknown.note():
                print(unknown.note())
        return 0 if ok else 1
    if args.json:
        out = {
            "ok": ok,
            "log": reader.description,
            "chains": [{"writer": name, **_as_dict(r), "foreign": foreign.get(name)} for name, r in results],
            "quarantined": [{"writer": w, **q} for w, q in sorted(quarantined.items())],
            "unknown_types": unknown_types,
        }
        print(json.dumps(out, indent=2))
    else:
        for name, r in results:
            print(f"writer {name}: {r.describe()}")
            if name in foreign:
                print(f"writer {name}: {foreign[name]}")
        for w, q in sorted(quarantined.items()):
            print(f"writer {w}: QUARANTINED by {q.get('by') or '?'} ({q.get('reason') or 'no reason given'}): "
                  f"not verified; recovery and certify skip it")
        print(f"{'OK' if ok else 'BROKEN'}: {len(results)} chain(s) in {reader.description}"
              + (f", {len(quarantined)} quarantined" if quarantined else ""))
        if unknown.note():
            print(unknown.note())
    return 0 if ok else 1


def _when(ts_us: int) -> str:
    return _dt.datetime.fromtimestamp(ts_us / 1e6, _dt.UTC).strftime("%Y-%m-%d %H:%M:%S")


def _readable(records: Iterator[Record], encryptor: PayloadEncryptor | None, sealed: list[int],
              unknown: dict[str, list[Record]]) -> Iterator[Record]:
    """Records with payloads decrypted when a key was given (else envelopes stay, counted
    in ``sealed``); records of unknown types collected per saga in ``unknown``."""
    for rec in records:
        if not is_known_type(rec.type):
            unknown.setdefault(rec.saga, []).append(rec)
        if is_envelope(rec.payload):
            if encryptor is None:
                sealed[0] += 1
            else:
                rec = decrypt_record(rec, encryptor)
        yield rec


def cmd_inspect(args: argparse.Namespace) -> int:
    """``agent-saga inspect``: what the log says about each saga."""
    encryptor = encryptor_from_args(args)
    reader = _open(args)
    sealed = [0]
    unknown: dict[str, list[Record]] = {}
    owners = SagaOwners()
    try:
        # As certify reads it: quarantined writers skipped, records of sagas a writer does
        # not own left out (and named below).
        quarantined = reader.quarantined()
        records = (r for r in reader.records(skip=frozenset(quarantined)) if owners.admit(r))
        sagas = fold(_readable(records, encryptor, sealed, unknown))
    finally:
        reader.close()
    notes = _inspect_notes(sealed[0], unknown) + [f"note: ignored {text}" for text in owners.foreign.describe()]
    notes += [f"note: writer {w} is QUARANTINED by {q.get('by') or '?'}: its sagas are not shown"
              for w, q in sorted(quarantined.items())]
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
                "unknown_records": [
                    {"seq": r.seq, "type": r.type, "step": r.step} for r in unknown.get(s.saga_id, [])
                ],
            }
            for s in sagas.values()
        ]
        print(json.dumps(out, indent=2))
        for n in notes:
            print(n, file=sys.stderr)
        return 0
    if not sagas:
        print(f"no sagas in {where}")
    for s in sagas.values():
        dangling = s.dangling
        flag = f"  DANGLING: {', '.join(d.step_id for d in dangling)}" if dangling else ""
        odd = unknown.get(s.saga_id)
        if odd:
            flag += "  UNKNOWN RECORD TYPES: " + ", ".join(f"{r.type} (seq {r.seq})" for r in odd)
        print(f"{s.saga_id:40} {s.status:17} {len(s.steps):3} steps  {_when(s.started_ts)}{flag}")
        if args.saga:
            for st in s.steps.values():
                handler = (st.compensation or {}).get("handler") or "-"
                err = f"  error: {st.error}" if st.error else ""
                print(f"    {st.step_id:36} {st.tool:28} {st.semantics:12} {st.state:20} undo: {handler}{err}")
    for n in notes:
        print(n)
    return 0


def _inspect_notes(sealed: int, unknown: dict[str, list[Record]]) -> list[str]:
    notes: list[str] = []
    if sealed:
        notes.append(
            f"note: {sealed} records are encrypted and no key was given, so their contents are "
            f"not shown (tools, compensations): pass --wal-key-file FILE or set AGENT_SAGA_WAL_KEY"
        )
    n = sum(len(v) for v in unknown.values())
    if n:
        types = sorted({r.type for v in unknown.values() for r in v})
        notes.append(
            f"note: {n} records of a type this version of agent-saga does not know ({', '.join(types)}): "
            f"what they say is not shown; recovery does not act on a saga holding one. Upgrade "
            f"agent-saga to read them"
        )
    return notes
