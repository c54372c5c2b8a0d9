"""``kubectl saga status``: the five kinds in a namespace (or all), and which agents
apply what, from the status the operator writes (docs/crds.md, "Acknowledgement").

One section per kind: kill switches (action, scope, engaged, acknowledged/matched, the
lagging agents by name), budget limits (used of max per window), saga policies (mode,
acknowledged, the agents enforcing them), model routes (hosts, preferred, acknowledged)
and approvals (pending first). A kind the user may not list is named as such and the
others are still shown (exit 1). An object whose ``Ready`` condition is not True shows
the condition's reason and message: that sentence is the operator's explanation.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from ._approvals import phase, render_approval
from ._cluster import PLURALS, ClusterError, connect
from ._switches import object_scope

__all__ = ["KINDS", "register", "render"]

#: The kinds, in the order status shows them, with a section title.
KINDS = (("KillSwitch", "kill switches"), ("BudgetLimit", "budget limits"), ("SagaPolicy", "saga policies"),
         ("ModelRoute", "model routes"), ("Approval", "approvals"))


def _ready(obj: dict[str, Any]) -> tuple[str, str]:
    """(status, "reason: message") of the Ready condition ("?" before the operator saw it)."""
    for c in (obj.get("status") or {}).get("conditions") or ():
        if c.get("type") == "Ready":
            return str(c.get("status")), f"{c.get('reason')}: {c.get('message')}".rstrip(": ")
    return "?", "not reconciled yet (is the operator running and watching this namespace?)"


def _agents(status: dict[str, Any]) -> str:
    agents = status.get("agents")
    if not agents:
        return "agents: not counted yet"
    text = f"agents {agents.get('acknowledged', 0)}/{agents.get('matched', 0)} acknowledged"
    if agents.get("matched", 0) == 0:
        text = "agents: none reads this namespace (nobody obeys it)"
    lagging = agents.get("lagging") or []
    if lagging:
        text += "; lagging: " + ", ".join(lagging)
    return text


def _refusals(status: dict[str, Any]) -> list[str]:
    """What a BudgetLimit or SagaPolicy refused or held for a human (``status.refusals``)."""
    r = status.get("refusals")
    if not isinstance(r, dict):
        return []
    text = f"refused {r.get('refused', 0)}, held for a human {r.get('heldForHuman', 0)}"
    last = r.get("last")
    if isinstance(last, dict):
        outcome = "held" if last.get("outcome") == "HeldForHuman" else "refused"
        text += (f"; last: {last.get('tool')} {outcome} by {last.get('by')} ({last.get('agent')}, "
                 f"{last.get('at')})")
    return [text]


def _name(obj: dict[str, Any], with_ns: bool) -> str:
    meta = obj["metadata"]
    return f"{meta.get('namespace')}/{meta['name']}" if with_ns else str(meta["name"])


def _line(kind: str, obj: dict[str, Any], with_ns: bool) -> list[str]:
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    ready, why = _ready(obj)
    name = _name(obj, with_ns)
    if kind == "KillSwitch":
        engaged = "engaged" if status.get("engaged") else "NOT engaged"
        expires = f", expires {status['expiresAt']}" if status.get("expiresAt") else ""
        head = (f"{name}: {str(spec.get('action', '?')).upper()} {object_scope(obj)} {engaged}{expires}, by "
                f"{spec.get('requestedBy')}: {spec.get('reason')}")
        detail = [_agents(status)]
    elif kind == "BudgetLimit":
        what = spec.get("arg") if spec.get("kind") == "Budget" else "calls"
        used = status.get("used")
        head = (f"{name}: {spec.get('kind')} {what} {'?' if used is None else used} of "
                f"{status.get('max', spec.get('maxTotal', spec.get('maxCalls')))} per {spec.get('window')}")
        detail = _refusals(status)
    elif kind == "SagaPolicy":
        head = (f"{name}: {spec.get('mode', 'Enforce')}, {status.get('tools', len(spec.get('tools') or {}))} tools, "
                f"{status.get('rules', len(spec.get('rules') or []))} rules, undeclared tools "
                f"{spec.get('undeclaredTools', 'Refuse')}")
        detail = [_agents(status)]
        if status.get("enforcedBy"):
            detail.append("enforced by: " + ", ".join(status["enforcedBy"]))
        detail += _refusals(status)
    else:  # ModelRoute
        head = (f"{name}: {status.get('hosts', len(spec.get('hosts') or []))} hosts, preferred "
                f"{status.get('preferred') or (spec.get('preference') or ['?'])[0]}")
        detail = [_agents(status)]
    if ready != "True":
        detail.append(f"Ready={ready} ({why})")
    return [head, *(f"    {d}" for d in detail)]


def render(objects: dict[str, list[dict[str, Any]]], *, where: str, with_ns: bool, now: datetime,
           refused: dict[str, str] | None = None) -> list[str]:
    """The status report for ``objects`` (kind -> items); ``refused``: kind -> why it
    could not be read (that section says so, the others are shown)."""
    out = [f"agent-saga in {where}"]
    for kind, title in KINDS:
        if refused and kind in refused:
            out.append(f"\n{title}: cannot be read: {refused[kind]}")
            continue
        items = objects.get(kind) or []
        if kind == "Approval":
            pending = [o for o in items if phase(o) == "Pending"]
            out.append(f"\n{title}: {len(pending)} pending, {len(items) - len(pending)} decided or expired")
            for obj in pending:
                out += [f"  {line}" for line in render_approval(obj, now=now, with_namespace=with_ns)]
            continue
        out.append(f"\n{title}: {len(items) or 'none'}")
        for obj in items:
            out += [f"  {line}" for line in _line(kind, obj, with_ns)]
    return out


def cmd_status(args: argparse.Namespace) -> int:
    """``status``."""
    cluster = connect(args)
    ns = cluster.scope_namespace()
    objects: dict[str, list[dict[str, Any]]] = {}
    refused: dict[str, str] = {}
    for kind, _ in KINDS:
        try:
            objects[kind] = cluster.list(kind, ns)
        except ClusterError as exc:
            if exc.code != 1:
                raise  # no cluster at all: nothing else would be readable either
            refused[kind] = exc.message
    if args.json:
        print(json.dumps({**{PLURALS[k]: v for k, v in objects.items()},
                          **({"refused": {PLURALS[k]: v for k, v in refused.items()}} if refused else {})},
                         default=str))
    else:
        where = "every namespace" if ns is None else f"namespace {ns}"
        ctx = f" (context {cluster.context})" if cluster.context else ""
        print("\n".join(render(objects, where=where + ctx, with_ns=ns is None, now=datetime.now(UTC),
                               refused=refused)))
    # Part of the picture is missing: say so in the exit code too.
    return 1 if refused else 0


def register(sub: Any, cluster_args: Any, fmt: Any) -> None:
    """Add ``status``."""
    p = sub.add_parser(
        "status", help="the kill switches, budgets, policies, routes and approvals in force, and which agents "
        "apply them", formatter_class=fmt,
        description="Summarise the five agent-saga kinds and which agents acknowledge them (the status the "
        "operator writes from the agents' heartbeats).",
        epilog="examples:\n  kubectl saga status -n payments\n  kubectl saga status -A\n"
        "  kubectl saga status -n payments --json")
    p.add_argument("--json", action="store_true", help="print the objects as JSON (kind plural -> items)")
    cluster_args(p)
    p.set_defaults(handler=cmd_status)
