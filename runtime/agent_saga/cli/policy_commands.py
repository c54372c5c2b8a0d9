"""``agent-saga policy check FILE | skeleton``: review a SagaPolicy before it governs.

(``policy replay`` and ``policy diff`` live in ``review_commands``.)

    agent-saga policy check saga-policy.json          # exit 0 if the file is a valid policy
    agent-saga policy skeleton -n payments -o policy.yaml

``check`` reads a policy file (the MCP proxy's JSON, or a SagaPolicy manifest in YAML or
JSON) with the same parser the runtime's gate and the operator use, and prints what it
declares (for each COMPENSABLE tool, its inverse and where each argument comes from), or
the first error with the field it names.

``skeleton`` writes a SagaPolicy manifest from the tool surface agents recorded in the
policy plane while an Observe-mode SagaPolicy governed them: every tool IRREVERSIBLE with
a TODO, nothing guessed. It reads ``--store`` (default ``$AGENT_SAGA_REDIS_URL``) and
says which store it read. It never overwrites a file: a reviewed policy is never replaced
by a fresh skeleton (write to a new file and diff).

Exit codes: 0 done, 1 the policy is invalid (check), 2 bad usage or an unreachable store.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

from ..controls.policy import PolicyError, load_policy_file, skeleton_yaml
from ..controls.policy._surface import read_surface
from . import review_commands
from .status_commands import StatusSection, register_section

__all__ = ["register"]

ENV_REDIS_URL = "AGENT_SAGA_REDIS_URL"
ENV_NAMESPACE = "AGENT_SAGA_NAMESPACE"


def register(sub: Any) -> None:
    """Add ``agent-saga policy check|skeleton`` to the CLI."""
    p = sub.add_parser("policy", help="check, diff or replay a SagaPolicy, or write a skeleton from the recorded tool surface")
    psub = p.add_subparsers(dest="policy_command", required=True, metavar="SUBCOMMAND")

    c = psub.add_parser("check", help="validate a policy file (JSON, or a SagaPolicy manifest)")
    c.add_argument("file", help="saga-policy.json, or a SagaPolicy manifest (YAML needs PyYAML)")
    c.set_defaults(handler=cmd_check)

    s = psub.add_parser("skeleton", help="write a SagaPolicy with every recorded tool IRREVERSIBLE and a TODO")
    s.add_argument("-n", "--namespace", default=None,
                   help=f"the namespace whose agents' tool surface to read (default: ${ENV_NAMESPACE})")
    s.add_argument("--agent", default=None, help="only this agent's surface (default: every agent's)")
    s.add_argument("--name", default=None, help="the SagaPolicy's name (default: the agent, else the namespace)")
    s.add_argument("-o", "--out", default="-", help="the file to write; never overwritten (default: stdout)")
    s.add_argument("--store", default=None, help=f"the policy plane, redis://... (default: ${ENV_REDIS_URL})")
    s.add_argument("--key-prefix", default="agentsaga", help="the policy plane's key prefix (default: agentsaga)")
    s.set_defaults(handler=cmd_skeleton)

    review_commands.add_policy_commands(psub)


def cmd_check(args: argparse.Namespace) -> int:
    try:
        policy = load_policy_file(args.file)
    except PolicyError as exc:
        print(f"agent-saga policy check: INVALID: {exc}", file=sys.stderr)
        return 1
    sems: dict[str, int] = {}
    for decl in policy.tools.values():
        sems[decl.semantics.value] = sems.get(decl.semantics.value, 0) + 1
    who = ", ".join(policy.applies_to.agents) if policy.applies_to else "every agent of its namespace"
    counts = ", ".join(f"{n} {s}" for s, n in sorted(sems.items())) or "no tools"
    print(f"{args.file}: valid. mode {policy.mode}, undeclared tools {policy.undeclared_tools}, {counts}, "
          f"{len(policy.rules)} rule(s); governs {who}")
    for name in sorted(policy.tools):
        comp = policy.tools[name].compensate
        if comp is not None:
            how = f"tool {comp.tool}" if comp.tool is not None else f"handler {comp.handler}"
            print(f"  {name}: undone by {how}({comp.sources()})")
    return 0


def cmd_skeleton(args: argparse.Namespace) -> int:
    url = (args.store or os.environ.get(ENV_REDIS_URL, "")).strip()
    namespace = (args.namespace or os.environ.get(ENV_NAMESPACE, "")).strip()
    if not url:
        print(f"agent-saga policy skeleton: no policy plane to read: pass --store redis://... or set "
              f"{ENV_REDIS_URL} (the Redis your agents and the operator share)", file=sys.stderr)
        return 2
    if not namespace:
        print(f"agent-saga policy skeleton: which namespace? pass -n NAMESPACE or set {ENV_NAMESPACE}",
              file=sys.stderr)
        return 2
    out = Path(args.out) if args.out != "-" else None
    if out is not None and out.exists():
        print(f"agent-saga policy skeleton: {out} exists and is never overwritten (a reviewed policy is never "
              f"replaced by a skeleton): write to a new file and diff", file=sys.stderr)
        return 2
    from .._redis import Target, connect
    from ..wal.urls import redact

    client = connect(url, feature="agent-saga policy skeleton", socket_timeout=5.0)
    try:
        entries, problems = read_surface(client, f"{args.key_prefix}:v1", namespace, args.agent)
    except Exception as exc:  # noqa: BLE001 - any failure to read is reported with the store
        print(f"agent-saga policy skeleton: the policy plane {redact(url)} could not be read "
              f"({Target.of(url).error_text(exc)})", file=sys.stderr)
        return 2
    finally:
        client.close()
    for p in problems:
        print(f"agent-saga policy skeleton: {p}", file=sys.stderr)
    agents = sorted({a for e in entries for a in e.agents})
    text = skeleton_yaml(entries, name=args.name or args.agent or namespace, namespace=namespace,
                         agents=[args.agent] if args.agent else agents,
                         generated_at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                         source=f"the tool surface in {redact(url)}")
    where = f"the tool surface recorded in {redact(url)}, namespace {namespace}" + (
        f", agent {args.agent}" if args.agent else "")
    if out is None:
        sys.stdout.write(text)
        print(f"agent-saga policy skeleton: {len({e.tool for e in entries})} tool(s) from {where}", file=sys.stderr)
        return 0
    try:
        with out.open("x", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        print(f"agent-saga policy skeleton: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {len({e.tool for e in entries})} tool(s), every one IRREVERSIBLE with a TODO, from {where}")
    return 0


# --------------------------------------------------------------------------- status
def _plane_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--plane", default=None, help=f"the policy plane whose agents to show (default: ${ENV_REDIS_URL})")


def _collect_plane(args: argparse.Namespace) -> StatusSection:
    """The agents keeping a heartbeat in the policy plane, and what each applied."""
    from .._redis import Target, connect
    from ..heartbeat import read_heartbeats
    from ..plane import choose_store

    choice = choose_store(getattr(args, "plane", None), ENV_REDIS_URL)
    if choice.target is None:
        return StatusSection("agents", [f"policy plane: none configured (set {ENV_REDIS_URL} or pass --plane)"],
                             {"plane": None, "agents": []})
    prefix = f"{(os.environ.get('AGENT_SAGA_KEY_PREFIX') or 'agentsaga').strip()}:v1"
    client = connect(choice.target, feature="agent-saga status", socket_timeout=5.0)
    now = time.time()
    try:
        beats, problems = read_heartbeats(client, prefix, now=now)
    except Exception as exc:  # noqa: BLE001 - reported with the store, exit 1
        why = Target.of(choice.target).error_text(exc)
        return StatusSection("agents", [f"policy plane: {choice.describe()}", f"UNREADABLE: {why}"],
                             {"plane": choice.describe(), "error": why, "agents": []}, ok=False)
    finally:
        client.close()
    lines = [f"policy plane: {choice.describe()}", f"{len(beats)} live agent process(es)"]

    def count(refs: object) -> str:
        return "not wired" if refs is None else str(len(refs))  # type: ignore[arg-type]

    for b in beats:
        lines.append(f"  {b.namespace}/{b.label} pid {b.pid}: {b.posture}; kill switches {count(b.killswitches)}, "
                     f"SagaPolicies {count(b.policies)}, limits {count(b.limits)}; beat {max(0.0, now - b.ts):.1f}s ago")
    lines += [f"  (skipped: {p})" for p in problems]
    return StatusSection("agents", lines, {"plane": choice.describe(), "source": choice.source,
                                           "agents": [b.to_doc() for b in beats]})


register_section("agents", _collect_plane, order=5, add_arguments=_plane_arguments)
