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
#: A tool name or shell-style glob over tool names: ``wire.send``, ``stripe.*``,
#: ``stripe__create_charge``. Letters, digits, ``_ . - : /`` and the wildcards ``*``
#: and ``?``; no spaces, no brackets (character classes are not supported).
TOOL_GLOB_PATTERN = r"^[A-Za-z0-9_*?][A-Za-z0-9_.:/*?-]*$"
ToolGlob = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=TOOL_GLOB_PATTERN)]

#: An exact tool name (a SagaPolicy declares tools one by one, no wildcards).
TOOL_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9_.:/-]*$"
ToolName = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=TOOL_NAME_PATTERN)]

#: A saga tag (``eu``, ``team:payments``).
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:/-]*$"
Tag = Annotated[str, StringConstraints(min_length=1, max_length=63, pattern=TAG_PATTERN)]

#: A saga id as the runtime writes it (``saga-8f3c``, a UUID, ``checkout_402``).
SAGA_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]*$"
SagaId = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=SAGA_ID_PATTERN)]

#: A policy argument name (``amount``, ``customer_id``).
ARG_PATTERN = r"^[A-Za-z_][A-Za-z0-9_.-]*$"
ArgName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=ARG_PATTERN)]

#: A duration in Go's notation restricted to hours, minutes and seconds: ``24h``,
#: ``1h30m``, ``60s``.
DURATION_PATTERN = r"^([0-9]+h)?([0-9]+m)?([0-9]+s)?$"
Duration = Annotated[str, StringConstraints(min_length=2, max_length=32, pattern=DURATION_PATTERN)]

#: A person or system that answers for an action (``soc@corp``, ``ci@corp``).
Principal = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=r"^\S.*$")]

#: A human sentence (a reason, a note): at least one non-blank character.
Sentence = Annotated[str, StringConstraints(min_length=1, max_length=1024, pattern=r"^\s*\S[\s\S]*$")]

#: An agent name or glob over agent names (``AgentKit(name=...)``).
AgentGlob = Annotated[str, StringConstraints(min_length=1, max_length=253, pattern=TOOL_GLOB_PATTERN)]

#: A CamelCase condition reason, as cert-manager writes them.
REASON_PATTERN = r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"


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
    """One condition, as cert-manager writes them (a map keyed by ``type``)."""

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


# ---------------------------------------------------------------- CRD metadata
@dataclass(frozen=True, slots=True)
class PrinterColumn:
    """One ``additionalPrinterColumns`` entry (``priority=1`` shows only with ``-o wide``)."""

    name: str
    type: Literal["string", "integer", "number", "boolean", "date"]
    json_path: str
    description: str = ""
    priority: int = 0


def ready_columns() -> tuple[PrinterColumn, ...]:
    """Ready / Status / Age, as cert-manager prints them."""
    return (
        PrinterColumn("Ready", "string", '.status.conditions[?(@.type=="Ready")].status',
                      "Whether the policy is in force"),
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
