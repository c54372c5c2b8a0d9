"""What every agent-saga custom resource shares: naming, constrained strings, status.

The pydantic models in this package are the single source of the CRDs (``crdgen``
turns them into OpenAPI v3 structural schemas) and of the operator's reading of an
object's spec. Validation that the API server must enforce is declared here, never in
handlers: string patterns, enums and ranges become schema keywords, and cross-field or
immutability rules are CEL ``x-kubernetes-validations`` attached with ``cel()``.

Invariants:
- JSON field names are camelCase (the Kubernetes convention); Python names snake_case.
- Patterns are written in the common subset of RE2 (the API server) and Rust's regex
  (pydantic-core): no lookaround, no backreferences.
- Every string and list the CEL rules touch has a maximum size, so the API server's CEL
  cost estimate stays within budget.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints
from pydantic.alias_generators import to_camel

GROUP = "agentsaga.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

#: `kubectl get agentsaga` lists every kind of this group.
CATEGORY = "agentsaga"

# ---------------------------------------------------------------- constrained strings
@dataclass(frozen=True, slots=True)
class Explained:
    """A string pattern the API server checks with a CEL rule whose message says what is
    wrong and how to write it, instead of OpenAPI's bare ``should match '^...$'``.

    pydantic still validates the pattern (``StringConstraints``, which must come first in
    the ``Annotated``); the generated schema keeps min/max length (the CEL cost bound) and
    replaces ``pattern`` by a ``self.matches(...)`` rule with that message, which the API
    server prints after the field's path and value (``spec.scope.tool: Invalid value: ...``).
    """

    pattern: str
    #: What the value must be, and an example: "a tool name or glob such as wire.send".
    expected: str
    #: An equivalent, shorter RE2 pattern for the API server (its CEL cost grows with the
    #: pattern's length); default: ``pattern``.
    cel_pattern: str | None = None
    #: More rules on the same value (checked after the pattern).
    also: tuple[dict[str, str], ...] = ()

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        schema = dict(handler(core_schema))
        schema.pop("pattern", None)
        # The API server prints the path and the value before the message
        # (spec.scope.tool: Invalid value: "wire send": must be ...).
        rule = cel(f"self.matches({cel_str(self.cel_pattern or self.pattern)})", "must be " + self.expected)
        schema["x-kubernetes-validations"] = [*schema.get("x-kubernetes-validations", ()), rule, *self.also]
        return schema


def cel_str(text: str) -> str:
    """A CEL string literal of ``text`` (raw, so a regex's backslashes stay as written)."""
    quote = "'" if '"' in text else '"'
    if quote in text:
        raise ValueError(f"cannot quote {text!r} for CEL")
    return "r" + quote + text + quote


#: A tool name or shell-style glob over tool names: ``wire.send``, ``stripe.*``,
#: ``stripe__create_charge``. Letters, digits, ``_ . - : /`` and the wildcards ``*``
#: and ``?``; no spaces, no brackets (character classes are not supported).
TOOL_GLOB_PATTERN = r"^[A-Za-z0-9_*?][A-Za-z0-9_.:/*?-]*$"
ToolGlob = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=TOOL_GLOB_PATTERN),
          Explained(TOOL_GLOB_PATTERN, "a tool name or glob of letters, digits, _ . - : / and the wildcards * ? "
                       "(no spaces or brackets), e.g. wire.send or stripe.*")]

#: An exact tool name (a SagaPolicy declares tools one by one, no wildcards).
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$"
ToolName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=TOOL_NAME_PATTERN),
          Explained(TOOL_NAME_PATTERN, "an exact tool name of letters, digits and _ . - : / (no wildcards, no spaces), "
                       "e.g. stripe__create_refund")]

#: A saga tag (``eu``, ``team:payments``).
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"
Tag = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=TAG_PATTERN),
          Explained(TAG_PATTERN, "a tag of letters, digits and _ . : / -, starting with a letter or "
                  "digit, e.g. eu or team:payments")]

