"""Per-kind reconciliation: project the object, and say what its status should be.

Each reconciler takes the validated spec and the object's identity, brings the policy
plane in line with it (put, remove, or write a decision back), and returns an
``Outcome``: the Ready and Synced conditions and the kind's own status fields. The kopf
wiring (``handlers``) turns that into a status patch and Events; nothing here touches
the Kubernetes API, so it can be driven directly against a real Redis in tests.

Raises ``ProjectionUnavailable`` (Redis failed: the handler retries) and
``InvalidSpec`` (the spec cannot be enforced: reported, not retried).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from agent_saga.controls.limits import display_amount
from agent_saga.scrubber import redact_text

from .acks import Tracked, desired_status
from .approval_proof import judge, key_owner, unproven_outcome
from .conditions import READY, SYNCED, Cond, Reason, rfc3339
from .config import Context
from .documents import (
    Identity,
    approval_decision_doc,
    budget_limit_doc,
    killswitch_doc,
    killswitch_expiry,
    killswitch_scope,
    model_route_doc,
    runtime_limit,
    saga_policy_doc,
)
from .models import ApprovalSpec, BudgetLimitSpec, KillSwitchSpec, ModelRouteSpec, SagaPolicySpec
from .models._base import CRDModel
from .projection import DecisionConflict

__all__ = ["RECONCILERS", "SPEC_MODELS", "Outcome", "deadline_of"]


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a reconciliation found: conditions, status fields, the revision it wrote."""

    ready: Cond
    synced: Cond
    fields: dict[str, Any] = field(default_factory=dict)
    rev: int = 0
    engaged: bool | None = None  # KillSwitch only: in force now
    #: More conditions (Acknowledged), set after Synced and Ready.
    extra: tuple[Cond, ...] = ()


def _synced(rev: int, what: str) -> Cond:
    return Cond(SYNCED, "True", Reason.PROJECTED, f"{what} is in the policy plane")


def _fmt(x: float) -> str:
    return display_amount(x)


def _follow(ctx: Context, t: Tracked) -> tuple[dict[str, Any], tuple[Cond, ...]]:
    """Track ``t`` (its status follows the agents' heartbeats from now on) and return the
    status the heartbeats read so far justify (``acks.desired_status``)."""
    ctx.tracked[(t.kind, t.id)] = t
    return desired_status(t, ctx.fleet)


def _split(conds: tuple[Cond, ...]) -> tuple[Cond | None, tuple[Cond, ...]]:
    """(the Ready condition if the heartbeats decide it, the other conditions)."""
    ready = next((c for c in conds if c.type == READY), None)
    return ready, tuple(c for c in conds if c.type != READY)


# ------------------------------------------------------------------ KillSwitch
_ACTION_TEXT = {
    "Halt": "agents refuse new side effects for {scope}",
    "Drain": "agents start no new sagas ({scope}); running sagas finish",
    "Quarantine": "saga {saga} is frozen; the recovery daemon skips it and a human decides",
}


async def reconcile_killswitch(ctx: Context, spec: KillSwitchSpec, who: Identity,
                               status: Mapping[str, Any], now: datetime) -> Outcome:
    scope = killswitch_scope(spec)
    expires = killswitch_expiry(spec, who)
    fields: dict[str, Any] = {
        "scope": scope,
        "engagedAt": rfc3339(who.created),
        "expiresAt": rfc3339(expires) if expires is not None else None,
    }
    if expires is not None and now >= expires:
        rev = await ctx.projector.delete("KillSwitch", who.id)
        fields["engaged"] = False
        acks, conds = _follow(ctx, Tracked("KillSwitch", who.namespace, who.name, who.uid, who.generation,
                                           engaged=False))
        return Outcome(
            Cond(READY, "False", Reason.EXPIRED,
                 f"TTL of {spec.ttl_seconds}s ran out at {rfc3339(expires)}: agents no longer refuse {scope}; "
                 f"delete it, or create a new KillSwitch to engage again"),
            Cond(SYNCED, "True", Reason.REMOVED, "expired: removed from the policy plane"),
            {**fields, **acks}, rev, engaged=False, extra=conds,
        )
    rev = await ctx.projector.put("KillSwitch", who.id, killswitch_doc(spec, who))
    fields["engaged"] = True
    text = _ACTION_TEXT[spec.action].format(scope=scope, saga=scope.removeprefix("saga:"))
    until = f" until {rfc3339(expires)}" if expires is not None else ""
    acks, conds = _follow(ctx, Tracked("KillSwitch", who.namespace, who.name, who.uid, who.generation,
                                       reason=Reason.ENGAGED,
                                       text=f"{spec.action}: {text}{until} (by {spec.requested_by}: "
                                            f"{redact_text(spec.reason)})"))
    ready, extra = _split(conds)
    assert ready is not None
    return Outcome(ready, _synced(rev, "the switch"), {**fields, **acks}, rev, engaged=True, extra=extra)


