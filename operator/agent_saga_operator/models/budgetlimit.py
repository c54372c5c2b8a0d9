"""BudgetLimit: a spend budget or a call rate over a sliding window, fleet-wide.

The CRD form of the runtime's ``BudgetLimit`` / ``RateLimit`` (runtime/agent_saga/
controls/limits.py): ``kind: Budget`` bounds the sum of a policy argument (``arg``) to
``maxTotal`` per ``window``; ``kind: Rate`` bounds the number of calls to ``maxCalls``.
Agents enforce it through ``RedisLimitStore``; the operator projects the definition and
reads the window's use back into ``status``.

Rules the API server enforces: Budget needs ``arg`` and ``maxTotal`` (and takes no
``maxCalls``); Rate needs ``maxCalls`` (and takes neither ``arg``, ``maxTotal`` nor
``escalateToHuman``); ``maxTotal`` is positive; the window is a duration in d/h/m/s of at least one second.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from ._base import (
    DURATION_EXPECTED,
    DURATION_PATTERN,
    AgentsStatus,
    ArgName,
    BaseStatus,
    CRDModel,
    Explained,
    KindInfo,
    PrinterColumn,
    RefusalsStatus,
    Resource,
    ToolGlob,
    cel,
    ready_columns,
    validations,
)

LimitKindName = Literal["Budget", "Rate"]

#: A sliding window: a duration of at least one second (a non-zero digit: every unit is
#: at least a second).
Window = Annotated[str, StringConstraints(min_length=2, max_length=32, pattern=DURATION_PATTERN),
                   Explained(DURATION_PATTERN, DURATION_EXPECTED,
                             also=(cel("self.matches('[1-9]')", "window must be at least 1s (1d, 24h, 1h30m, 60s)"),))]


class LimitScope(CRDModel):
    """Which calls share one window. Empty: one window for every call (global)."""

    by_tool: bool = Field(default=False, description="One window per tool name.")
    by_args: list[ArgName] | None = Field(
        default=None,
        max_length=4,
        description="One window per value of each of these policy arguments (customer_id).",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class BudgetLimitSpec(CRDModel):
    """A limit's definition, exactly what the runtime's BudgetLimit / RateLimit take."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel("self.kind != 'Budget' || has(self.arg)",
                "a Budget sums a policy argument: set arg (amount)", field_path=".arg",
                reason="FieldValueRequired"),
            cel("self.kind != 'Budget' || has(self.maxTotal)",
                "a Budget needs maxTotal", field_path=".maxTotal", reason="FieldValueRequired"),
            cel("self.kind != 'Budget' || !has(self.maxCalls)",
                "maxCalls is for kind Rate; a Budget takes maxTotal", field_path=".maxCalls",
                reason="FieldValueForbidden"),
            cel("self.kind != 'Rate' || has(self.maxCalls)",
                "a Rate needs maxCalls", field_path=".maxCalls", reason="FieldValueRequired"),
            cel("self.kind != 'Rate' || (!has(self.arg) && !has(self.maxTotal))",
                "arg and maxTotal are for kind Budget; a Rate counts calls (maxCalls)",
                field_path=".maxTotal", reason="FieldValueForbidden"),
            cel("self.kind != 'Rate' || !self.escalateToHuman",
                "escalateToHuman is for kind Budget (an over-rate call is refused)",
                field_path=".escalateToHuman", reason="FieldValueForbidden"),
        )
    }

    kind: LimitKindName = Field(description="Budget: sum of arg per window. Rate: calls per window.")
    arg: ArgName | None = Field(default=None, description="The policy argument carrying the amount (Budget).")
    max_total: float | None = Field(
        default=None, gt=0, description="The most the window may sum to (Budget), e.g. 50000."
    )
    max_calls: int | None = Field(default=None, ge=1, description="The most calls per window (Rate).")
    window: Window = Field(
        description="The sliding window in whole d, h, m and s, largest first: 1d, 24h, 1h30m, 60s.",
    )
    scope: LimitScope | None = Field(default=None, description="Which calls share one window; absent: global.")
    tools: list[ToolGlob] | None = Field(
        default=None,
        min_length=1,
        max_length=32,
        description="Police only these tools (globs); absent: every call.",
    )
    escalate_to_human: bool = Field(
        default=False, description="Over budget asks a human (REQUIRE_APPROVAL) instead of refusing."
    )


class BudgetLimitStatus(BaseStatus):
    """The limit as agents enforce it, and its use read back from the limit store."""

    limit_name: str | None = Field(
        default=None, max_length=100, description="The limit's name in the store and in refusals (namespace.name)."
    )
    max: float | None = Field(default=None, description="maxTotal (Budget) or maxCalls (Rate).")
    window_seconds: float | None = Field(default=None, description="The window in seconds.")
    used: float | None = Field(default=None, description="Use of the fullest window now.")
    remaining: float | None = Field(default=None, description="What the fullest window still admits.")
    windows: int | None = Field(default=None, ge=0, description="Non-empty windows (scope keys) now.")
    usage_updated_at: datetime | None = Field(default=None, description="When used/remaining were read.")
    agents: AgentsStatus | None = Field(default=None, description="Which agents apply it (their heartbeats).")
    acked: str | None = Field(default=None, max_length=32, description="acknowledged/matched, e.g. 3/3.")
    refusals: RefusalsStatus | None = Field(
        default=None, description="What the agents report it made them refuse or hold for a human.")


class BudgetLimit(Resource):
    """A spend or rate limit enforced atomically across every agent sharing the store."""

    info: ClassVar[KindInfo] = KindInfo(
        kind="BudgetLimit",
        plural="budgetlimits",
        short_names=("bl", "budget"),
        description="Spend and rate limits over a sliding window, enforced fleet-wide.",
        columns=(
            PrinterColumn("Kind", "string", ".spec.kind"),
            PrinterColumn("Max", "number", ".status.max"),
            PrinterColumn("Used", "number", ".status.used"),
            PrinterColumn("Remaining", "number", ".status.remaining", "What the fullest window still admits"),
            PrinterColumn("Window", "string", ".spec.window"),
            PrinterColumn("Acked", "string", ".status.acked", "Agents applying it / agents it governs"),
            PrinterColumn("Refused", "integer", ".status.refusals.refused", "Calls refused because of it"),
            PrinterColumn("Held", "integer", ".status.refusals.heldForHuman", "Calls it sent to a human"),
            PrinterColumn("Arg", "string", ".spec.arg", priority=1),
            PrinterColumn("Escalate", "boolean", ".spec.escalateToHuman", priority=1),
            *ready_columns(),
        ),
    )

    spec: BudgetLimitSpec
    status: BudgetLimitStatus | None = None
