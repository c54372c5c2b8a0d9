"""``kubectl saga halt | drain | quarantine | resume``: KillSwitch objects, made and deleted
as the user.

The flags and their meaning are ``agent-saga halt/quarantine/resume``'s
(docs/killswitch.md); the lever is a ``KillSwitch`` the operator projects, so the API
server's validation, RBAC and admission apply, and ``kubectl get killswitches`` shows it.

Names are deterministic: ``<action>-<scope slug>-<10 hex of sha256(action, scope)>``
(``halt-tool-wire.send-3fa2b1c0d4``), so halting one scope twice finds the switch already
engaged (exit 1, naming who engaged it) instead of stacking a second one, and ``resume``
deletes exactly the switches on the scope. Objects made here carry the label
``app.kubernetes.io/managed-by: kubectl-saga``; ``resume --scope`` deletes only those and
names any other KillSwitch on the scope (one applied from git would be put back by
whatever applies it): ``resume --name`` deletes that one deliberately.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import re
import sys
from typing import Any

from ..clocks import parse_duration
from ..controls.killswitch import Lever, LeverAction, format_scope, parse_scope
from ..errors import ConfigurationError
from ._cluster import GROUP, PLURALS, VERSION, Cluster, ClusterError, connect, network_errors

__all__ = ["MANAGED_BY", "killswitch_body", "object_scope", "parse_ttl", "register", "switch_name"]

MANAGED_BY = "kubectl-saga"
LABEL = "app.kubernetes.io/managed-by"
_PLURAL = PLURALS["KillSwitch"]
_SLUG = re.compile(r"[^a-z0-9.-]+")


def parse_ttl(text: str) -> int:
    """Whole seconds from ``600``, ``600s``, ``10m`` or ``1h30m`` (the KillSwitch's
    ``ttlSeconds`` is an integer: a fraction rounds up)."""
    try:
        return math.ceil(parse_duration(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"--ttl {text!r}: {exc}") from None


def switch_name(action: LeverAction, scope: str) -> str:
    """The KillSwitch name for ``action`` on the canonical ``scope`` (a DNS-1123 name)."""
    digest = hashlib.sha256(f"{action.value}\n{scope}".encode()).hexdigest()[:10]
    slug = _SLUG.sub("-", scope.lower().replace(":", "-").replace("*", "x").replace("?", "x")).strip("-.")[:40]
    return f"{action.value.lower()}-{slug.strip('-.')}-{digest}" if slug else f"{action.value.lower()}-{digest}"


def _scope_object(scope: str) -> dict[str, str] | None:
    kind, value = parse_scope(scope)
    if kind == "global":
        return None
    return {"tool": {"tool": value}, "tag": {"tag": value}, "saga": {"sagaId": value}}[kind]


def killswitch_body(action: LeverAction, scope: str, *, reason: str, by: str, ttl: int | None) -> dict[str, Any]:
    """The KillSwitch ``action`` on ``scope`` (validated as the runtime validates a lever:
    ``ConfigurationError`` names a bad scope, combination, reason or requester)."""
    lever = Lever.new(action, scope, reason=reason, by=by, now=0.0, ttl=ttl, lever_id="kubectl/validate")
    # The reason as the lever keeps it: a credential pasted into it is redacted before it
    # is stored anywhere (etcd included).
    spec: dict[str, Any] = {"action": action.value.capitalize(), "reason": lever.reason,
                            "requestedBy": lever.requested_by}
    scope_obj = _scope_object(lever.scope)
    if scope_obj is not None:
        spec["scope"] = scope_obj
    if ttl is not None:
        spec["ttlSeconds"] = ttl
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "KillSwitch",
        "metadata": {"name": switch_name(action, lever.scope), "labels": {LABEL: MANAGED_BY}},
        "spec": spec,
    }


def object_scope(obj: dict[str, Any]) -> str:
    """The canonical scope of a KillSwitch object (``global``, ``tool:wire.send``...)."""
    try:
        return format_scope(*parse_scope((obj.get("spec") or {}).get("scope")))
    except ValueError:
        return "(unreadable scope)"


def _namespaces(cluster: Cluster) -> list[str]:
    if not cluster.all_namespaces:
        return [cluster.namespace]
    from kubernetes import client

    out = cluster.call("list namespaces (needed by -A)", client.CoreV1Api(cluster.api).list_namespace)
    return sorted(str(n.metadata.name) for n in out.items
                  if n.metadata is not None and (n.status is None or n.status.phase != "Terminating"))


def _describe(obj: dict[str, Any]) -> str:
    meta, spec = obj["metadata"], obj.get("spec") or {}
    ttl = f", lifts itself after {spec['ttlSeconds']}s" if spec.get("ttlSeconds") else ", until resumed"
    return (f"{spec.get('action', '?').upper()} {object_scope(obj)} in namespace {meta.get('namespace')} "
            f"by {spec.get('requestedBy')}{ttl}: {spec.get('reason')} (killswitch/{meta['name']})")


def _engage(args: argparse.Namespace, action: LeverAction, scope: str) -> int:
    # Validate before asking the cluster anything: a bad scope is a usage error.
    body = killswitch_body(action, scope, reason=args.reason, by=args.by or "(you)", ttl=args.ttl)
    cluster = connect(args)
    if not args.by:
        by = cluster.username()
        if not by:
            raise ConfigurationError("--by NAME is needed: this cluster cannot say who you are (no "
                                     "SelfSubjectReview); who pulls the lever lands in the WAL")
        body["spec"]["requestedBy"] = by
    from kubernetes.client.exceptions import ApiException

    api = cluster.custom()
    made: list[dict[str, Any]] = []
    already: list[dict[str, Any]] = []
    refused: list[ClusterError] = []
    name = body["metadata"]["name"]
    for ns in _namespaces(cluster):
        try:
            try:
                made.append(api.create_namespaced_custom_object(GROUP, VERSION, ns, _PLURAL, body,
                                                                _request_timeout=cluster.timeout))
            except ApiException as e:
                if e.status != 409:
                    raise cluster.explain(e, f"create killswitches in namespace {ns}") from None
                already.append(cluster.call(f"get killswitch {name} in namespace {ns}",
                                            api.get_namespaced_custom_object, GROUP, VERSION, ns, _PLURAL, name))
            except network_errors() as e:
                raise cluster.unreachable(e) from None
        except ClusterError as exc:
            if exc.code != 1 or not cluster.all_namespaces:
                raise
            refused.append(exc)  # -A: one namespace refusing does not stop the others
    for err in refused:
        print(f"kubectl saga: {err.message}", file=sys.stderr)
    if args.json:
        print(json.dumps({"engaged": made, "alreadyEngaged": already}, default=str))
    else:
        for obj in made:
            print(f"engaged {_describe(obj)}")
        for obj in already:
            print(f"already engaged: {_describe(obj)}")
        if made:
            ns_flag = "-A" if cluster.all_namespaces else f"-n {cluster.namespace}"
            print(f"  which agents obey: kubectl get killswitches {ns_flag} (ACKED), or kubectl saga status {ns_flag}")
    return 0 if made and not refused else 1


def cmd_halt(args: argparse.Namespace) -> int:
    """``halt`` (``--drain``: a DRAIN)."""
    return _engage(args, LeverAction.DRAIN if args.drain else LeverAction.HALT, args.scope)


def cmd_drain(args: argparse.Namespace) -> int:
    """``drain``: start no new sagas on the scope."""
    return _engage(args, LeverAction.DRAIN, args.scope)


def cmd_quarantine(args: argparse.Namespace) -> int:
    """``quarantine SAGA``: freeze one saga."""
    return _engage(args, LeverAction.QUARANTINE, f"saga:{args.saga_id}")


def cmd_resume(args: argparse.Namespace) -> int:
    """``resume``: delete the switches on a scope (ours), or one by name."""
    cluster = connect(args)
    api = cluster.custom()
    if args.name:
        if cluster.all_namespaces:
            raise ConfigurationError("resume --name deletes one KillSwitch: name its namespace with -n, not -A")
        chosen = [cluster.call(f"get killswitch {args.name} in namespace {cluster.namespace}",
                               api.get_namespaced_custom_object, GROUP, VERSION, cluster.namespace, _PLURAL,
                               args.name)]
        ours, theirs = chosen, []
    else:
        try:
            kind, value = parse_scope(args.scope)
        except ValueError as exc:
            raise ConfigurationError(f"--scope: {exc}") from exc
        canonical = format_scope(kind, value)
        chosen = [o for o in cluster.list("KillSwitch", cluster.scope_namespace()) if object_scope(o) == canonical]
        ours = [o for o in chosen if (o["metadata"].get("labels") or {}).get(LABEL) == MANAGED_BY]
        theirs = [o for o in chosen if o not in ours]
    lifted = []
    for obj in ours:
        meta = obj["metadata"]
        cluster.call(f"delete killswitch {meta['name']} in namespace {meta['namespace']}",
                     api.delete_namespaced_custom_object, GROUP, VERSION, meta["namespace"], _PLURAL, meta["name"])
        lifted.append(obj)
    if args.json:
        print(json.dumps({"lifted": lifted, "stillEngaged": theirs}, default=str))
    else:
        for obj in lifted:
            print(f"lifted {_describe(obj)}")
        for obj in theirs:
            meta = obj["metadata"]
            print(f"still engaged (not made by kubectl saga: whatever applied it may put it back): {_describe(obj)}\n"
                  f"  lift it where it is managed, or: kubectl saga resume --name {meta['name']} -n {meta['namespace']}")
        if not lifted and not theirs:
            where = "any namespace" if cluster.all_namespaces else f"namespace {cluster.namespace}"
            print(f"no KillSwitch on scope {args.scope} in {where}")
    return 0 if lifted and not theirs else 1


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--reason", required=True, help="why (lands in the WAL and in every refusal)")
    p.add_argument("--by", default=None,
                   help="who pulls the lever (default: your Kubernetes user, as the API server names it)")
    p.add_argument("--ttl", type=parse_ttl, default=None, help="lift automatically after SECONDS (or 10m, 1h30m)")
    p.add_argument("--json", action="store_true", help="print the objects as JSON")


def register(sub: Any, cluster_args: Any, fmt: Any) -> None:
    """Add halt, drain, quarantine and resume."""
    p = sub.add_parser(
        "halt", help="refuse every step on a scope (a KillSwitch with action Halt; --drain: Drain)",
        formatter_class=fmt,
        description="Create a KillSwitch: every agent reading the namespace refuses the steps it covers.",
        epilog="examples:\n"
        "  kubectl saga halt --scope tool:wire.send --reason 'fraud pattern' -n payments\n"
        "  kubectl saga halt --reason 'incident 42: stop everything' --ttl 30m -n payments\n"
        "  kubectl saga halt --scope tag:eu --reason 'EU bank outage' -A      # one per namespace\n"
        "  kubectl saga halt --drain --reason deploying --by ci@corp --ttl 600 -n payments")
    p.add_argument("--scope", default="global", help="global (default), tool:NAME_OR_GLOB, tag:TAG")
    p.add_argument("--drain", action="store_true", help="DRAIN instead: start no new sagas, let running ones finish")
    _common(p)
    cluster_args(p)
    p.set_defaults(handler=cmd_halt)

    p = sub.add_parser(
        "drain", help="start no new sagas on a scope, let running ones finish (a KillSwitch with action Drain)",
        formatter_class=fmt,
        description="Create a Drain KillSwitch: no new saga starts; sagas already running finish.",
        epilog="examples:\n"
        "  kubectl saga drain --reason 'deploying v2' --ttl 10m -n payments\n"
        "  kubectl saga drain --scope tag:eu --reason 'EU maintenance' -n payments")
    p.add_argument("--scope", default="global", help="global (default) or tag:TAG (a drain is not by tool)")
    _common(p)
    cluster_args(p)
    p.set_defaults(handler=cmd_drain)

    p = sub.add_parser(
        "quarantine", help="freeze one saga: its next step is refused and it is never rolled back",
        formatter_class=fmt,
        description="Create a Quarantine KillSwitch for one saga: a human decides what happens to it.",
        epilog="examples:\n"
        "  kubectl saga quarantine saga-8f3c --reason 'suspected duplicate charges' -n payments")
    p.add_argument("saga_id", metavar="SAGA", help="the saga id, as agent-saga inspect prints it (saga-8f3c)")
    _common(p)
    cluster_args(p)
    p.set_defaults(handler=cmd_quarantine)

    p = sub.add_parser(
        "resume", help="lift the switches on a scope (delete their KillSwitch objects), or one by --name",
        formatter_class=fmt,
        description="Delete the KillSwitches kubectl saga made on a scope (any action), or one KillSwitch by name.\n"
        "Who lifted it is the user the API server authenticated (its audit log records the delete).",
        epilog="examples:\n"
        "  kubectl saga resume --scope tool:wire.send -n payments\n"
        "  kubectl saga resume --scope global -A\n"
        "  kubectl saga resume --scope saga:saga-8f3c -n payments       # lift a quarantine\n"
        "  kubectl saga resume --name halt-wire-send -n payments         # one applied from a manifest")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--scope", help="global, tool:..., tag:..., saga:SAGA")
    g.add_argument("--name", help="one KillSwitch by name (also one kubectl saga did not make)")
    p.add_argument("--json", action="store_true", help="print the objects as JSON")
    cluster_args(p)
    p.set_defaults(handler=cmd_resume)

