"""``agent-saga halt | quarantine | resume`` and the kill-switch section of ``status``.

    agent-saga halt --scope tool:wire.send --reason "fraud pattern" --by soc@corp
    agent-saga halt --drain --reason "deploying" --by ci@corp --ttl 600
    agent-saga quarantine saga-8f3c --reason "suspected duplicate charges" --by soc@corp
    agent-saga resume --scope tool:wire.send --by soc@corp

The store is ``--store``, else ``$AGENT_SAGA_SWITCH_STORE``, else ``$AGENT_SAGA_REDIS_URL``
(the policy plane agents wired by it watch): a ``redis://`` URL or a file path (a
``FileSwitchStore``: only processes on this host reading that file see it); else the
zero-setup default, ``agent-saga.switch.json`` beside the default WAL, which every agent
on this host with no store configured watches (a warning says it stops this host only). Every command
says which store it used and why. Levers are written exactly as the operator projects
``KillSwitch`` resources (docs/killswitch.md), with the id ``cli/<action>-<scope hash>-<random>``: each
engagement is its own lever (two operators halting one scope do not replace each
other), and ``resume --scope`` lifts every CLI lever on the scope.

Who/why/when: every agent watching the store records the change in its own WAL when it
sees it. With ``--wal-path`` / ``--wal-url`` the CLI also appends the change to that
log (a fleet log, or a log of its own: never the live FileWAL of a running agent, which
has exactly one writer). Exit codes: 0 done, 1 nothing to do / refused, 2 bad usage or
an unreachable store.

A write whose reply is lost (the connection closed: a restart, a failover, a client
killing connections) is sent again, a few times within seconds (``RedisSwitchStore``:
the writes are idempotent); the command says so ("landed after N attempts") and exits 2
if every attempt was lost, saying the lever may or may not be stored.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from .._identity import process_identity
from ..clocks import format_instant, parse_duration
from ..controls.killswitch import (
    ENGAGED,
    ENV_SWITCH_STORE,
    LIFTED,
    SWITCH_SAGA,
    Lever,
    LeverAction,
    SwitchStore,
    SwitchStoreUnavailable,
    default_switch_path,
    open_switch_store,
    parse_scope,
)
from ..errors import ConfigurationError
from ..plane import ENV_REDIS_URL, choose_store
from ..wal.base import BaseWAL
from ._clean import clean_name, clean_text
from .status_commands import StatusSection, register_section

__all__ = ["register"]

def parse_ttl(text: str) -> float:
    """Seconds from ``600``, ``600s``, ``10m`` or ``1h30m``."""
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--ttl {text!r}: {exc}") from None


def _store_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", default=None,
                   help=f"redis://HOST:PORT/DB or a file path (default: ${ENV_SWITCH_STORE}, else ${ENV_REDIS_URL}, "
                        f"else the zero-setup file beside the default WAL: this host only)")


def _wal_args(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group()
    g.add_argument("--wal-path", help="also record the change in this FileWAL (not a running agent's live log)")
    g.add_argument("--wal-url", help="also record the change in this fleet log: redis://HOST:PORT/DB?key=KEY")


def _open_store(args: argparse.Namespace) -> SwitchStore:
    choice = choose_store(args.store, ENV_SWITCH_STORE)
    target = choice.target
    if target is None:
        target = default_switch_path()
        choice_source = (f"the zero-setup default: no --store, ${ENV_SWITCH_STORE} or ${ENV_REDIS_URL}; it reaches "
                         f"agents on THIS HOST only")
        print(f"warning: no kill switch store configured: using {os.path.abspath(target)}, the zero-setup default "
              f"every agent without a store watches. It stops agents on THIS HOST ONLY, not a fleet: set "
              f"{ENV_SWITCH_STORE}=redis://... (the store your agents watch) or {ENV_REDIS_URL}", file=sys.stderr)
    else:
        choice_source = choice.source
    args.store_source = choice_source
    return open_switch_store(target, grace=0.0, warn=False)


def _open_wal(args: argparse.Namespace) -> BaseWAL | None:
    if getattr(args, "wal_path", None):
        from ..wal.file import FileWAL

        return FileWAL(args.wal_path)
    url = getattr(args, "wal_url", None)
    if not url:
        return None
    import urllib.parse

    from ..wal.redis import RedisWAL

    parts = urllib.parse.urlsplit(url)
    query = dict(urllib.parse.parse_qsl(parts.query))
    key = query.pop("key", None)
    rest = urllib.parse.urlunsplit((parts.scheme, parts.netloc, parts.path, urllib.parse.urlencode(query), ""))
    return RedisWAL(rest, key=key) if key else RedisWAL(rest)


def _record(args: argparse.Namespace, type_: str, payload: dict[str, Any]) -> str | None:
    wal = _open_wal(args)
    if wal is None:
        return None
    try:
        seq = wal.append(type_, SWITCH_SAGA, None, {**payload, "source": "cli",
                                                    "seen_by": process_identity().seen_by})
        wal.barrier_sync(seq)
    finally:
        wal.close()
    return f"recorded {type_} in the WAL (seq {seq})"


def _now() -> float:
    import time

    return time.time()


def _describe(lv: Lever) -> str:
    until = f", until {format_instant(lv.expires_at)}" if lv.expires_at is not None else ", until lifted"
    when = format_instant(lv.engaged_at) if lv.engaged_at is not None else "?"
    return f"{lv.action.value.upper()} {lv.scope} by {lv.requested_by} at {when}{until}: {lv.reason} (id {lv.id})"


def _repeats(store: SwitchStore) -> list[str]:
    """Why each repeat of the store's last request was needed (none: answered at once)."""
    return list(getattr(store, "last_repeats", ()))