#: A saga id as the runtime writes it (``saga-8f3c``, a UUID, ``checkout_402``).
SAGA_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
SagaId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=SAGA_ID_PATTERN),
          Explained(SAGA_ID_PATTERN, "a saga id as agent-saga inspect prints it (letters, digits, "
                     "_ . : -), e.g. saga-8f3c")]

#: A policy argument name (``amount``, ``customer_id``).
ARG_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
ArgName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=ARG_PATTERN),
          Explained(ARG_PATTERN, "an argument name of letters, digits and _ . -, starting with a "
                      "letter or _, e.g. amount or customer_id")]

#: A duration: whole days, hours, minutes and seconds, largest first: ``1d``, ``24h``,
#: ``1h30m``, ``60s``. Milliseconds are not supported (windows are at least 1s).
DURATION_PATTERN = r"^([0-9]+d)?([0-9]+h)?([0-9]+m)?([0-9]+s)?$"
DURATION_UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
DURATION_EXPECTED = ("a duration in whole d, h, m and s, largest first, e.g. 1d, 24h, 1h30m or 60s "
                     "(ms is not supported)")
Duration = Annotated[str, StringConstraints(min_length=2, max_length=32, pattern=DURATION_PATTERN),
                     Explained(DURATION_PATTERN, DURATION_EXPECTED)]

#: A person or system that answers for an action (``soc@corp``, ``ci@corp``).
Principal = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^\S.*$"),
          Explained(r"^\S.*$", "who answers for it, starting with a non-blank character, "
                        "e.g. soc@corp")]

#: A human sentence (a reason, a note): at least one non-blank character.
Sentence = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^\s*\S[\s\S]*$"),
          Explained(r"^\s*\S[\s\S]*$", "a sentence saying why, not blank, "
                       "e.g. fraud pattern on wire.send")]

#: An agent name or glob over agent names (``AgentKit(name=...)``).
AgentGlob = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=TOOL_GLOB_PATTERN),
          Explained(TOOL_GLOB_PATTERN, "an agent name (AgentKit(name=...)) or a glob of them, "
                        "e.g. payments-agent or payments-*")]

#: A CamelCase condition reason, as cert-manager writes them.
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


def cel_explained(rule: str, message_expression: str, *, field_path: str | None = None,
                  reason: str | None = None) -> dict[str, str]:
    """A CEL rule whose message is a CEL expression (it can quote the offending value)."""
    out = cel(rule, "", field_path=field_path, reason=reason)
    del out["message"]
    out["messageExpression"] = message_expression
    return out


def cel(rule: str, message: str, *, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    """One ``x-kubernetes-validations`` entry (a CEL rule the API server evaluates).

    ``field_path`` (``.scope``) points the error at a field; ``reason`` is one of
    ``FieldValueInvalid`` (default), ``FieldValueForbidden``, ``FieldValueRequired``,
    ``FieldValueDuplicate``.
    """
    out = {"rule": rule, "message": message}
    if field_path is not None:
        out["fieldPath"] = field_path
    if reason is not None:
        out["reason"] = reason
    return out


def validations(*rules: dict[str, str]) -> dict[str, Any]:
    """``json_schema_extra`` for a model or field carrying CEL rules."""
    return {"x-kubernetes-validations": list(rules)}


def immutable(what: str) -> dict[str, Any]:
    """``json_schema_extra`` making a field immutable once set (a transition rule)."""
    return validations(cel("self == oldSelf", f"{what} is immutable"))


class CRDModel(BaseModel):
    """Base of every spec and status model: camelCase JSON, unknown fields refused."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
    )

    def to_json_doc(self) -> dict[str, Any]:
        """The object as Kubernetes stores it (camelCase, unset fields omitted)."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# ---------------------------------------------------------------- status
ConditionStatus = Literal["True", "False", "Unknown"]


class Condition(CRDModel):
    """One condition (the list is a map keyed by type)."""

    type: str = Field(max_length=64, pattern=r"^[A-Z][A-Za-z0-9]*$", description="Ready, Synced, Engaged, ...")
    status: ConditionStatus
    reason: str = Field(
        max_length=128, pattern=REASON_PATTERN, description="A CamelCase reason for the last transition."
    )
    message: str = Field(default="", max_length=4096, description="A human-readable sentence.")
    last_transition_time: datetime = Field(
        description="When status last changed (kept while the status stays the same)."
    )
    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation this condition was computed from."
    )