# ------------------------------------------------------------------ BudgetLimit
async def reconcile_budget_limit(ctx: Context, spec: BudgetLimitSpec, who: Identity,
                                 status: Mapping[str, Any], now: datetime) -> Outcome:
    limit = runtime_limit(spec, who)
    rev = await ctx.projector.put("BudgetLimit", who.id, budget_limit_doc(spec, who))
    lspec = limit.spec()
    rows = await ctx.usage.read(lspec)
    used = max((r.used for r in rows), default=0.0)
    remaining = max(0.0, lspec.max_total - used)
    ctx.budgets[who.id] = (used, lspec.max_total)
    fields: dict[str, Any] = {
        "limitName": lspec.name,
        "max": lspec.max_total,
        "windowSeconds": lspec.window,
        "used": used,
        "remaining": remaining,
        "windows": len(rows),
    }
    if any(status.get(k) != v for k, v in fields.items()) or not status.get("usageUpdatedAt"):
        fields["usageUpdatedAt"] = rfc3339(now)
    what = f"{_fmt(lspec.max_total)} of {spec.arg}" if spec.kind == "Budget" else f"{_fmt(lspec.max_total)} calls"
    scope = "" if lspec.scope == "global" else f" per {lspec.scope}"
    tools = f" on {', '.join(spec.tools)}" if spec.tools else ""
    over = " (over budget asks a human)" if spec.escalate_to_human else ""
    acks, conds = _follow(ctx, Tracked("BudgetLimit", who.namespace, who.name, who.uid, who.generation,
                                       text=f"at most {what} per {spec.window}{scope}{tools}{over}; {_fmt(used)} "
                                            f"used in the fullest window (limit {lspec.name})"))
    ready, extra = _split(conds)
    assert ready is not None
    return Outcome(ready, _synced(rev, "the limit"), {**fields, **acks}, rev, extra=extra)


# ------------------------------------------------------------------ SagaPolicy
async def reconcile_saga_policy(ctx: Context, spec: SagaPolicySpec, who: Identity,
                                status: Mapping[str, Any], now: datetime) -> Outcome:
    """Project the policy; Ready says whether an agent enforces it (its heartbeats)."""
    rev = await ctx.projector.put("SagaPolicy", who.id, saga_policy_doc(spec, who))
    n_tools, n_rules = len(spec.tools), len(spec.rules or ())
    acks, conds = _follow(ctx, Tracked("SagaPolicy", who.namespace, who.name, who.uid, who.generation,
                                       applies_to=tuple(spec.applies_to.agents) if spec.applies_to else None,
                                       reason=Reason.OBSERVING if spec.mode == "Observe" else Reason.ENFORCED,
                                       text=f"{spec.mode}: {n_tools} tool(s), {n_rules} rule(s), undeclared tools "
                                            f"{spec.undeclared_tools}"))
    ready, extra = _split(conds)
    assert ready is not None
    return Outcome(ready, _synced(rev, "the policy"), {"tools": n_tools, "rules": n_rules, **acks}, rev, extra=extra)


