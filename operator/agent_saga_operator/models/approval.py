"""Approval: a pending human decision, mirrored from the runtime's approval store.

The operator creates one Approval per request an agent is waiting on (the request
fields: tool, a digest of the exact arguments plus the fields shown to the human, saga,
step, rule, deadline). A human answers by setting ``spec.decision`` with their name in
``spec.approver`` (``kubectl patch``, or ``agent-saga approvals approve``); the operator
writes the decision back to the policy plane, where the waiting saga sees it.

Rules the API server enforces:
- A decision needs an approver: an anonymous approval proves nothing.
- A decision, its approver and its note are immutable once made and valid; so is every
  field of the request (a human approves exactly what they were shown). The one
  exception: an approval the agents ignore (the operator's Ready condition says reason
  ``Unsigned`` or ``UntrustedKey``) may be changed or withdrawn, so it cannot hold the
  request until its deadline. A denial, an expiry and a signed approval never change.
- A request that needs the approver's passkey (``passkeyRequired``) can only be denied
  here: a kubectl decision carries no passkey signature, so the agent would refuse it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from ._base import (
    BaseStatus,
    CRDModel,
    Explained,
    KindInfo,
    Principal,
    PrinterColumn,
    Resource,
    SagaId,
    Sentence,
    ToolName,
    cel,
    immutable,
    ready_columns,
    validations,
)

Decision = Literal["Approved", "Denied"]
Phase = Literal["Pending", "Approved", "Denied", "Expired"]

REQUEST_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
RequestId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=REQUEST_ID_PATTERN),
                     Explained(REQUEST_ID_PATTERN, "a request id as agent-saga approvals list prints it, "
                               "e.g. af83c011")]
DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"
Digest = Annotated[str, StringConstraints(min_length=71, max_length=71, pattern=DIGEST_PATTERN),
                  Explained(DIGEST_PATTERN, "sha256: and 64 lowercase hex digits (the operator writes it "
                            "from the agent's request)")]
DisplayValue = Annotated[str, StringConstraints(max_length=1024)]


class ApprovalSpec(CRDModel):
    """The request (written by the operator) and the human's decision."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel("!has(self.decision) || has(self.approver)",
                "a decision needs an approver: name the human who made it (an anonymous approval proves nothing)",
                field_path=".approver", reason="FieldValueRequired"),
            cel("!has(self.approver) || has(self.decision)",
                "approver is set together with decision (Approved or Denied)",
                field_path=".decision", reason="FieldValueRequired"),
            cel("!has(oldSelf.passkeyRequired) || (has(self.passkeyRequired) && "
                "self.passkeyRequired == oldSelf.passkeyRequired)",
                "passkeyRequired is immutable: it says what the agent will accept",
                field_path=".passkeyRequired", reason="FieldValueForbidden"),
            cel("!has(self.passkeyRequired) || !self.passkeyRequired || !has(self.decision) || "
                "self.decision == 'Denied'",
                "this request needs the approver's passkey, which a kubectl decision cannot carry: deny it "
                "here, or approve it with agent-saga approvals sign <requestId> --approver you@corp --key your-key.pem",
                field_path=".decision", reason="FieldValueForbidden"),
        )
    }

    request_id: RequestId = Field(
        description="The request id in the approval store (derived from saga, step, tool, rule).",
        json_schema_extra=immutable("requestId"),
    )
    tool: ToolName = Field(description="The tool the agent wants to call.", json_schema_extra=immutable("tool"))
    saga_id: SagaId = Field(json_schema_extra=immutable("sagaId"))
    step_id: Annotated[str, StringConstraints(min_length=1, max_length=128)] = Field(
        json_schema_extra=immutable("stepId")
    )
    rule: Annotated[str, StringConstraints(min_length=1, max_length=100)] = Field(
        description="The rule or limit that asked for a human (irreversible, limit:wire-ceiling).",
        json_schema_extra=immutable("rule"),
    )
    reason: Sentence | None = Field(default=None, description="Why a human is asked.",
                                    json_schema_extra=immutable("reason"))
    arguments_digest: Digest = Field(
        description="sha256 over the exact arguments: the decision covers this call and no other.",
        json_schema_extra=immutable("argumentsDigest"),
    )
    display: dict[str, DisplayValue] | None = Field(
        default=None,
        max_length=32,
        description="Fields shown to the approver (amount, to); never secrets.",
        json_schema_extra=immutable("display"),
    )
    requested_at: datetime = Field(json_schema_extra=immutable("requestedAt"))
    deadline: datetime = Field(
        description="Expiry denies: no answer by then is a Denied.", json_schema_extra=immutable("deadline")
    )
    passkey_required: bool | None = Field(
        default=None,
        description="The agent accepts an approval of this request only when signed with the approver's "
                    "passkey (agent-saga approvals sign); here it can only be denied.",
    )
    decision: Decision | None = Field(default=None, description="Approved or Denied (immutable once set).")
    approver: Principal | None = Field(default=None, description="Who decided (required with decision).")
    note: Sentence | None = Field(default=None, description="Why (verified by phone).")


