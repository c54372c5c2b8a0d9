"""``kubectl saga approvals list | approve | deny``: Approvals answered as the user.

A decision is a merge patch of the Approval's ``spec.decision``, ``spec.approver`` and
``spec.note`` (with the object's ``resourceVersion``, so a decision is made on exactly
what was shown). The API server then applies its rules: RBAC (the chart's
``<release>-approver`` role), the approver admission policy (``spec.approver`` must be
the requesting user), the CRD's immutability rules (a decision is final) and
``passkeyRequired`` (approve those with ``agent-saga approvals sign``). ``--approver``
defaults to the user the API server authenticates (a SelfSubjectReview).

Nothing is signed here: the operator signs every decision it writes back from an
Approval (docs/approvals.md, "Proof of the approver"); an approver's CLI signing key is
for decisions written straight to the policy plane with ``agent-saga approvals``.
"""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

from ..errors import ConfigurationError
from ._cluster import GROUP, PLURALS, VERSION, Cluster, ClusterError, connect, network_errors

__all__ = ["BREAK_GLASS", "decision_patch", "phase", "register", "render_approval"]

BREAK_GLASS = "agentsaga.dev/break-glass"
_PLURAL = PLURALS["Approval"]


def phase(obj: dict[str, Any]) -> str:
    """Pending, Approved, Denied or Expired: the operator's ``status.phase``, else the
    decision in spec (not yet written back), else Pending."""
    st = (obj.get("status") or {}).get("phase")
    if st:
        return str(st)
    return str((obj.get("spec") or {}).get("decision") or "Pending")


def _age(text: str | None, now: datetime) -> str:
    if not text:
        return "?"
    try:
        then = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return text
    secs = int((now - then).total_seconds())
    sign, secs = ("in ", -secs) if secs < 0 else ("", secs)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if secs >= size:
            text = f"{secs // size}{unit}"
            break
    else:
        text = f"{secs}s"
    return f"{sign}{text}" if sign else f"{text} ago"


def render_approval(obj: dict[str, Any], *, now: datetime, with_namespace: bool) -> list[str]:
    """Lines for one Approval, as ``agent-saga approvals list`` prints a request."""
    meta, spec, status = obj["metadata"], obj.get("spec") or {}, obj.get("status") or {}
    where = f"{meta.get('namespace')}/" if with_namespace else ""
    ph = phase(obj)
    reason = spec.get("reason") or "needs a human"
    head = (f"[{ph.upper()}] {spec.get('tool')} -- {reason} (rule {spec.get('rule')}, saga {spec.get('sagaId')}, "
            f"id {where}{meta['name']})")
    lines = [head]
    for k, v in (spec.get("display") or {}).items():
        lines.append(f"      {k}: {v}")
    if ph == "Pending":
        lines.append(f"      deadline {spec.get('deadline')} ({_age(spec.get('deadline'), now)}; no answer denies)")
        if spec.get("passkeyRequired"):
            lines.append(f"      needs the approver's passkey: approve with agent-saga approvals sign "
                         f"{spec.get('requestId')} (here it can only be denied)")
        if (meta.get("annotations") or {}).get(BREAK_GLASS) == "true":
            lines.append("      marked break-glass")
    else:
        who = status.get("approver") or spec.get("approver")
        lines.append(f"      {ph.lower()}" + (f" by {who}" if who else "") +
                     (f" at {status['decidedAt']}" if status.get("decidedAt") else "") +
                     (f": {spec['note']}" if spec.get("note") else ""))
        if status.get("signedBy"):
            lines.append(f"      signed by key {status['signedBy']}")
    return lines


def decision_patch(obj: dict[str, Any], decision: str, approver: str, note: str | None,
                   break_glass: bool) -> dict[str, Any]:
    """The merge patch that decides ``obj`` (guarded by its ``resourceVersion``)."""
    spec: dict[str, Any] = {"decision": decision, "approver": approver}
    if note is not None:
        if not note.strip():
            raise ConfigurationError("--note is blank: say why, or leave it out")
        spec["note"] = note
    meta: dict[str, Any] = {"resourceVersion": obj["metadata"]["resourceVersion"]}
    if break_glass:
        meta["annotations"] = {BREAK_GLASS: "true"}
    return {"metadata": meta, "spec": spec}