# ------------------------------------------------------------------ ModelRoute
async def reconcile_model_route(ctx: Context, spec: ModelRouteSpec, who: Identity,
                                status: Mapping[str, Any], now: datetime) -> Outcome:
    """Project the route; Ready says whether an agent's router routes by it (heartbeats)."""
    doc = model_route_doc(spec, who)
    rev = await ctx.projector.put("ModelRoute", who.id, doc)
    preferred = doc["preference"][0]
    acks, conds = _follow(ctx, Tracked("ModelRoute", who.namespace, who.name, who.uid, who.generation,
                                       applies_to=tuple(spec.applies_to.agents) if spec.applies_to else None,
                                       reason=Reason.ROUTED, text=f"routes to {preferred} first"))
    ready, extra = _split(conds)
    assert ready is not None
    return Outcome(ready, _synced(rev, "the route"), {"hosts": len(spec.hosts), "preferred": preferred, **acks},
                   rev, extra=extra)


# ------------------------------------------------------------------ Approval
def deadline_of(spec: Mapping[str, Any]) -> datetime | None:
    """An Approval's deadline from its raw spec (for the expiry daemon)."""
    raw = spec.get("deadline")
    return datetime.fromisoformat(raw) if isinstance(raw, str) else None


_PHASES = {"approved": "Approved", "denied": "Denied", "expired": "Expired"}


def _stored_time(stored: Mapping[str, Any], fallback: datetime) -> str:
    raw = stored.get("decidedAt")
    try:
        return rfc3339(datetime.fromisoformat(str(raw).replace("Z", "+00:00")))
    except ValueError:
        return rfc3339(fallback)


def shown_approver(phase: str, stored: Mapping[str, Any]) -> str | None:
    """Who ``status.approver`` (the APPROVER column) names: the human who decided; nobody
    for an expiry (the runtime records its own name as the expiring party, not a human)."""
    return None if phase == "Expired" else (stored.get("approver") or None)


def conflict_outcome(phase: str, message: str, conflict: str, fields: dict[str, Any]) -> Outcome:
    """A decision that lost to one already in the policy plane: Ready follows the phase
    that is in force (what the saga acts on) and says the other decision was not written;
    Synced=False, reason Conflict, says this object's own decision is not the stored one."""
    lost = f"{message}. {conflict}: this object's decision was not written"
    ready = Cond(READY, "True" if phase == "Approved" else "False", Reason.CONFLICT, lost)
    return Outcome(ready, Cond(SYNCED, "False", Reason.CONFLICT, conflict), fields)


def _reflect_stored(spec: ApprovalSpec, stored: Mapping[str, Any], now: datetime, *, conflict: str = "",
                    ctx: Context | None = None, who: Identity | None = None, action: str | None = None) -> Outcome:
    """The status of an Approval whose decision is the one stored in the policy plane
    (made with kubectl and written back, or made elsewhere: the CLI, the agent's expiry).
    An approval the agents ignore (``approval_proof``) is shown as such, never as one
    the saga may proceed on (``action``: the digest of the rendered action, as
    ``judge`` takes it)."""
    ignored = None if ctx is None else judge(ctx, spec, stored, action)
    if ignored is not None and who is not None:
        return unproven_outcome(spec, stored, *ignored, now, namespace=who.namespace, name=who.name)
    decision = str(stored.get("decision") or "").lower()
    phase = _PHASES.get(decision, "Denied")
    approver = shown_approver(phase, stored)
    source = str(stored.get("source") or "")
    fields: dict[str, Any] = {"phase": phase, "decidedAt": _stored_time(stored, now), "approver": approver,
                              "source": source or None, "authenticatedUser": stored.get("authenticatedUser") or None,
                              "signedBy": (stored.get("signature") or {}).get("keyId"),
                              "keyOwner": None if ctx is None else key_owner(ctx, stored)}
    by = f" by {approver}" if approver else ""
    where = f" (source {source})" if source else ""
    if conflict:
        said = {"Approved": f"approved{by}{where}: the saga may proceed",
                "Expired": "the deadline passed without an answer: expiry denies"}
        return conflict_outcome(phase, said.get(phase, f"denied{by}{where}: the saga is refused"), conflict, fields)
    synced = Cond(SYNCED, "True", Reason.PROJECTED, f"the decision{where} is in the policy plane")
    if phase == "Approved":
        return Outcome(Cond(READY, "True", Reason.APPROVED, f"approved{by}{where}: the saga may proceed"),
                       synced, fields)
    if phase == "Expired":
        return Outcome(Cond(READY, "False", Reason.EXPIRED,
                            f"deadline {rfc3339(spec.deadline)} passed without an answer: expiry denies"),
                       synced, fields)
    return Outcome(Cond(READY, "False", Reason.DENIED, f"denied{by}{where}: the saga is refused"), synced, fields)


