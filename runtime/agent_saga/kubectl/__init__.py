"""``kubectl saga``: the day-to-day levers of agent-saga through the Kubernetes API.

A kubectl plugin (the ``kubectl-saga`` console script: ``kubectl saga ...`` finds it on
``PATH``). It acts as the user's own kubeconfig identity, so RBAC and admission decide
what they may do, and it needs no access to the policy plane (Redis): it makes and
deletes ``KillSwitch`` objects, decides ``Approval`` objects and reads the status the
operator writes. docs/kubectl-plugin.md is its guide.

Exit codes: 0 done; 1 refused or nothing to do (forbidden, denied by admission, not
found, already engaged or decided); 2 bad usage, no kubeconfig, or the cluster
unreachable.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..errors import SagaError
from . import _approvals, _status, _switches
from ._cluster import ClusterError, cluster_arguments

__all__ = ["build_parser", "main"]

_FORMAT = argparse.RawDescriptionHelpFormatter


def build_parser() -> argparse.ArgumentParser:
    """The ``kubectl saga`` command line."""
    parser = argparse.ArgumentParser(
        prog="kubectl saga",
        formatter_class=_FORMAT,
        description="agent-saga's levers through the Kubernetes API, as you: halt, drain or quarantine agents,\n"
        "resume them, answer approvals, and see what is in force and which agents obey. It uses your\n"
        "kubeconfig (--kubeconfig, --context, -n/--namespace, -A) like kubectl, so your RBAC and the\n"
        "cluster's admission policies apply; it needs no access to Redis.\n"
        "`kubectl saga COMMAND --help` shows each command with examples.",
        epilog="examples:\n"
        "  kubectl saga status -n payments\n"
        "  kubectl saga halt --scope tool:wire.send --reason 'fraud pattern' -n payments\n"
        "  kubectl saga drain --reason 'deploying v2' --ttl 10m -n payments\n"
        "  kubectl saga quarantine saga-8f3c --reason 'suspected duplicate charges' -n payments\n"
        "  kubectl saga resume --scope tool:wire.send -n payments\n"
        "  kubectl saga approvals list -A\n"
        "  kubectl saga approvals approve af83c011 --note 'verified by phone' -n payments\n"
        "\n"
        "exit codes: 0 done; 1 refused or nothing to do (forbidden, denied by admission, not found,\n"
        "already engaged or decided); 2 bad usage, no kubeconfig, or the cluster unreachable.",
    )
    cluster_arguments(parser)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _status.register(sub, cluster_arguments, _FORMAT)
    _switches.register(sub, cluster_arguments, _FORMAT)
    _approvals.register(sub, cluster_arguments, _FORMAT)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``kubectl saga``; return the exit code (also the console script)."""
    args = build_parser().parse_args(argv)
    command = args.command + (f" {args.approvals_command}" if getattr(args, "approvals_command", None) else "")
    try:
        code: int = args.handler(args)
    except ClusterError as exc:
        print(f"kubectl saga {command}: {exc}", file=sys.stderr)
        return exc.code
    except SagaError as exc:
        print(f"kubectl saga {command}: {exc}", file=sys.stderr)
        return 2
    return code
