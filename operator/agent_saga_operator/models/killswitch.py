"""KillSwitch: halt, drain or quarantine, from ``kubectl apply``.

The four levers of the kill switch: HALT refuses new side
effects (everywhere, or for a tool glob or a tag), DRAIN starts no new sagas but lets
running ones finish, QUARANTINE freezes one saga (no rollback: a human decides), and a
TTL lifts any of them on its own.

Rules the API server enforces:
- ``reason`` and ``requestedBy`` are required: who stopped the fleet, and why.
- ``scope`` names at most one of ``tool``, ``tag``, ``sagaId``; none means global.
- Quarantine needs ``scope.sagaId`` and ``scope.sagaId`` is only for Quarantine.
- Drain is global or by tag (it is about starting sagas, not calling tools).
"""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar, Literal

from pydantic import Field

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
    ready_columns,
    validations,
)

KillSwitchAction = Literal["Halt", "Drain", "Quarantine"]


class KillSwitchScope(CRDModel):
    """What the switch applies to. Empty: everything (global)."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "(has(self.tool) ? 1 : 0) + (has(self.tag) ? 1 : 0) + (has(self.sagaId) ? 1 : 0) <= 1",
                "scope names at most one of tool, tag or sagaId (none means global)",
            )
        )
    }

    tool: ToolGlob | None = Field(default=None, description="A tool name or glob: wire.send, stripe.*")
    tag: Tag | None = Field(default=None, description="Sagas carrying this tag: eu")
    saga_id: SagaId | None = Field(default=None, description="One saga (Quarantine only).")


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
    scope: KillSwitchScope | None = Field(default=None, description="What it applies to; absent means global.")
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
        description="Halt, drain or quarantine agents fleet-wide (the kill switch).",
        columns=(
            PrinterColumn("Action", "string", ".spec.action"),
            PrinterColumn("Scope", "string", ".status.scope"),
            PrinterColumn("Engaged", "boolean", ".status.engaged"),
            PrinterColumn("Acked", "string", ".status.acked", "Agents applying it / agents it governs"),
            PrinterColumn("Expires", "date", ".status.expiresAt"),
            PrinterColumn("By", "string", ".spec.requestedBy", priority=1),
            PrinterColumn("Reason", "string", ".spec.reason", priority=1),
            *ready_columns(),
        ),
    )

    spec: KillSwitchSpec
    status: KillSwitchStatus | None = None
