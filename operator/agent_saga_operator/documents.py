"""Policy-plane documents: what each custom resource becomes in Redis (docs/policy-plane.md).

Pure functions from an object (its metadata and validated spec) to a JSON document. The
projection module writes them; the runtime reads them. Every document carries the
envelope ``{v, kind, id, namespace, name, uid, generation}`` (the projection adds
``rev``) followed by the kind's own fields.

Invariants:
- A document is a function of the object's spec and identity only (no clocks, no
  status), so re-projecting an unchanged object writes nothing and notifies nobody.
- Limits are built through the runtime's own ``BudgetLimit`` / ``RateLimit`` and written
  in its ``LimitSpec`` format, so the runtime's validation and codec are the contract.
- No secret enters a document: ModelRoute carries a Secret's name, never its value.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from agent_saga.controls import BudgetLimit as RuntimeBudgetLimit
from agent_saga.controls import RateLimit as RuntimeRateLimit
from agent_saga.controls import Scope, by_arg, by_tool, combine, global_scope
from agent_saga.controls.policy import PolicyError, parse_policy
from agent_saga.errors import ConfigurationError
from agent_saga.scrubber import redact_text

from .conditions import rfc3339
from .models import (
    ApprovalSpec,
    BudgetLimitSpec,
    KillSwitchSpec,
    ModelRouteSpec,
    SagaPolicySpec,
)
from .models._base import DURATION_UNITS
from .models.budgetlimit import LimitScope

__all__ = [
    "BREAK_GLASS_ANNOTATION",
    "SCHEMA_VERSION",
    "Identity",
    "InvalidSpec",
    "approval_decision_doc",
    "budget_limit_doc",
    "duration_seconds",
    "killswitch_doc",
    "killswitch_scope",
    "limit_name",
    "model_route_doc",
    "runtime_limit",
    "saga_policy_doc",
]

#: The annotation that marks an Approval decided as a break-glass override.
BREAK_GLASS_ANNOTATION = "agentsaga.dev/break-glass"

#: The ``v`` of every document this module builds.
SCHEMA_VERSION = 1


class InvalidSpec(ValueError):
    """A spec the schema admits but the runtime cannot enforce (the message says why)."""


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a document belongs to: the object's namespace, name, uid and generation."""

    namespace: str
    name: str
    uid: str
    generation: int
    created: datetime
    #: The object is annotated ``agentsaga.dev/break-glass: "true"`` (an Approval decided
    #: as an emergency override; the admission policy admits it only from the break-glass role).
    break_glass: bool = False

    @property
    def id(self) -> str:
        """``<namespace>/<name>``: the document's id in the policy plane."""
        return f"{self.namespace}/{self.name}"

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> Identity:
        """The identity of a resource from its ``metadata``."""
        created = meta.get("creationTimestamp")
        when = datetime.fromisoformat(created) if isinstance(created, str) else created
        if not isinstance(when, datetime):
            raise InvalidSpec(f"object {meta.get('namespace')}/{meta.get('name')} has no creationTimestamp")
        glass = str((meta.get("annotations") or {}).get(BREAK_GLASS_ANNOTATION, "")).lower() == "true"
        return cls(str(meta["namespace"]), str(meta["name"]), str(meta.get("uid", "")),
                   int(meta.get("generation") or 0), when, glass)


def _envelope(kind: str, who: Identity) -> dict[str, Any]:
    return {
        "v": SCHEMA_VERSION,
        "kind": kind,
        "id": who.id,
        "namespace": who.namespace,
        "name": who.name,
        "uid": who.uid,
        "generation": who.generation,
    }


def duration_seconds(text: str) -> int:
    """``1d`` / ``24h`` / ``1h30m`` / ``60s`` in seconds (the schema's pattern, already checked)."""
    total, num = 0, ""
    for ch in text:
        if ch.isdigit():
            num += ch
            continue
        total += int(num) * DURATION_UNITS[ch]
        num = ""
    if num or total <= 0:
        raise InvalidSpec(f"duration {text!r} is not like 1d, 24h, 1h30m or 60s")
    return total


# ------------------------------------------------------------------ KillSwitch
def killswitch_scope(spec: KillSwitchSpec) -> str:
    """The scope as agents match it: ``global``, ``tool:<glob>``, ``tag:<tag>``, ``saga:<id>``."""
    s = spec.scope
    if s is None:
        return "global"
    if s.tool is not None:
        return "tool:" + s.tool
    if s.tag is not None:
        return "tag:" + s.tag
    if s.saga_id is not None:
        return "saga:" + s.saga_id
    return "global"


def killswitch_expiry(spec: KillSwitchSpec, who: Identity) -> datetime | None:
    """When the TTL lifts the switch (creation + ttlSeconds), or None without a TTL."""
    if spec.ttl_seconds is None:
        return None
    return who.created + timedelta(seconds=spec.ttl_seconds)


def killswitch_doc(spec: KillSwitchSpec, who: Identity) -> dict[str, Any]:
    """``{..., action, scope, reason, requestedBy, ttl, engagedAt, expiresAt}``.

    ``engagedAt`` is the object's creation time (stable across re-projections and
    operator restarts); ``expiresAt`` is ``engagedAt + ttl``, and agents stop honouring
    the switch at that instant whether or not the operator has removed it yet.
    """
    expires = killswitch_expiry(spec, who)
    return {
        **_envelope("KillSwitch", who),
        "action": spec.action,
        "scope": killswitch_scope(spec),
        "reason": redact_text(spec.reason),  # the policy plane never holds a pasted secret
        "requestedBy": spec.requested_by,
        "ttl": spec.ttl_seconds,
        "engagedAt": rfc3339(who.created),
        "expiresAt": rfc3339(expires) if expires is not None else None,
    }