def _landed(repeats: list[str], what: str = "landed") -> str | None:
    """``landed after N attempts (...)`` when a request needed repeats."""
    if not repeats:
        return None
    return (f"{what} after {len(repeats) + 1} attempts: the connection was lost {len(repeats)} time(s) "
            f"({repeats[-1]}) and the request was sent again")


def _engage(args: argparse.Namespace, action: LeverAction, scope: str) -> int:
    lever = Lever.new(action, scope, reason=clean_text("--reason", args.reason) or "",
                      by=clean_name("--by", args.by) or "", now=_now(), ttl=args.ttl)
    store = _open_store(args)
    try:
        store.engage(lever)
        repeats = _repeats(store)
    finally:
        store.close()
    recorded = _record(args, ENGAGED, {"lever": lever.describe(), "store": store.describe()})
    if args.json:
        print(json.dumps({"engaged": lever.describe(), "store": store.describe(), "recorded": recorded,
                          "attempts": len(repeats) + 1}))
        return 0
    print(f"engaged {_describe(lever)}")
    print(f"  in {store.describe()} (from {args.store_source})")
    if landed := _landed(repeats):
        print(f"  {landed}")
    if recorded:
        print(f"  {recorded}")
    if store.describe().startswith("FileSwitchStore"):
        print("  note: a file store reaches only processes on this host whose KillSwitch reads this file; "
              "use RedisSwitchStore for a fleet")
    return 0


def cmd_halt(args: argparse.Namespace) -> int:
    if args.drain:
        return _engage(args, LeverAction.DRAIN, args.scope)
    return _engage(args, LeverAction.HALT, args.scope)


def cmd_quarantine(args: argparse.Namespace) -> int:
    return _engage(args, LeverAction.QUARANTINE, f"saga:{args.saga_id}")


def cmd_resume(args: argparse.Namespace) -> int:
    if not args.by or not args.by.strip():
        raise ConfigurationError("resume needs --by NAME: who lifted the lever lands in the WAL")
    clean_name("--by", args.by)
    store = _open_store(args)
    try:
        levers = store.levers()
        read = _landed(_repeats(store), "read the levers")
        if args.id:
            chosen = [lv for lv in levers if lv.id == args.id]
        else:
            kind, value = parse_scope(args.scope)
            canonical = "global" if kind == "global" else f"{kind}:{value}"
            chosen = [lv for lv in levers if lv.scope == canonical]
        ours = [lv for lv in chosen if lv.id.startswith("cli/") or args.id]
        theirs = [lv for lv in chosen if lv not in ours]
        lifted, notes = [], []
        for lv in ours:
            gone = store.lift(lv.id)
            repeats = _repeats(store)
            if gone is None and repeats:
                gone = lv  # a repeat found it gone: the first attempt, whose reply was lost, lifted it
            if gone is not None:
                lifted.append(gone)
                if landed := _landed(repeats):
                    notes.append(f"{gone.id}: {landed}")
    finally:
        store.close()
    for lv in lifted:
        _record(args, LIFTED, {"id": lv.id, "how": "lifted", "by": args.by, "lever": lv.describe(),
                               "store": store.describe()})
    if args.json:
        print(json.dumps({"lifted": [lv.describe() for lv in lifted],
                          "still_engaged": [lv.describe() for lv in theirs]}))
    else:
        if read:
            print(read)
        for lv in lifted:
            print(f"lifted {_describe(lv)}")
        for note in notes:
            print(f"  {note}")
        for lv in theirs:
            ns, _, name = lv.id.partition("/")
            print(f"still engaged (a KillSwitch resource; the operator would put it back): {_describe(lv)}\n"
                  f"  lift it with: kubectl delete killswitch -n {ns} {name}")
        if not lifted and not theirs:
            what = f"id {args.id}" if args.id else f"scope {args.scope}"
            print(f"no lever engaged on {what}")
    return 0 if lifted and not theirs else 1