class ApprovalStatus(BaseStatus):
    """Where the request stands, and when the decision reached the policy plane."""

    phase: Phase | None = Field(default=None, description="Pending, Approved, Denied or Expired.")
    decided_at: datetime | None = Field(default=None, description="When the decision was written back.")
    approver: Annotated[str, StringConstraints(max_length=256)] | None = Field(
        default=None, description="Who decided, as the policy plane holds it (kubectl, the CLI, or none: expiry).")
    source: Annotated[str, StringConstraints(max_length=256)] | None = Field(
        default=None, description="Where the decision was made: kubernetes:<ns>/<name>, cli:<host>:<pid>, agent.")
    authenticated_user: Annotated[str, StringConstraints(max_length=256)] | None = Field(
        default=None, description="The user the API server authenticated for this decision (set when the "
                                  "approver admission policy is in force; empty for CLI decisions and expiry).")
    signed_by: Annotated[str, StringConstraints(max_length=64)] | None = Field(
        default=None, description="The id of the key that signed the decision (agents accept an approval only "
                                  "when signed by a trusted key, once keys are configured).")
    key_owner: Annotated[str, StringConstraints(max_length=512)] | None = Field(
        default=None, description="Whom the signing key belongs to: the approver name(s) it is bound to, or the "
                                  "operator's own key (it signs for the approver the API server authenticated).")


# The operator reported the decision as an approval the agents ignore (not signed, or not
# by a key trusted for its approver): then, and only then, it may change.
_IGNORED = ("(has(oldSelf.status) && has(oldSelf.status.conditions) && oldSelf.status.conditions.exists(c, "
            "c.type == 'Ready' && c.reason in ['Unsigned', 'UntrustedKey']))")
_FIX = (" (only an approval the agents ignore, Ready reason Unsigned or UntrustedKey, may be decided again)")


class Approval(Resource):
    """A request an agent is waiting on, and the named human's answer."""

    info: ClassVar[KindInfo] = KindInfo(
        kind="Approval",
        plural="approvals",
        short_names=("appr",),
        description="Durable human approvals: requests agents wait on, answered with kubectl.",
        root_rules=(
            cel(f"!has(oldSelf.spec.decision) || (has(self.spec.decision) && self.spec.decision == "
                f"oldSelf.spec.decision) || {_IGNORED}",
                "decision is immutable once made: an answered approval cannot be changed or withdrawn" + _FIX,
                field_path=".spec.decision", reason="FieldValueForbidden"),
            cel(f"!has(oldSelf.spec.decision) || (has(self.spec.approver) && self.spec.approver == "
                f"oldSelf.spec.approver) || {_IGNORED}",
                "approver is immutable once the decision is made" + _FIX,
                field_path=".spec.approver", reason="FieldValueForbidden"),
            cel(f"!has(oldSelf.spec.decision) || (has(self.spec.note) == has(oldSelf.spec.note) && "
                f"(!has(self.spec.note) || self.spec.note == oldSelf.spec.note)) || {_IGNORED}",
                "note is immutable once the decision is made" + _FIX,
                field_path=".spec.note", reason="FieldValueForbidden"),
        ),
        columns=(
            PrinterColumn("Tool", "string", ".spec.tool"),
            PrinterColumn("Saga", "string", ".spec.sagaId"),
            PrinterColumn("Phase", "string", ".status.phase"),
            PrinterColumn("Approver", "string", ".status.approver"),
            PrinterColumn("Deadline", "string", ".spec.deadline", "No answer by then denies it (UTC)"),
            PrinterColumn("Rule", "string", ".spec.rule", priority=1),
            *ready_columns("True: approved, the saga may proceed (an Approval is answered, not applied: no ACKED)"),
        ),
    )

    spec: ApprovalSpec
    status: ApprovalStatus | None = None
