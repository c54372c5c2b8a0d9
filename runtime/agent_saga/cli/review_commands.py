"""``agent-saga policy replay|diff`` and ``agent-saga limits replay``: review a change in git.

    agent-saga policy replay proposed.yaml --current policy.yaml --wal-path audit/records.ndjson
    agent-saga policy diff policy.yaml proposed.yaml --markdown
    agent-saga limits replay budget.yaml --wal-path audit/records.ndjson --since 7d

``policy replay`` evaluates every call a log records under the current and the proposed
SagaPolicies with the gate's own evaluation (``agent_saga.review``); ``policy diff`` says
what the proposed file tightens and loosens; ``limits replay`` charges the recorded calls
against proposed BudgetLimits in time order.

Exit codes (CI gates on them): 0 nothing changes (limits: nothing would be refused), 1
stricter only (limits: some calls refused or sent to a human), 3 something looser, 2 bad
input: a policy, limit file, log or option that cannot be used, named with its field.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from ..clocks import parse_duration
from ..controls.policy import PolicyError, PolicyInForce, load_policy_file, policies_from_documents
from ..errors import ConfigurationError, SagaError
from ..wal.readers import FileLogReader, LogReader, open_reader
from ..wal.writers import SagaOwners
from .keys import add_key_option, encryptor_from_args

if TYPE_CHECKING:
    from ..records import Record

# The review modules (the gate, the limit store) are imported by the commands that use
# them: every other `agent-saga` command starts without them.

__all__ = ["add_policy_commands", "register"]

T = TypeVar("T")

ENV_REDIS_URL = "AGENT_SAGA_REDIS_URL"
BAD_INPUT = 2


def _log_options(p: argparse.ArgumentParser) -> None:
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--wal-path", help="the log: a FileWAL file, or an exported audit bundle "
                   "(its directory, or its records.ndjson)")
    g.add_argument("--wal-url", help="the log by URL: redis://...?key=KEY, postgresql://...?table=T "
                   "(see `agent-saga verify --help`; passwords are never printed)")
    add_key_option(p)
    p.add_argument("--since", metavar="DURATION", help="only calls in the last DURATION (7d, 24h, 90m)")
    out = p.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the report as JSON")
    out.add_argument("--markdown", action="store_true", help="print the report as Markdown, for a pull-request comment")


def add_policy_commands(psub: Any) -> None:
    """Add ``policy replay`` and ``policy diff`` to the ``policy`` command."""
    r = psub.add_parser("replay", help="evaluate every recorded call under the current and a proposed policy")
    r.add_argument("proposed", nargs="+", metavar="PROPOSED",
                   help="the proposed SagaPolicy file(s): every policy that would be in force")
    r.add_argument("--current", action="append", default=[], metavar="FILE",
                   help="a SagaPolicy in force now (repeatable; default: no policy)")
    r.add_argument("--from-plane", action="append", default=[], metavar="NS/NAME",
                   help="a SagaPolicy in force now, read from the policy plane (repeatable)")
    r.add_argument("--store", default=None, help=f"the policy plane for --from-plane (default: ${ENV_REDIS_URL})")
    r.add_argument("--key-prefix", default="agentsaga", help="the policy plane's key prefix (default: agentsaga)")
    r.add_argument("--agent", default=None,
                   help="the agent whose calls the log holds (what appliesTo matches); needed when a policy has appliesTo")
    _log_options(r)
    r.set_defaults(handler=cmd_replay)

    d = psub.add_parser("diff", help="what a proposed SagaPolicy tightens and loosens, tool by tool")
    d.add_argument("old", help="the SagaPolicy file in force")
    d.add_argument("new", help="the proposed SagaPolicy file")
    out = d.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print the changes as JSON")
    out.add_argument("--markdown", action="store_true", help="print the changes as Markdown")
    d.set_defaults(handler=cmd_diff)


def register(sub: Any) -> None:
    """Add ``agent-saga limits replay``."""
    p = sub.add_parser("limits", help="replay proposed BudgetLimits over a recorded log")
    lsub = p.add_subparsers(dest="limits_command", required=True, metavar="SUBCOMMAND")
    r = lsub.add_parser("replay", help="where a proposed cap would have refused recorded calls")
    r.add_argument("file", help="BudgetLimit manifest(s), YAML (---) or JSON")
    _log_options(r)
    r.set_defaults(handler=cmd_limits_replay)


# --------------------------------------------------------------------------- inputs
def _fail(command: str, message: str) -> int:
    print(f"agent-saga {command}: {message}", file=sys.stderr)
    return BAD_INPUT


def _policies(paths: list[str]) -> list[PolicyInForce]:
    return [PolicyInForce(path, load_policy_file(path)) for path in paths]


def _from_plane(args: argparse.Namespace) -> list[PolicyInForce]:
    if not args.from_plane:
        return []
    url = (args.store or os.environ.get(ENV_REDIS_URL, "")).strip()
    if not url:
        raise ConfigurationError(f"--from-plane needs the policy plane: pass --store redis://... or set {ENV_REDIS_URL}")
    from .._redis import Target, connect
    from ..wal.urls import redact

    client = connect(url, feature="agent-saga policy replay", socket_timeout=5.0)
    out: list[PolicyInForce] = []
    try:
        for ref in args.from_plane:
            if ref.count("/") != 1 or "" in ref.split("/"):
                raise ConfigurationError(f"--from-plane {ref!r}: give NAMESPACE/NAME of a SagaPolicy")
            key = f"{args.key_prefix}:v1:sagapolicy:{ref}"
            try:
                raw = client.get(key)
            except Exception as exc:  # noqa: BLE001 - reported with the store
                raise ConfigurationError(f"the policy plane {redact(url)} could not be read "
                                         f"({Target.of(url).error_text(exc)})") from None
            if raw is None:
                raise ConfigurationError(f"--from-plane {ref}: no SagaPolicy {ref} in the policy plane {redact(url)} "
                                         f"(key {key}); `kubectl get sagapolicies -n {ref.split('/')[0]}` lists them")
            try:
                doc = json.loads(raw)
            except ValueError as exc:
                raise ConfigurationError(f"--from-plane {ref}: the document is not JSON ({exc})") from None
            found, problems = policies_from_documents([doc] if isinstance(doc, dict) else [])
            if problems or not found:
                raise ConfigurationError(f"--from-plane {ref}: {'; '.join(problems) or 'not a SagaPolicy document'}")
            out.extend(found)
    finally:
        client.close()
    return out


def _reader(args: argparse.Namespace) -> LogReader:
    if args.wal_url:
        return open_reader(args.wal_url)
    path = Path(args.wal_path)
    if path.is_dir():
        path = path / "records.ndjson"  # an exported audit bundle
    if not path.is_file():
        raise ConfigurationError(f"--wal-path {args.wal_path}: no such log (a FileWAL file, or an audit bundle's "
                                 f"directory)")
    return FileLogReader(str(path))


def _since(args: argparse.Namespace) -> int | None:
    if args.since is None:
        return None
    try:
        seconds = parse_duration(args.since)
    except ValueError as exc:
        raise ConfigurationError(f"--since {args.since!r}: {exc}") from None
    return int((time.time() - seconds) * 1e6)


def _records(reader: LogReader) -> Iterator[Record]:
    """The log as inspect and certify read it: quarantined writers skipped, and in a fleet
    log the records a writer wrote of a saga it does not own left out."""
    owners = SagaOwners()
    return (r for r in reader.records(skip=frozenset(reader.quarantined())) if owners.admit(r))


def _replayed(args: argparse.Namespace, command: str, consume: Callable[[Iterator[Any]], T]
              ) -> tuple[T | None, int, str]:
    """``(consume(the log's recorded calls), 0, the log's description)``, or ``(None, 2, ...)``
    after saying why the key, ``--since`` or the log cannot be used."""
    from ..review import recorded_calls

    try:
        encryptor = encryptor_from_args(args)
        since = _since(args)
        reader = _reader(args)
    except SagaError as exc:
        return None, _fail(command, str(exc)), ""
    try:
        return consume(recorded_calls(_records(reader), encryptor=encryptor, since_us=since)), 0, reader.description
    except SagaError as exc:
        return None, _fail(command, f"the log {reader.description} could not be read: {exc}"), reader.description
    finally:
        reader.close()


def _emit(args: argparse.Namespace, doc: dict[str, Any], text: str, markdown: str) -> None:
    if args.json:
        print(json.dumps(doc, indent=2, sort_keys=True))
    elif args.markdown:
        sys.stdout.write(markdown)
    else:
        sys.stdout.write(text)


# --------------------------------------------------------------------------- commands
def cmd_replay(args: argparse.Namespace) -> int:
    """``agent-saga policy replay``."""
    from ..review import policy_set, replay_markdown, replay_policies, replay_text

    try:
        proposed = _policies(args.proposed)
        current = _policies(args.current)
        current += _from_plane(args)
    except PolicyError as exc:
        return _fail("policy replay", f"INVALID: {exc}")
    except ConfigurationError as exc:
        return _fail("policy replay", str(exc))
    scoped = [p.id for p in (*proposed, *current) if p.policy.applies_to is not None]
    if scoped and not args.agent:
        return _fail("policy replay", f"--agent: {', '.join(scoped)} governs only some agents (appliesTo): name the "
                     f"agent whose calls the log holds with --agent NAME (its AGENT_SAGA_AGENT)")
    agent = args.agent or "agent"
    report, code, where = _replayed(args, "policy replay", lambda calls: replay_policies(
        calls, policy_set(current, agent), policy_set(proposed, agent)))
    if report is None:
        return code
    notes = ["rules the agent's code adds to its gate, the limits, the kill switch and the breaker are not "
             "replayed; the inverses a policy names are taken as registered in the agent"]
    meta = {"log": where, "agent": args.agent, "since": args.since,
            "current": [p.id for p in current], "proposed": [p.id for p in proposed], "notes": notes}
    doc = {**report.to_doc(), **meta}
    _emit(args, doc, replay_text(report, meta), replay_markdown(report, meta))
    return report.exit_code()


def cmd_diff(args: argparse.Namespace) -> int:
    """``agent-saga policy diff``."""
    from ..review import diff_exit_code, diff_markdown, diff_policies, diff_text

    try:
        old = load_policy_file(args.old)
        new = load_policy_file(args.new)
    except PolicyError as exc:
        return _fail("policy diff", f"INVALID: {exc}")
    changes = diff_policies(old, new)
    code = diff_exit_code(changes)
    doc = {"old": args.old, "new": args.new, "changes": [c.to_doc() for c in changes],
           "stricter": sum(c.direction == "stricter" for c in changes),
           "looser": sum(c.direction == "looser" for c in changes),
           "by_tool": _by_tool(changes)}
    _emit(args, doc, diff_text(changes, args.old, args.new), diff_markdown(changes, args.old, args.new))
    return code


def _by_tool(changes: list[Any]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for c in changes:
        if c.scope.startswith("tool:"):
            out.setdefault(c.scope[5:], []).append(c.to_doc())
    return out


def cmd_limits_replay(args: argparse.Namespace) -> int:
    """``agent-saga limits replay``."""
    from ..review import (
        limits_markdown,
        limits_text,
        load_limit_file,
        replay_limits,
    )

    try:
        limits = load_limit_file(args.file)
    except SagaError as exc:
        return _fail("limits replay", str(exc))
    doc, code, where = _replayed(args, "limits replay", lambda calls: replay_limits(calls, limits))
    if doc is None:
        return code
    doc["log"] = where
    _emit(args, doc, limits_text(doc), limits_markdown(doc))
    return 1 if doc["refused"] or doc["escalated"] else 0