def register(sub: Any) -> None:
    """Add the kill switch commands (halt, drain, quarantine, resume, levers)."""
    p = sub.add_parser("halt", help="engage a HALT (or a DRAIN with --drain) on a scope")
    p.add_argument("--scope", default="global", help="global (default), tool:NAME_OR_GLOB, tag:TAG")
    p.add_argument("--drain", action="store_true", help="DRAIN: start no new sagas, let running ones finish")
    p.add_argument("--reason", required=True, help="why (lands in the WAL and in every refusal)")
    p.add_argument("--by", required=True, help="who pulls the lever (soc@corp)")
    p.add_argument("--ttl", type=parse_ttl, default=None, help="lift automatically after SECONDS (or 10m, 1h)")
    p.add_argument("--json", action="store_true")
    _store_args(p)
    _wal_args(p)
    p.set_defaults(handler=cmd_halt)

    p = sub.add_parser("quarantine", help="freeze one saga: its next step is refused, it is never rolled back")
    p.add_argument("saga_id", metavar="SAGA", help="the saga id, as agent-saga inspect prints it (saga-8f3c)")
    p.add_argument("--reason", required=True, help="why (lands in the WAL and in the refusal)")
    p.add_argument("--by", required=True, help="who freezes it (soc@corp)")
    p.add_argument("--ttl", type=parse_ttl, default=None, help="lift automatically after SECONDS (or 10m, 1h)")
    p.add_argument("--json", action="store_true")
    _store_args(p)
    _wal_args(p)
    p.set_defaults(handler=cmd_quarantine)

    p = sub.add_parser("resume", help="lift the levers engaged on a scope (or one lever by --id)")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--scope", help="global, tool:..., tag:..., saga:SAGA")
    g.add_argument("--id", help="one lever by id (NAMESPACE/NAME)")
    p.add_argument("--by", required=True, help="who lifts it")
    p.add_argument("--json", action="store_true")
    _store_args(p)
    _wal_args(p)
    p.set_defaults(handler=cmd_resume)


# --------------------------------------------------------------------------- status
def _status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--switch-store", default=None,
                   help=f"the kill switch store to read (default: ${ENV_SWITCH_STORE}, else ${ENV_REDIS_URL}, "
                        f"else the zero-setup file beside the default WAL)")


def _collect(args: argparse.Namespace) -> StatusSection:
    choice = choose_store(getattr(args, "switch_store", None), ENV_SWITCH_STORE)
    target, source = choice.target, choice.source
    if target is None:
        target = default_switch_path()
        source = "the zero-setup default: it reaches agents on this host only"
    try:
        store = open_switch_store(target, grace=0.0, warn=False)
    except ConfigurationError as exc:
        return StatusSection("kill switch", [f"store {target!r}: {exc.message}"], {"store": target}, ok=False)
    try:
        levers = store.levers()
    except SwitchStoreUnavailable as exc:
        return StatusSection("kill switch", [
            f"store: {store.describe()} (from {source})", f"UNREADABLE: {exc.message}",
            "agents honour their last known levers for their grace window, then refuse everything",
        ], {"store": store.describe(), "error": exc.message, "levers": []}, ok=False)
    finally:
        store.close()
    now = _now()
    active = [lv for lv in levers if not lv.expired(now)]
    lines = [f"store: {store.describe()} (from {source})"]
    if not active:
        lines.append("no lever engaged: agents run normally")
    for lv in active:
        lines.append(_describe(lv))
    return StatusSection("kill switch", lines, {"store": store.describe(), "source": source,
                                                "levers": [lv.describe() for lv in active]})


register_section("kill_switch", _collect, order=10, add_arguments=_status_arguments)
