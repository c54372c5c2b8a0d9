"""Approval requests and decisions as policy-plane documents (docs/approvals.md).

Two documents per request, with two writers, so neither can overwrite the other:

- the REQUEST, written by the agent that asks (and updated only by agents: who was
  notified when, whether the approval was used)::

    {"v": 1, "kind": "ApprovalRequest", "requestId": "af83c011...", "namespace": "payments",
     "agent": "payments-1", "tool": "wire.send", "semantics": "IRREVERSIBLE",
     "argumentsDigest": "sha256:<64 hex>", "arguments": {"amount": 80000, "to": "acct_9"},
     "owner": "payments/payments-1-7d9f", "display": {"amount": "80000", "to": "acct_9"},
     "sagaId": "saga-8f3c", "stepId": "saga-8f3c/3", "rule": "irreversible",
     "reason": "Action cannot be undone", "requestedAt": "<RFC 3339>", "deadline": "<RFC 3339>",
     "policyVersion": "1", "requestedBy": "host:pid",
     "levels": [{"targets": ["@oncall"], "afterSeconds": 0}, ...],
     "escalations": [{"level": 0, "targets": ["@oncall"], "at": "<RFC 3339>"}],
     "consumedAt": null, "consumedBy": null,
     "challenge": {"format": "agent-saga.passkey-challenge/v1", ...}}   # passkey approvals only

- the DECISION, written once (by the CLI, the operator from an ``Approval`` resource, or
  the agent itself when it gives up: expiry, a failed notifier)::

    {"v": 1, "kind": "ApprovalDecision", "id": "payments/af83c011...", "requestId": "af83c011...",
     "argumentsDigest": "sha256:...", "decision": "approved" | "denied" | "expired",
     "approver": "risk@corp", "note": "verified by phone", "decidedAt": "<RFC 3339>",
     "source": "cli:host:pid", "breakGlass": false,
     "expiresAt": "<the request's deadline>", "signature": {"alg": "Ed25519", "keyId": ..., "sig": ...},
     "passkey": {"format": "ed25519", "keyId": ..., "challenge": ..., "sig": ...}}   # passkey approvals only

  An ``approved`` decision counts only with a valid signature from a trusted key when
  the agent trusts keys (``_signing``); denials and expiries need none.

``ApprovalRequest`` is the merged view: the request's fields and, once made, its decision.

The gate's side (the seam): ``ApprovalProvider.request_approval`` is how the gate asks a
named human (the durable ``ApprovalGateway`` implements it; the gate calls it only after
the kill switch, the breaker, the limits and the rules had their say), and
``ApprovalOutcome`` the answer. Only ``ApprovalOutcome(approved=True, approver="<someone>")``
approves: the gate refuses an approval without a named approver, a provider that raises
or returns anything else, and hands back any budget reserved for a call not approved.

Invariants:
- The request id is derived from (saga, step, tool, rule): a retried step or a restarted
  process finds its request (and its decision) instead of asking again. Lower-case hex,
  so it is a valid Kubernetes name (the operator mirrors it as ``Approval/<id>``).
- An approval covers ``argumentsDigest`` (tool + exact policy arguments + policy
  version) and nothing else. ``arguments`` are those exact arguments: what a human is
  shown is rendered from them (``action_view``), after checking they hash to the digest;
  ``display`` is kept for older readers only and never shown by this version.
- ``owner`` (``<namespace>/<pod>``) is the agent that wrote the request; its id is
  derived with it, so a document another agent wrote under its own name cannot pass for
  this one (``owner_problem``).
- Readers ignore fields they do not know and refuse a ``v`` they do not know.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, runtime_checkable

from ...clocks import format_instant, parse_instant
from ...gates import GateDecision, StepRequest
from ...records import canonical_json
from ._render import ActionView, render_action
from ._signing import SIGNED_FIELDS, Seal

__all__ = [
    "ApprovalOutcome",
    "ApprovalProvider",
    "ApprovalRequest",
    "ApprovalState",
    "Decision",
    "action_digest",
    "request_id_for",
]

DOC_VERSION = 1

ApprovalState = Literal["Pending", "Approved", "Denied", "Expired"]
_STATES: dict[str, ApprovalState] = {"approved": "Approved", "denied": "Denied", "expired": "Expired"}


def request_id_for(saga_id: str, step_id: str, tool: str, rule: str, owner: str = "") -> str:
    """The request id (32 lower-case hex) derived from (saga, step, tool, rule) and, for a
    request kept under its agent's name, that ``owner``."""
    text = f"{saga_id}\n{step_id}\n{tool}\n{rule}" + (f"\n{owner}" if owner else "")
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def action_digest(tool: str, policy_args: Mapping[str, Any], policy_version: str) -> str:
    """``sha256:<hex>`` over the tool, its exact policy arguments and the policy version:
    what an approval is bound to (other arguments are another action)."""
    text = canonical_json({"tool": tool, "args": dict(policy_args), "policyVersion": policy_version})
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def _t(x: float | None) -> str | None:
    return None if x is None else format_instant(x)


