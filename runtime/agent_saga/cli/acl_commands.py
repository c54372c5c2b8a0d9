"""``agent-saga acl ROLE``: the least-privilege Redis ACL user of one component.

    agent-saga acl agent --user payments-1 --agent payments/payments-1
    ACL SETUSER payments-1 reset on resetkeys ... (...)

Prints the ``ACL SETUSER`` command for ``agent``, ``approver`` (the CLI's credential) or
``operator`` (docs/threat-model.md says what each may do). No password is printed: add
``>PASSWORD`` yourself, from your secret store, or pipe into ``redis-cli`` and set it
there. ``--json`` prints the rules as a list.
"""

from __future__ import annotations

import argparse
import json
import shlex
from typing import Any

from ..plane import ROLES, acl_rules, acl_setuser

__all__ = ["register"]


def cmd_acl(args: argparse.Namespace) -> int:
    rules = acl_rules(args.role, prefix=args.key_prefix, limit_namespace=args.limit_namespace, agent=args.agent,
                      wal_keys=tuple(args.wal_key or ()))
    if args.json:
        print(json.dumps(rules))
        return 0
    print(" ".join(shlex.quote(a) for a in acl_setuser(args.user or f"agent-saga-{args.role}", rules)))
    return 0


def register(sub: Any) -> None:
    """Add ``acl`` to the command line."""
    p = sub.add_parser("acl", help="print the least-privilege Redis ACL user of a component (agent, approver, "
                                   "operator)")
    p.add_argument("role", choices=list(ROLES), help="the component: " + ", ".join(ROLES))
    p.add_argument("--user", default=None, help="the ACL user name (default: agent-saga-ROLE)")
    p.add_argument("--agent", default=None, metavar="NAMESPACE/POD",
                   help="agent only: the one pod whose heartbeat, approval requests, part of the limit "
                        "windows and RedisWAL writer streams (KEY:w:NAMESPACE/POD[@...]) this credential may "
                        "write (default: any agent's, the fleet's windows included; weaker)")
    p.add_argument("--wal-key", action="append", default=None, metavar="KEY",
                   help="agent: a RedisWAL key it appends to, to its own identity's streams only (with --agent); "
                        "operator: a RedisWAL whose writers it may quarantine (agent-saga:wal; repeatable)")
    p.add_argument("--key-prefix", default="agentsaga", help="the policy plane's key prefix (default: agentsaga)")
    p.add_argument("--limit-namespace", default="agent-saga",
                   help="the limit store's namespace (default: agent-saga)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_acl)