def _find(cluster: Cluster, ident: str) -> dict[str, Any]:
    """The Approval named ``ident`` in the namespace, or the one whose name starts with it."""
    if cluster.all_namespaces:
        raise ConfigurationError("approve/deny act on one Approval: name its namespace with -n, not -A")
    from kubernetes.client.exceptions import ApiException

    api = cluster.custom()
    try:
        obj: dict[str, Any] = api.get_namespaced_custom_object(GROUP, VERSION, cluster.namespace, _PLURAL, ident,
                                                               _request_timeout=cluster.timeout)
        return obj
    except ApiException as e:
        if e.status != 404 or "could not find the requested resource" in (e.body or ""):
            raise cluster.explain(e, f"get approval {ident} in namespace {cluster.namespace}") from None
    except network_errors() as e:
        raise cluster.unreachable(e) from None
    matches = [o for o in cluster.list("Approval", cluster.namespace) if o["metadata"]["name"].startswith(ident)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise ClusterError(f"no Approval {ident!r} in namespace {cluster.namespace}: kubectl saga approvals list "
                           f"-n {cluster.namespace} shows the pending ones (-A: every namespace)")
    names = ", ".join(o["metadata"]["name"] for o in matches[:5])
    raise ClusterError(f"{ident!r} matches {len(matches)} Approvals in namespace {cluster.namespace} ({names}): "
                       f"give more of the id")


def cmd_list(args: argparse.Namespace) -> int:
    """``approvals list``: pending requests (``--all``: decided ones too)."""
    cluster = connect(args)
    items = cluster.list("Approval", cluster.scope_namespace())
    shown = items if args.all else [o for o in items if phase(o) == "Pending"]
    if args.json:
        print(json.dumps(shown, default=str))
        return 0
    if not shown:
        where = "any namespace" if cluster.all_namespaces else f"namespace {cluster.namespace}"
        print(f"no {'' if args.all else 'pending '}approvals in {where}")
        return 0
    now = datetime.now(UTC)
    for obj in shown:
        print("\n".join(render_approval(obj, now=now, with_namespace=cluster.all_namespaces)))
    return 0


def _decide(args: argparse.Namespace, decision: str) -> int:
    if args.note is not None and not args.note.strip():
        raise ConfigurationError("--note is blank: say why, or leave it out")
    if args.break_glass and not args.note:
        raise ConfigurationError("--break-glass needs --note: say why the escalation chain is bypassed")
    cluster = connect(args)
    obj = _find(cluster, args.id)
    meta, spec = obj["metadata"], obj.get("spec") or {}
    name = f"{meta['namespace']}/{meta['name']}"
    if spec.get("decision"):
        print(f"approval {name} was already decided: {spec['decision']} by {spec.get('approver')} "
              f"(a decision is final)")
        return 1
    if phase(obj) != "Pending":
        print(f"approval {name} is {phase(obj)}: it can no longer be decided")
        return 1
    if decision == "Approved" and spec.get("passkeyRequired"):
        raise ClusterError(f"approval {name} needs the approver's passkey, which a decision on the Approval cannot "
                           f"carry: approve it with agent-saga approvals sign {spec.get('requestId')} --approver "
                           f"YOU --key YOUR-KEY.pem (or deny it here)")
    approver = args.approver or cluster.username()
    if not approver:
        raise ConfigurationError("--approver NAME is needed: this cluster cannot say who you are (no "
                                 "SelfSubjectReview); with the approver admission policy it must be your user name")
    body = decision_patch(obj, decision, approver, args.note, args.break_glass)
    out = cluster.call(f"patch approval {meta['name']} in namespace {meta['namespace']} (decide it)",
                       cluster.custom().patch_namespaced_custom_object, GROUP, VERSION, meta["namespace"], _PLURAL,
                       meta["name"], body)
    if args.json:
        print(json.dumps(out, default=str))
        return 0
    glass = " (break-glass: flagged for review)" if args.break_glass else ""
    print(f"{decision.lower()} approval {name}: {spec.get('tool')} in saga {spec.get('sagaId')}, "
          f"as {approver}{glass}")
    print("  the operator writes it to the policy plane, signed, where the waiting saga reads it; "
          f"kubectl get approval {meta['name']} -n {meta['namespace']} shows PHASE once it has")
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    """``approvals approve ID``."""
    return _decide(args, "Approved")


def cmd_deny(args: argparse.Namespace) -> int:
    """``approvals deny ID``."""
    return _decide(args, "Denied")


def register(sub: Any, cluster_args: Any, fmt: Any) -> None:
    """Add ``approvals`` with list, approve and deny."""
    p = sub.add_parser(
        "approvals", help="list pending Approvals; approve or deny one as yourself",
        formatter_class=fmt,
        description="Approvals agents are waiting on, answered as the Kubernetes user you are.",
        epilog="examples:\n"
        "  kubectl saga approvals list -n payments\n"
        "  kubectl saga approvals approve af83c011 --note 'verified by phone' -n payments\n"
        "  kubectl saga approvals deny af83c011 --note 'not this one' -n payments")
    asub = p.add_subparsers(dest="approvals_command", required=True, metavar="COMMAND")
    q = asub.add_parser("list", help="pending Approvals (--all: decided ones too)", formatter_class=fmt,
                        description="The Approvals agents are waiting on: tool, reason, the fields shown to the "
                        "approver, the deadline.",
                        epilog="examples:\n  kubectl saga approvals list -n payments\n"
                        "  kubectl saga approvals list -A --all")
    q.add_argument("--all", action="store_true", help="also the decided and expired ones")
    q.add_argument("--json", action="store_true", help="print the objects as JSON")
    cluster_args(q)
    q.set_defaults(handler=cmd_list)
    for verb, handler, example in (
        ("approve", cmd_approve, "  kubectl saga approvals approve af83c011 --note 'verified by phone' -n payments\n"
                                 "  kubectl saga approvals approve af83c011 --break-glass --note 'system down, CFO "
                                 "on the phone' -n payments"),
        ("deny", cmd_deny, "  kubectl saga approvals deny af83c011 --note 'not this one' -n payments"),
    ):
        q = asub.add_parser(verb, help=f"{verb} one Approval (as your Kubernetes user)", formatter_class=fmt,
                            description=f"{verb.capitalize()} an Approval: sets spec.decision, spec.approver and "
                            "spec.note.\nThe operator signs the decision when it writes it to the policy plane.",
                            epilog=f"examples:\n{example}")
        q.add_argument("id", metavar="ID", help="the Approval's name (the request id), or a unique prefix of it")
        q.add_argument("--approver", default=None,
                       help="who decides (default: your Kubernetes user; the approver admission policy refuses "
                            "any other name)")
        q.add_argument("--note", default=None, help="why (verified by phone)")
        q.add_argument("--json", action="store_true", help="print the patched object as JSON")
        if verb == "approve":
            q.add_argument("--break-glass", action="store_true",
                           help="an emergency override (needs the break-glass role and --note; flagged for review)")
        else:
            q.set_defaults(break_glass=False)
        cluster_args(q)
        q.set_defaults(handler=handler)