class BaseStatus(CRDModel):
    """The status every kind has: the generation last reconciled, and its conditions."""

    observed_generation: int | None = Field(
        default=None, ge=0, description="The .metadata.generation the operator last reconciled."
    )
    conditions: list[Condition] | None = Field(
        default=None,
        max_length=16,
        description="Ready (the policy is in force) and Synced (projected into the policy plane).",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["type"]},
    )
    revision: int | None = Field(
        default=None, ge=0, description="The policy-plane revision of the last projection that changed it."
    )


class AgentsStatus(CRDModel):
    """Which live agents a resource governs and which apply it (from their heartbeats)."""

    matched: int = Field(ge=0, description="Live agents it governs (they read its namespace).")
    acknowledged: int = Field(ge=0, description="Of those, the agents that apply this generation.")
    lagging: list[str] = Field(
        default_factory=list, max_length=21,
        description="The others (agent@pod), at most 20 named; '(no kill switch)' when it does not read that control.",
    )


class LastRefusal(CRDModel):
    """The latest call a BudgetLimit or SagaPolicy refused or held for a human."""

    outcome: Literal["Refused", "HeldForHuman"] = Field(description="Refused, or HeldForHuman (sent to a human).")
    tool: str = Field(max_length=253, description="The tool called.")
    saga: str = Field(max_length=253, description="The saga it was a step of.")
    by: str = Field(max_length=253, description="The limit or rule that decided (limit:<name>, rule:<policy>:<rule>).")
    agent: str = Field(max_length=253, description="The agent that refused it (agent@pod).")
    at: datetime = Field(description="When.")


class RefusalsStatus(CRDModel):
    """What the agents report this object made them refuse or hold for a human."""

    refused: int = Field(ge=0, description="Calls refused because of it, summed over the agents.")
    held_for_human: int = Field(ge=0, description="Calls it sent to a human (whatever the human answered).")
    last: LastRefusal | None = Field(default=None, description="The latest of them.")


# ---------------------------------------------------------------- CRD metadata
@dataclass(frozen=True, slots=True)
class PrinterColumn:
    """One ``additionalPrinterColumns`` entry (``priority=1`` shows only with ``-o wide``)."""

    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    description: str = ""
    priority: int = 0


#: What READY says on every kind agents apply (docs/crds.md, "READY, ACKED, Acknowledged").
READY_MEANS = "True: in force and applied by at least one agent it governs (ACKED: how many of them)"


def ready_columns(means: str = READY_MEANS) -> tuple[PrinterColumn, ...]:
    """Ready / Status / Age, as cert-manager prints them."""
    return (
        PrinterColumn("Ready", "string", '.status.conditions[?(@.type=="Ready")].status', means),
        PrinterColumn("Status", "string", '.status.conditions[?(@.type=="Ready")].message',
                      "Why (the Ready condition's message)", priority=1),
        PrinterColumn("Age", "date", ".metadata.creationTimestamp"),
    )


@dataclass(frozen=True, slots=True)
class KindInfo:
    """How a kind is named and printed: the CRD's ``names`` and printer columns."""

    kind: str
    plural: str
    short_names: tuple[str, ...]
    columns: tuple[PrinterColumn, ...]
    description: str
    categories: tuple[str, ...] = (CATEGORY,)
    root_rules: tuple[dict[str, str], ...] = field(default=())

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"


class Resource(CRDModel):
    """A kind's spec and status (the root model the CRD is generated from).

    Subclasses set ``info`` and annotate ``spec`` and ``status`` with their own models.
    """

    info: ClassVar[KindInfo]