@dataclass(frozen=True, slots=True)
class Decision:
    """A decision on one request: ``state`` Approved / Denied / Expired, who, why, when,
    from where (``source``), for which arguments (``arguments_digest``)."""

    state: ApprovalState
    approver: str
    decided_at: float
    arguments_digest: str
    note: str | None = None
    source: str = ""
    break_glass: bool = False
    #: The signed fields as the document carries them (``requestId`` ... ``expiresAt``,
    #: ``signature``; ``_signing``), or ``None`` for an unsigned decision.
    signed: Mapping[str, Any] | None = field(default=None, hash=False)
    #: The approver's passkey assertion over the request's challenge (``_passkey``), if any.
    passkey: Mapping[str, Any] | None = field(default=None, hash=False)

    @property
    def seal(self) -> Seal | None:
        """The decision's signature, as the agent checks it (``None``: unsigned)."""
        return None if self.signed is None else Seal.from_doc(self.signed)

    def same_as(self, other: Decision | None) -> bool:
        """Is ``other`` this decision as read back from a document (times to the µs)?"""
        return other is not None and (self.state, self.approver, self.source, self.note, self.break_glass) == (
            other.state, other.approver, other.source, other.note, other.break_glass
        ) and abs(self.decided_at - other.decided_at) < 1e-3

    def to_doc(self, request_id: str, namespace: str) -> dict[str, Any]:
        """The decision document (``v`` 1) of request ``request_id``."""
        return {
            "v": DOC_VERSION, "kind": "ApprovalDecision", "id": f"{namespace}/{request_id}",
            "requestId": request_id, "argumentsDigest": self.arguments_digest,
            "decision": self.state.lower(), "approver": self.approver, "note": self.note,
            "decidedAt": _t(self.decided_at), "source": self.source, "breakGlass": self.break_glass,
            **({"passkey": dict(self.passkey)} if self.passkey is not None else {}),
            **(self.signed or {}),
        }

    @classmethod
    def from_doc(cls, doc: Any) -> Decision:
        """Read a decision; raises ``ValueError`` naming what is wrong."""
        if not isinstance(doc, Mapping):
            raise ValueError("an approval decision must be a JSON object")
        if doc.get("v", DOC_VERSION) != DOC_VERSION:
            raise ValueError(f"decision schema v={doc.get('v')!r} is not supported (v={DOC_VERSION})")
        raw = str(doc.get("decision", "")).lower()
        if raw not in _STATES:
            raise ValueError(f"decision {doc.get('decision')!r} is not approved, denied or expired")
        decided = parse_instant(doc.get("decidedAt"))
        if decided is None:
            raise ValueError("decision has no decidedAt")
        signed = {k: doc.get(k) for k in SIGNED_FIELDS} if "signature" in doc else None
        passkey = doc.get("passkey")
        return cls(_STATES[raw], str(doc.get("approver") or ""), decided, str(doc.get("argumentsDigest") or ""),
                   doc.get("note"), str(doc.get("source") or ""), bool(doc.get("breakGlass")), signed,
                   dict(passkey) if isinstance(passkey, Mapping) else None)