async def reconcile_approval(ctx: Context, spec: ApprovalSpec, who: Identity,
                             status: Mapping[str, Any], now: datetime) -> Outcome:
    """Write a kubectl decision back (once), expire an unanswered request, or show the
    decision already in the policy plane (made by the CLI, the agent, or earlier)."""
    name = who.name
    raw = await ctx.projector.get_decision_text(spec.request_id)
    stored = None if raw is None else json.loads(raw)
    action, refusal = await _checked_action(ctx, spec)
    ignored = None if stored is None else judge(ctx, spec, stored, action)
    # Precedence of Ready reasons while the request waits: ActionMismatch (nothing can
    # approve it) over any stored approval; NotAllShown over no decision and over an
    # approval the agents ignore (a kubectl approval of it is never written); then a
    # stored decision as it is: Unsigned / UntrustedKey for one the agents ignore, else
    # Approved (a proven approval, e.g. the CLI's made with --show-all), Denied, Expired.
    stored_approval = stored is not None and str(stored.get("decision") or "").lower() == "approved"
    refused_first = stored is None or (stored_approval and (
        (refusal is not None and refusal[0] == Reason.ACTION_MISMATCH) or ignored is not None))
    if refusal is not None and now < spec.deadline and spec.decision != "Denied" and refused_first:
        # never presented as approvable, and an approval of it is never written
        tried = "" if spec.decision is None else f"the approval by {spec.approver} was not written: "
        held = "" if ignored is None else (f" (the approval in the policy plane by "
                                           f"{str((stored or {}).get('approver') or 'someone')[:64]} is ignored by "
                                           f"the agents: {ignored[1]})")
        return Outcome(Cond(READY, "False", refusal[0], f"{tried}not approvable: {refusal[1]}{held}; deny it, or "
                                                        f"let it expire (expiry denies)"),
                       Cond(SYNCED, "True" if spec.decision is None else "False", refusal[0],
                            "nothing to write back" if spec.decision is None else "the approval was refused"),
                       {"phase": "Pending"})
    if spec.decision is None and stored is not None:
        return _reflect_stored(spec, stored, now, ctx=ctx, who=who, action=action)
    if spec.decision is None and now < spec.deadline:
        how = (f"it needs the approver's passkey: agent-saga approvals sign {spec.request_id} "
               f"--approver you@corp --key your-key.pem (kubectl can only deny it)" if spec.passkey_required else
               f"kubectl patch approval {name} -n {who.namespace} --type merge "
               f"-p '{{\"spec\":{{\"decision\":\"Approved\",\"approver\":\"you@corp\"}}}}'")
        return Outcome(
            Cond(READY, "False", Reason.PENDING,
                 f"{spec.tool} in saga {spec.saga_id} waits for a named human until {rfc3339(spec.deadline)}: {how}"),
            Cond(SYNCED, "True", Reason.PENDING, "nothing to write back yet"),
            {"phase": "Pending"},
        )
    prior = status.get("decidedAt")
    decided_at = datetime.fromisoformat(prior) if isinstance(prior, str) else now
    expired = spec.decision is None or decided_at > spec.deadline
    doc = approval_decision_doc(spec, who, decided_at=decided_at, expired=expired, authenticated=ctx.admission)
    if ctx.signer is not None and action:  # the agent checks it before it acts on an approval
        doc = ctx.signer.sign(doc, expires_at=spec.deadline.timestamp(), tool=spec.tool, action_digest=action)
    mine_ignored = judge(ctx, spec, doc, action)
    # An approval the agents ignore may be replaced by a decision they accept (and only then).
    replaces = raw if raw is not None and stored is not None and mine_ignored is None \
        and ignored is not None else ""
    try:
        rev = await ctx.projector.decide(spec.request_id, doc, deadline=spec.deadline, now=now, replaces=replaces or "")
    except DecisionConflict as e:
        if spec.decision is None:  # the agent (or the CLI) got there first: show theirs
            return _reflect_stored(spec, e.stored, now, ctx=ctx, who=who, action=action)
        return _reflect_stored(spec, e.stored, now, conflict=str(e), ctx=ctx, who=who, action=action)
    if mine_ignored is not None:  # written, and the agents will ignore it: say so, never "may proceed"
        return unproven_outcome(spec, doc, *mine_ignored, now, namespace=who.namespace, name=name)
    fields: dict[str, Any] = {"decidedAt": rfc3339(decided_at), "approver": doc["approver"], "source": doc["source"],
                              "authenticatedUser": doc["authenticatedUser"],
                              "signedBy": (doc.get("signature") or {}).get("keyId"), "keyOwner": key_owner(ctx, doc)}
    if expired:
        late = "" if spec.decision is None else f" ({spec.decision} by {spec.approver} came after it)"
        return Outcome(
            Cond(READY, "False", Reason.EXPIRED,
                 f"deadline {rfc3339(spec.deadline)} passed without an answer{late}: expiry denies"),
            _synced(rev, "the expiry"), {**fields, "phase": "Expired"}, rev,
        )
    if spec.decision == "Approved":
        return Outcome(
            Cond(READY, "True", Reason.APPROVED, f"approved by {spec.approver}: the saga may proceed"),
            _synced(rev, "the decision"), {**fields, "phase": "Approved"}, rev,
        )
    return Outcome(
        Cond(READY, "False", Reason.DENIED, f"denied by {spec.approver}: the saga is refused"),
        _synced(rev, "the decision"), {**fields, "phase": "Denied"}, rev,
    )


