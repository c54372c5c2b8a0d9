"""Is an approval in the policy plane one the agents act on? The operator's view of it.

Agents accept ``approved`` only with a valid signature from a key they trust, bound to
the decision's approver (docs/approvals.md, "Proof of the approver"). The operator
judges a stored approval the same way, against the keys it publishes, so an Approval
never says "the saga may proceed" for an approval the agents ignore:

- ``Ready=False``, reason ``Unsigned`` (no signature) or ``UntrustedKey`` (signed, but not
  by a published key, not for this request, deadline, tool or rendered action, in the
  refused v1 format, or not for this approver), phase
  ``Pending``: the saga still waits, and the message says how to approve it, signed.
- Such an approval may be replaced: by a decision made on the Approval (the CRD lets
  ``spec.decision`` change while Ready says ``Unsigned`` / ``UntrustedKey``), or by a
  signed ``agent-saga approvals approve``. A proven decision is never replaced.

An operator that publishes no key judges nothing (agents then accept unsigned approvals).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any

from agent_saga.controls.approvals import ENV_SIGNING_KEY, Decision

from .conditions import READY, SYNCED, Cond, Reason, rfc3339
from .config import Context
from .models import ApprovalSpec

if TYPE_CHECKING:
    from .reconcilers import Outcome

__all__ = ["IGNORED_REASONS", "judge", "key_owner", "unproven_outcome"]

#: The Ready reasons of an approval the agents ignore (the CRD lets such a decision change).
IGNORED_REASONS = (Reason.UNSIGNED, Reason.UNTRUSTED_KEY)


def judge(ctx: Context, spec: ApprovalSpec, doc: Mapping[str, Any], action: str | None) -> tuple[str, str] | None:
    """``(reason, why)`` when ``doc`` is an approval the agents ignore, else ``None`` (a
    denial, an expiry, a proven approval, or no published key to judge by).

    ``action``: the digest of the action rendered from the request in the policy plane
    (what a signature must cover, as the agent checks it from its own call); ``""`` when
    the request there cannot be rendered or was altered (no signature covers it);
    ``None`` when no request is there (no agent waits on it: the signature is judged
    without the action)."""
    if ctx.trusted is None or str(doc.get("decision") or "").lower() != "approved":
        return None
    try:
        decision = Decision.from_doc(doc)
    except ValueError as exc:
        return Reason.UNTRUSTED_KEY, f"the decision cannot be read ({exc})"
    seal = decision.seal
    tool, rendered = (spec.tool, action) if action is not None or seal is None else (seal.tool, seal.action_digest)
    why = ctx.trusted.problem(seal, request_id=spec.request_id, arguments_digest=spec.arguments_digest,
                              deadline=spec.deadline.timestamp(), tool=tool, action_digest=rendered or "",
                              approver=decision.approver)
    if why is None:
        return None
    return (Reason.UNSIGNED if seal is None else Reason.UNTRUSTED_KEY), why


def key_owner(ctx: Context, doc: Mapping[str, Any]) -> str | None:
    """Whom the key that signed ``doc`` belongs to (its approver names), if published."""
    kid = (doc.get("signature") or {}).get("keyId") if isinstance(doc.get("signature"), Mapping) else None
    if ctx.trusted is None or not kid:
        return None
    return ctx.trusted.owner(str(kid)) or None


def unproven_outcome(spec: ApprovalSpec, doc: Mapping[str, Any], reason: str, why: str, now: datetime,
                     *, namespace: str, name: str) -> Outcome:
    """The status of an Approval whose approval in the policy plane the agents ignore."""
    from .reconcilers import Outcome

    approver = str(doc.get("approver") or "someone")[:64]
    source = str(doc.get("source") or "")
    signature = doc.get("signature")
    fields: dict[str, Any] = {"phase": "Pending", "decidedAt": None, "approver": None, "source": source or None,
                              "authenticatedUser": None, "keyOwner": None,
                              "signedBy": signature.get("keyId") if isinstance(signature, Mapping) else None}
    where = f" (source {source})" if source else ""
    if now >= spec.deadline:
        return Outcome(Cond(READY, "False", Reason.EXPIRED,
                            f"deadline {rfc3339(spec.deadline)} passed without an approval the agents accept (the "
                            f"approval by {approver}{where} was ignored: {why}): expiry denies"),
                       Cond(SYNCED, "True", Reason.PROJECTED, "nothing to write back"), {**fields, "phase": "Expired"})
    how = (f"agent-saga approvals approve {spec.request_id} --approver NAME --signing-key KEY.pem (or "
           f"${ENV_SIGNING_KEY}), or decide this Approval again (kubectl patch approval {name} -n {namespace} "
           f"--type merge -p '{{\"spec\":{{\"decision\":\"Approved\",\"approver\":\"you@corp\"}}}}')")
    return Outcome(Cond(READY, "False", reason,
                        f"the approval by {approver}{where} is not one the agents accept ({why}): the saga still "
                        f"waits until {rfc3339(spec.deadline)}; approve it signed: {how}"),
                   Cond(SYNCED, "True", Reason.PROJECTED, f"the decision{where} is in the policy plane"), fields)