@dataclass(frozen=True, slots=True)
class ApprovalRequest:
    """One request and, once made, its decision (the merged view; see the module doc).

    Times are epoch seconds. ``levels`` is ``((targets, after_seconds), ...)``;
    ``escalations`` is ``((level, targets, at), ...)``: who was asked, when."""

    id: str
    saga_id: str
    step_id: str
    tool: str
    rule: str
    reason: str
    arguments_digest: str
    policy_version: str
    requested_at: float
    deadline: float
    display: Mapping[str, str] = field(default_factory=dict)
    namespace: str = "default"
    agent: str = ""
    semantics: str = ""
    requested_by: str = ""
    levels: tuple[tuple[tuple[str, ...], float], ...] = ()
    escalations: tuple[tuple[int, tuple[str, ...], float], ...] = ()
    consumed_at: float | None = None
    consumed_by: str | None = None
    #: The passkey challenge the approver's key must sign (``_passkey``), when the
    #: action needs a passkey approval.
    challenge: Mapping[str, Any] | None = None
    #: The exact policy arguments ``arguments_digest`` covers (what a human is shown is
    #: rendered from them); ``None`` in a request made by an older agent.
    arguments: Mapping[str, Any] | None = field(default=None, hash=False)
    #: ``<namespace>/<pod>`` of the agent that wrote the request ("" in shared mode).
    owner: str = ""
    decision: Decision | None = None

    @property
    def state(self) -> ApprovalState:
        """``Pending``, or the decision's state."""
        return "Pending" if self.decision is None else self.decision.state

    @property
    def decided(self) -> bool:
        """True once a decision is stored."""
        return self.decision is not None

    @property
    def approver(self) -> str | None:
        """Who decided (``None`` while pending)."""
        return None if self.decision is None else self.decision.approver or None

    @property
    def note(self) -> str | None:
        """The decision's note, if any."""
        return None if self.decision is None else self.decision.note

    @property
    def decided_at(self) -> float | None:
        """When it was decided (epoch seconds), if it was."""
        return None if self.decision is None else self.decision.decided_at

    @property
    def break_glass(self) -> bool:
        """True for a break-glass approval."""
        return self.decision is not None and self.decision.break_glass

    def action_view(self) -> ActionView:
        """The action as a human is shown it, rendered from the canonical arguments after
        checking they hash to ``arguments_digest``; raises ``ValueError`` saying why a
        request cannot be shown as approvable."""
        if self.arguments is None:
            raise ValueError(f"approval request {self.id} carries no canonical arguments (it was made by an older "
                             f"agent), so what it shows cannot be checked against its digest: it cannot be "
                             f"approved; deny it, or let it expire and upgrade the agent")
        if action_digest(self.tool, self.arguments, self.policy_version) != self.arguments_digest:
            raise ValueError(f"approval request {self.id}: its arguments do not hash to its argumentsDigest "
                             f"{self.arguments_digest[:19]}: the request was altered after the agent wrote it, and "
                             f"it cannot be approved")
        return render_action(self.tool, self.arguments)

    def owner_problem(self, owner: str) -> str | None:
        """Why this document, found under the name ``owner``, is not that agent's request."""
        if self.owner != owner:
            return f"it names the agent {self.owner[:80]!r}, but is kept under {owner[:80]!r}"
        if owner and self.id != request_id_for(self.saga_id, self.step_id, self.tool, self.rule, owner):
            return f"its id {self.id[:12]} is not the one agent {owner[:80]!r} derives for its saga, step and tool"
        return None

    def escalated_to(self, level: int) -> bool:
        """Was escalation level ``level`` notified?"""
        return any(e[0] == level for e in self.escalations)

    def with_decision(self, decision: Decision | None) -> ApprovalRequest:
        """This request with ``decision`` merged in."""
        return replace(self, decision=decision)

    # ------------------------------------------------------------------ documents
    def to_doc(self) -> dict[str, Any]:
        """The request document (the decision is a document of its own)."""
        return {
            "v": DOC_VERSION, "kind": "ApprovalRequest", "requestId": self.id, "namespace": self.namespace,
            "agent": self.agent, "tool": self.tool, "semantics": self.semantics,
            "argumentsDigest": self.arguments_digest, "display": dict(self.display), "sagaId": self.saga_id,
            "stepId": self.step_id, "rule": self.rule, "reason": self.reason, "requestedAt": _t(self.requested_at),
            "deadline": _t(self.deadline), "policyVersion": self.policy_version, "requestedBy": self.requested_by,
            "levels": [{"targets": list(tg), "afterSeconds": a} for tg, a in self.levels],
            "escalations": [{"level": lv, "targets": list(tg), "at": _t(at)} for lv, tg, at in self.escalations],
            "consumedAt": _t(self.consumed_at), "consumedBy": self.consumed_by,
            **({"challenge": dict(self.challenge)} if self.challenge is not None else {}),
            **({"arguments": dict(self.arguments)} if self.arguments is not None else {}),
            **({"owner": self.owner} if self.owner else {}),
        }

    def to_json(self) -> str:
        """The request document as compact JSON."""
        return json.dumps(self.to_doc(), sort_keys=True, separators=(",", ":"))

    def view_doc(self) -> dict[str, Any]:
        """The merged view as JSON (``agent-saga approvals list --json``)."""
        doc = self.to_doc()
        doc["state"] = self.state
        doc["decision"] = None if self.decision is None else self.decision.to_doc(self.id, self.namespace)
        return doc

    @classmethod
    def from_doc(cls, doc: Any) -> ApprovalRequest:
        """Read a request document; raises ``ValueError`` naming what is wrong."""
        if not isinstance(doc, Mapping):
            raise ValueError("an approval request must be a JSON object")
        if doc.get("v", DOC_VERSION) != DOC_VERSION:
            raise ValueError(f"approval schema v={doc.get('v')!r} is not supported (v={DOC_VERSION})")
        try:
            requested_at, deadline = parse_instant(doc["requestedAt"]), parse_instant(doc["deadline"])
            if requested_at is None or deadline is None:
                raise ValueError("requestedAt and deadline are required")
            return cls(
                id=str(doc["requestId"]), saga_id=str(doc["sagaId"]), step_id=str(doc["stepId"]),
                tool=str(doc["tool"]), rule=str(doc["rule"]), reason=str(doc.get("reason") or ""),
                arguments_digest=str(doc["argumentsDigest"]), policy_version=str(doc.get("policyVersion") or ""),
                requested_at=requested_at, deadline=deadline,
                display={str(k): str(v) for k, v in (doc.get("display") or {}).items()},
                namespace=str(doc.get("namespace") or "default"), agent=str(doc.get("agent") or ""),
                semantics=str(doc.get("semantics") or ""), requested_by=str(doc.get("requestedBy") or ""),
                levels=tuple((tuple(str(x) for x in lv.get("targets") or ()), float(lv.get("afterSeconds") or 0))
                             for lv in doc.get("levels") or ()),
                escalations=tuple(
                    (int(e["level"]), tuple(str(x) for x in e.get("targets") or ()), parse_instant(e.get("at")) or 0.0)
                    for e in doc.get("escalations") or ()
                ),
                consumed_at=parse_instant(doc.get("consumedAt")), consumed_by=doc.get("consumedBy"),
                challenge=dict(doc["challenge"]) if isinstance(doc.get("challenge"), Mapping) else None,
                arguments=dict(doc["arguments"]) if isinstance(doc.get("arguments"), Mapping) else None,
                owner=str(doc.get("owner") or ""),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"approval request is missing or has a malformed field: {exc}") from exc

    @classmethod
    def from_json(cls, raw: str | bytes) -> ApprovalRequest:
        """Read a request document; raises ``ValueError``."""
        return cls.from_doc(json.loads(raw))


@dataclass(frozen=True, slots=True)
class ApprovalOutcome:
    """A human's answer. ``approver`` names who (required for a yes); ``note`` why.

    ``request_id`` identifies the approval request in the provider's store;
    ``break_glass`` marks an emergency override (recorded distinctly, flagged for review).
    """

    approved: bool
    approver: str | None = None
    note: str = ""
    request_id: str | None = None
    break_glass: bool = False

    def to_doc(self) -> dict[str, Any]:
        """The answer as JSON (the verdict's ``detail["approval"]``)."""
        return {
            "approved": self.approved,
            "approver": self.approver,
            "note": self.note,
            "request_id": self.request_id,
            "break_glass": self.break_glass,
        }


@runtime_checkable
class ApprovalProvider(Protocol):
    """Asks a human about one call and waits (with its own deadline) for the answer."""

    async def request_approval(self, request: StepRequest, verdict: GateDecision) -> ApprovalOutcome:
        """Return the human's answer about ``request``; ``verdict`` (the gate's pending
        ``PreFlightDecision``) says which rule or limit asked (``verdict.decided_by``) and
        why (``verdict.reason``). Expiry denies."""
        ...