async def _checked_action(ctx: Context, spec: ApprovalSpec) -> tuple[str | None, tuple[str, str] | None]:
    """The digest of the rendered action a signed decision covers, or why the request
    behind this Approval cannot be approved (reason, message; the digest is then ``""``:
    no signature covers it); neither when the policy plane holds no request for it (no
    agent waits on it)."""
    from agent_saga.controls.approvals import ApprovalRequest

    from .bridge import approval_problem, read_request

    try:
        doc = await read_request(ctx.projector.client, ctx.projector.keys.prefix, spec.request_id)
    except (ValueError, TypeError) as e:
        return "", (Reason.ACTION_MISMATCH, f"its request in the policy plane cannot be read ({e})")
    if doc is None:  # no agent waits on it: a decision is harmless, and is not signed (nothing to render)
        return None, None
    if doc.get("argumentsDigest") != spec.arguments_digest or doc.get("tool") != spec.tool:
        return "", (Reason.ACTION_MISMATCH, "the request in the policy plane is not the action this Approval shows")
    problem = approval_problem(doc)
    if problem is not None and problem[0] == "ActionMismatch":
        return "", (Reason.ACTION_MISMATCH, problem[1])
    digest = ApprovalRequest.from_doc(doc).action_view().digest
    return digest, None if problem is None else (Reason.NOT_ALL_SHOWN, problem[1])


Reconciler = Callable[[Context, Any, Identity, Mapping[str, Any], datetime], Awaitable[Outcome]]

RECONCILERS: dict[str, Reconciler] = {
    "KillSwitch": reconcile_killswitch,
    "BudgetLimit": reconcile_budget_limit,
    "SagaPolicy": reconcile_saga_policy,
    "ModelRoute": reconcile_model_route,
    "Approval": reconcile_approval,
}

SPEC_MODELS: dict[str, type[CRDModel]] = {
    "KillSwitch": KillSwitchSpec,
    "BudgetLimit": BudgetLimitSpec,
    "SagaPolicy": SagaPolicySpec,
    "ModelRoute": ModelRouteSpec,
    "Approval": ApprovalSpec,
}
