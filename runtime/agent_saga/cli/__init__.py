"""``agent-saga``: one subcommand per operator task.

Each subcommand lives in a module that exposes ``register(subparsers)``; the handler it
sets returns the process exit code. Exit codes: 0 success, 1 the check failed (a broken
chain, an uncertified log), 2 bad usage or unreadable input.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from ..errors import SagaError
from . import (
    acl_commands,
    approval_commands,
    audit_commands,
    help_text,
    mcp_commands,
    mesh_commands,
    policy_commands,
    quarantine_commands,
    reconcile_commands,
    recover_commands,
    review_commands,
    status_commands,
    switch_commands,
    ui_commands,
    wal_commands,
)

_MODULES = (
    wal_commands, status_commands, audit_commands, recover_commands, reconcile_commands, switch_commands,
    approval_commands, policy_commands, mcp_commands, acl_commands, ui_commands, mesh_commands,
    quarantine_commands, review_commands,
)


def build_parser() -> argparse.ArgumentParser:
    """The ``agent-saga`` command line."""
    parser = argparse.ArgumentParser(
        prog="agent-saga",
        description="The accountable runtime for AI agents, from the command line: verify, inspect,\n"
        "recover and audit write-ahead logs; halt, drain or quarantine agents; answer approval\n"
        "requests; check policies; read the controls' live state. `agent-saga COMMAND --help`\n"
        "shows each command with examples.",
        epilog="examples:\n"
        "  agent-saga verify --wal-path ./agent-saga.wal\n"
        "  agent-saga halt --scope tool:wire.send --reason 'fraud pattern' --by soc@corp\n"
        "  agent-saga approvals list\n"
        "  agent-saga status",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in _MODULES:
        module.register(sub)
    help_text.document(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; return the exit code (also used as the console script)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "imports", None):
        _importable_from_cwd()
    try:
        code: int = args.handler(args)
    except SagaError as exc:
        print(f"agent-saga {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


def _importable_from_cwd() -> None:
    """``--import myapp.handlers`` finds a module in the current directory, as ``python -m``
    would (a console script's path starts at its own directory, not the current one).
    Appended, so nothing installed is shadowed by a file of the same name here."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
