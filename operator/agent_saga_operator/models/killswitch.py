"""KillSwitch: halt, drain or quarantine, from ``kubectl apply``.

The four levers of the kill switch: HALT refuses new side
effects (everywhere, or for a tool glob or a tag), DRAIN starts no new sagas but lets
running ones finish, QUARANTINE freezes one saga (no rollback: a human decides), and a
TTL lifts any of them on its own.

Rules the API server enforces:
- ``reason`` and ``requestedBy`` are required: who stopped the fleet, and why.
- ``scope``, when present, names exactly one of ``tool``, ``tag``, ``sagaId``; a global
  switch omits ``scope`` (an empty or blank scope is refused, never read as global).
- Quarantine needs ``scope.sagaId`` and ``scope.sagaId`` is only for Quarantine.
- Drain is global or by tag (it is about starting sagas, not calling tools).
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field, model_validator

from ._base import (
    AgentsStatus,
    BaseStatus,
    CRDModel,
    KindInfo,
    Principal,
    PrinterColumn,
    Resource,
    SagaId,
    Sentence,
    Tag,
    ToolGlob,
    cel,
    cel_explained,
    ready_columns,
    validations,
)

KillSwitchAction = Literal["Halt", "Drain", "Quarantine"]


class KillSwitchScope(CRDModel):
    """What the switch applies to: exactly one of tool, tag or sagaId. To stop everything,
    omit scope (an empty scope is refused: one blank field must not halt the fleet)."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel_explained(
                "(has(self.tool) ? 1 : 0) + (has(self.tag) ? 1 : 0) + (has(self.sagaId) ? 1 : 0) == 1",
                "(has(self.tool) || has(self.tag) || has(self.sagaId)) "
                "? 'scope names more than one of tool, tag and sagaId: keep exactly one (one switch per scope)' "
                ": 'scope is empty (a blank tool, tag or sagaId): set one of them, or remove scope entirely "
                "for a global switch'",
            )
        )
    }

    tool: ToolGlob | None = Field(default=None, description="A tool name or glob: wire.send, stripe.*")
    tag: Tag | None = Field(default=None, description="Sagas carrying this tag: eu")
    saga_id: SagaId | None = Field(default=None, description="One saga (Quarantine only).")

    @model_validator(mode="after")
    def _exactly_one(self) -> KillSwitchScope:
        """What the CEL rule says to the API server (an object stored before it existed
        is refused here, never read as a global halt)."""
        if sum(v is not None for v in (self.tool, self.tag, self.saga_id)) != 1:
            raise ValueError("scope names exactly one of tool, tag or sagaId; omit scope for a global switch")
        return self


class KillSwitchSpec(CRDModel):
    """A halt, drain or quarantine, with who asked for it and why."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "self.action != 'Quarantine' || (has(self.scope) && has(self.scope.sagaId))",
                "a Quarantine freezes one saga: set scope.sagaId",
                field_path=".scope",
                reason="FieldValueRequired",
            ),
            cel(
                "!has(self.scope) || !has(self.scope.sagaId) || self.action == 'Quarantine'",
                "scope.sagaId is only for action Quarantine (Halt and Drain apply to a tool, a tag or everything)",
                field_path=".scope.sagaId",
                reason="FieldValueForbidden",
            ),
            cel(
                "self.action != 'Drain' || !has(self.scope) || !has(self.scope.tool)",
                "a Drain starts no new sagas: scope it globally or by tag, not by tool",
                field_path=".scope.tool",
                reason="FieldValueForbidden",
            ),
        )
    }

    action: KillSwitchAction = Field(
        description="Halt: refuse new side effects. Drain: start no new sagas, let running ones "
        "finish. Quarantine: freeze one saga (never rolled back automatically)."
    )
    scope: KillSwitchScope | None = Field(
        default=None, description="What it applies to: one of tool, tag or sagaId. Absent: everything (global)."
    )
    reason: Sentence = Field(description="Why (lands in the WAL with every refusal).")
    requested_by: Principal = Field(description="Who asked for it (soc@corp).")
    ttl_seconds: int | None = Field(
        default=None,
        ge=1,
        le=31_536_000,
        description="Lift automatically this many seconds after creation (a halt nobody remembers "
        "to lift is its own outage).",
    )


class KillSwitchStatus(BaseStatus):
    """Whether the switch is engaged in the policy plane, since when, until when."""

    engaged: bool | None = Field(default=None, description="True while agents refuse because of it.")
    scope: str | None = Field(
        default=None, max_length=300, description="The scope as agents see it: global, tool:wire.send, tag:eu, saga:ID."
    )
    engaged_at: datetime | None = Field(default=None, description="When it took effect.")
    expires_at: datetime | None = Field(default=None, description="When its TTL lifts it.")
    agents: AgentsStatus | None = Field(default=None, description="Which agents apply it (their heartbeats).")
    acked: str | None = Field(default=None, max_length=32, description="acknowledged/matched, e.g. 3/3.")


class KillSwitch(Resource):
    """A kill switch: every agent reading the policy plane refuses what it covers."""

    info: ClassVar[KindInfo] = KindInfo(
        kind="KillSwitch",
        plural="killswitches",
        short_names=("ks",),
        description="Halt, drain or quarantine agents fleet-wide (the kill switch). It governs the agents "
        "that read its namespace (AGENT_SAGA_NAMESPACE, by default the agent pod's namespace).",
        columns=(
            PrinterColumn("Action", "string", ".spec.action"),
            PrinterColumn("Scope", "string", ".status.scope"),
            PrinterColumn("Engaged", "boolean", ".status.engaged"),
            PrinterColumn("Acked", "string", ".status.acked", "Agents applying it / agents it governs"),
            PrinterColumn("Expires", "string", ".status.expiresAt", "When its TTL lifts it (UTC)"),
            PrinterColumn("By", "string", ".spec.requestedBy", priority=1),
            PrinterColumn("Reason", "string", ".spec.reason", priority=1),
            *ready_columns(),
        ),
    )

    spec: KillSwitchSpec
    status: KillSwitchStatus | None = None