# ------------------------------------------------------------------ BudgetLimit
def limit_name(who: Identity) -> str:
    """The limit's name in the store and in refusals: ``<namespace>.<name>``.

    Namespaced, so two namespaces' ``daily-spend`` never share a window. The runtime
    allows 100 characters from ``[A-Za-z0-9._-]``; a longer combination is refused.
    """
    name = f"{who.namespace}.{who.name}"
    if len(name) > 100:
        raise InvalidSpec(
            f"limit name {name!r} is {len(name)} characters; the limit store allows 100 "
            f"(namespace + '.' + name): use a shorter name"
        )
    return name


def _scope(scope: LimitScope | None) -> Scope:
    if scope is None:
        return global_scope
    parts: list[Scope] = [by_tool] if scope.by_tool else []
    parts.extend(by_arg(a) for a in scope.by_args or ())
    return combine(*parts) if parts else global_scope


def runtime_limit(spec: BudgetLimitSpec, who: Identity) -> RuntimeBudgetLimit | RuntimeRateLimit:
    """The runtime's limit object for this spec (raises ``InvalidSpec``)."""
    name = limit_name(who)
    window = float(duration_seconds(spec.window))
    tools = tuple(spec.tools) if spec.tools else None
    try:
        if spec.kind == "Budget":
            assert spec.arg is not None and spec.max_total is not None  # the CRD's CEL rules
            return RuntimeBudgetLimit(name, arg=spec.arg, max_total=spec.max_total, window=window,
                                      scope=_scope(spec.scope), escalate_to_human=spec.escalate_to_human,
                                      tools=tools)
        assert spec.max_calls is not None
        return RuntimeRateLimit(name, max_calls=spec.max_calls, window=window, scope=_scope(spec.scope), tools=tools)
    except ConfigurationError as e:
        raise InvalidSpec(str(e)) from e


def budget_limit_doc(spec: BudgetLimitSpec, who: Identity) -> dict[str, Any]:
    """``{..., limit: <the runtime's LimitSpec document>}``."""
    return {**_envelope("BudgetLimit", who), "limit": runtime_limit(spec, who).spec().to_doc()}


# ------------------------------------------------------------------ SagaPolicy
def saga_policy_doc(spec: SagaPolicySpec, who: Identity) -> dict[str, Any]:
    """``{..., appliesTo, policy}``: ``policy`` is the runtime's canonical form of the spec
    (``agent_saga.controls.policy.parse_policy(...).to_doc()``), which the runtime's gate
    and the MCP proxy read with the same parser."""
    try:
        policy = parse_policy(spec.to_json_doc()).to_doc()
    except PolicyError as e:  # the model already ran the parser: only a changed runtime gets here
        raise InvalidSpec(str(e)) from e
    return {
        **_envelope("SagaPolicy", who),
        "appliesTo": policy.get("appliesTo"),
        "policy": policy,
    }


# ------------------------------------------------------------------ ModelRoute
def model_route_doc(spec: ModelRouteSpec, who: Identity) -> dict[str, Any]:
    """``{..., hosts, preference, constraints, appliesTo}`` for the runtime's router."""
    hosts = [
        {
            "name": h.name,
            "endpoint": h.endpoint,
            "model": h.model,
            "capabilities": h.capabilities.to_json_doc(),
            "credentialRef": h.credential_ref,
        }
        for h in spec.hosts
    ]
    preference = list(spec.preference) if spec.preference else [h.name for h in spec.hosts]
    preference += [h.name for h in spec.hosts if h.name not in preference]
    return {
        **_envelope("ModelRoute", who),
        "hosts": hosts,
        "preference": preference,
        "constraints": spec.constraints.to_json_doc() if spec.constraints else {},
        "appliesTo": {"agents": list(spec.applies_to.agents)} if spec.applies_to else None,
    }


# ------------------------------------------------------------------ Approval
def approval_decision_doc(spec: ApprovalSpec, who: Identity, *, decided_at: datetime, expired: bool,
                          authenticated: bool = False) -> dict[str, Any]:
    """The decision written back for the waiting saga (docs/policy-plane.md).

    ``decision`` is ``approved``, ``denied`` or ``expired`` (expiry denies). A decision
    made after the deadline is written as ``expired``: the saga stopped waiting then.
    ``authenticated``: the approver admission policy is in force, so ``spec.approver`` is
    the user the API server authenticated (``authenticatedUser``). A break-glass Approval
    (``who.break_glass``) writes ``breakGlass``: the agent records APPROVAL_BREAK_GLASS.
    """
    if expired:
        decision, approver, note = "expired", None, None
    else:
        assert spec.decision is not None
        decision, approver, note = spec.decision.lower(), spec.approver, spec.note
    return {
        **_envelope("ApprovalDecision", who),
        "requestId": spec.request_id,
        "argumentsDigest": spec.arguments_digest,
        "decision": decision,
        "approver": approver,
        "note": note,
        "authenticatedUser": approver if authenticated else None,
        "decidedAt": rfc3339(decided_at),
        "source": f"kubernetes:{who.id}",
        "breakGlass": bool(who.break_glass and decision == "approved"),
    }
