"""``agent-saga approvals list | approve ID | deny ID``: answer an agent from anywhere.

    agent-saga approvals list
      [PENDING] wire.send -- Action cannot be undone (rule irreversible, 42s old, id af83c011)
            amount: 80000
            to: acct_9
    agent-saga approvals approve af83c011 --approver risk@corp --note "verified by phone"

The store is ``--store``, else ``$AGENT_SAGA_APPROVAL_STORE``, else
``$AGENT_SAGA_REDIS_URL`` (the policy plane, as agents wired by it use), else the
``FileApprovalStore`` directory ``./agent-saga-approvals`` if it exists; every command
says which store it read and why, and with none configured it says how to name one
(never a silent read of an empty local folder). The decision lands in the store; the
waiting agent sees it there (no connection into the agent). An ID may be a unique prefix.

``--signing-key KEY.pem`` (or ``$AGENT_SAGA_APPROVAL_SIGNING_KEY``) signs the decision
with the approver's Ed25519 key (``agent-saga keygen approver --out KEY.pem``): agents
that trust approver keys accept an approval only when it is signed by one of them.

Refused, with a message saying why: an approval without ``--approver`` (an anonymous
approval proves nothing), a break-glass approval without ``--note``, a request already
decided or past its deadline. Exit codes: 0 done, 1 refused, 2 bad usage or an
unreachable store.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from ..clocks import format_instant
from ..controls.approvals import (
    ApprovalRefused,
    ApprovalRequest,
    ApprovalStore,
    DecisionSigner,
    decide_request,
    open_approval_store,
)
from ..controls.approvals._signing import ENV_SIGNING_KEY
from ..errors import ConfigurationError
from ..plane import ENV_REDIS_URL, choose_store

__all__ = ["register"]

ENV_APPROVAL_STORE = "AGENT_SAGA_APPROVAL_STORE"
DEFAULT_DIR = "agent-saga-approvals"


def _store(args: argparse.Namespace) -> tuple[ApprovalStore, str]:
    """The store to read, and the sentence saying which it is and why."""
    choice = choose_store(args.store, ENV_APPROVAL_STORE, local_default=DEFAULT_DIR)
    if choice.target is None:
        raise ConfigurationError(
            f"no approval store configured: pass --store redis://HOST:PORT/DB, or set {ENV_APPROVAL_STORE} or "
            f"{ENV_REDIS_URL} (the policy plane your agents use); a directory (FileApprovalStore) works for "
            f"agents on this host only")
    return open_approval_store(choice.target), f"store: {choice.describe()}"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _line(r: ApprovalRequest, now: float) -> list[str]:
    rule = r.rule.split(":", 1)[1] if r.rule.startswith("rule:") else r.rule
    state = r.state.upper()
    if r.state == "Pending" and now >= r.deadline:
        state = "EXPIRED (unanswered)"
    elif r.decided and r.approver:
        state += f" by {r.approver}"
    if r.break_glass:
        state += ", BREAK-GLASS"
    if r.consumed_at is not None:
        state += ", used"
    head = (f"[{state}] {r.tool} -- {r.reason or 'approval required'} (rule {rule}, {_age(now - r.requested_at)} "
            f"old, id {r.id[:8]})")
    out = [head]
    out += [f"      {k}: {v}" for k, v in sorted(r.display.items())]
    out.append(f"      saga {r.saga_id}, step {r.step_id}, deadline {format_instant(r.deadline)}, id {r.id}")
    if r.note:
        out.append(f"      note: {r.note}")
    return out


def cmd_list(args: argparse.Namespace) -> int:
    store, which = _store(args)
    try:
        requests = store.list(pending_only=not args.all)
    finally:
        store.close()
    now = time.time()
    if not args.all:
        requests = [r for r in requests if now < r.deadline]
    if args.json:
        print(which, file=sys.stderr)
        print(json.dumps([r.view_doc() for r in requests], indent=2))
        return 0
    print(which)
    if not requests:
        print("no approval requests waiting" if not args.all else f"no approval requests in {store.describe()}")
    for r in requests:
        for line in _line(r, now):
            print("  " + line)
    return 0


def _decide(args: argparse.Namespace, approved: bool) -> int:
    if not (args.approver or "").strip():
        print(f"agent-saga approvals {'approve' if approved else 'deny'}: refused: --approver NAME is required "
              f"(an anonymous approval is an audit trail that proves nothing)", file=sys.stderr)
        return 2
    key = args.signing_key or os.environ.get(ENV_SIGNING_KEY, "").strip() or None
    signer = DecisionSigner.from_file(key) if key else None
    store, which = _store(args)
    try:
        r = decide_request(store, args.request_id, approved=approved, approver=args.approver, now=time.time(),
                           note=args.note, break_glass=getattr(args, "break_glass", False), signer=signer)
    except ApprovalRefused as exc:
        print(f"agent-saga approvals: refused: {exc.message} ({which})", file=sys.stderr)
        return 1
    finally:
        store.close()
    if args.json:
        print(json.dumps(r.view_doc()))
    else:
        glass = " (BREAK-GLASS: flagged for review)" if r.break_glass else ""
        signed = f", signed by key {signer.key_id}" if signer is not None else ", unsigned"
        print(f"{r.state.lower()} {r.id} ({r.tool}) by {r.approver}{glass}{signed}; the waiting agent sees it on "
              f"its next read of {store.describe()}")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    return _decide(args, True)


def cmd_deny(args: argparse.Namespace) -> int:
    return _decide(args, False)


def register(sub: Any) -> None:
    """Add ``approvals`` to the command line."""
    p = sub.add_parser("approvals", help="list the approval requests agents wait on; approve or deny one")
    asub = p.add_subparsers(dest="approvals_command", required=True, metavar="ACTION")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--store", default=None,
                       help=f"redis://HOST:PORT/DB or a directory (default: ${ENV_APPROVAL_STORE}, else "
                            f"${ENV_REDIS_URL}, else ./{DEFAULT_DIR} if it exists)")
        q.add_argument("--json", action="store_true")

    q = asub.add_parser("list", help="requests waiting for a human (--all: every request)")
    q.add_argument("--all", action="store_true", help="also decided and expired requests")
    common(q)
    q.set_defaults(handler=cmd_list)

    for name, handler, verb in (("approve", cmd_approve, "approve"), ("deny", cmd_deny, "deny")):
        q = asub.add_parser(name, help=f"{verb} a request (a named --approver is required)")
        q.add_argument("request_id", metavar="ID", help="the request id (a unique prefix is enough)")
        q.add_argument("--approver", default=None, help="who decides (required): risk@corp")
        q.add_argument("--note", default=None, help="why (lands in the WAL)")
        q.add_argument("--signing-key", default=None, metavar="PEM",
                       help=f"sign the decision with this Ed25519 private key (default: ${ENV_SIGNING_KEY}); "
                            f"agents that trust approver keys ignore an unsigned approval")
        if name == "approve":
            q.add_argument("--break-glass", action="store_true",
                           help="emergency override: recorded as APPROVAL_BREAK_GLASS, flagged for review (needs --note)")
        common(q)
        q.set_defaults(handler=handler)
