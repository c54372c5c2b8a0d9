"""SagaPolicy: which tools exist, what undoing each one means, and the gate's rules.

The CRD form of the policy schema the runtime defines (``agent_saga.controls.policy``,
also the MCP proxy's policy file): per tool its semantics, for a COMPENSABLE tool the
inverse (another tool, or a named handler) and where each of its arguments comes from
(the call: ``callArgs: {"repo_path": "$.repo_path"}``; a constant: ``values``; the
forward result: ``args: {"charge": "$.id"}``), and the policy arguments the gate and the
limits read (``{"amount": "$.amount"}``); plus gate rules and which agents it governs. A
file a security team can review, diff and sign off, now with ``kubectl diff``.

Rules the API server enforces: a COMPENSABLE tool declares its inverse; an IRREVERSIBLE
one cannot (no automated undo exists); an inverse is a tool or a handler; an inverse
argument comes from one place (no name in two of args, callArgs, values); tool names are
exact; each gate rule has exactly one condition; ``undeclaredTools`` defaults to Refuse.

This model and the runtime's parser accept and refuse the same documents
(tests/unit/test_policy_schema_agreement.py): field constraints are declared here for the
CRD, and the cross-field rules are the runtime's own (``parse_policy``, run after field
validation), so the operator never projects a policy the runtime would refuse.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from agent_saga.compensation import HANDLER_PATTERN
from agent_saga.controls.policy import JSON_PATH_PATTERN, PolicyError, parse_policy
from pydantic import BeforeValidator, Field, StringConstraints, WithJsonSchema, model_validator

from ._base import (
    TOOL_NAME_PATTERN,
    AgentGlob,
    AgentsStatus,
    ArgName,
    BaseStatus,
    CRDModel,
    Explained,
    KindInfo,
    PrinterColumn,
    RefusalsStatus,
    Resource,
    Sentence,
    Tag,
    ToolGlob,
    ToolName,
    cel,
    ready_columns,
    validations,
)


def _choice(*values: str) -> BeforeValidator:
    """Match a choice ignoring case and underscores, as the runtime's parser does
    (``enforce``, ``REQUIRE_APPROVAL``); the API server takes the listed spelling."""
    by_key = {v.lower(): v for v in values}

    def normalize(value: Any) -> Any:
        if isinstance(value, str):
            return by_key.get(value.replace("_", "").replace("-", "").strip().lower(), value)
        return value

    return BeforeValidator(normalize)


Semantics = Annotated[Literal["REVERSIBLE", "COMPENSABLE", "IRREVERSIBLE"],
                      _choice("REVERSIBLE", "COMPENSABLE", "IRREVERSIBLE")]
Verdict = Annotated[Literal["RequireApproval", "Block"], _choice("RequireApproval", "Block")]
Mode = Annotated[Literal["Enforce", "Observe"], _choice("Enforce", "Observe")]
Undeclared = Annotated[Literal["Refuse", "RequireApproval", "Allow"], _choice("Refuse", "RequireApproval", "Allow")]

#: Where an argument comes from: ``$.id`` (a path into the forward result, for an
#: inverse) or ``$.amount`` (into the call's arguments, for policy_args). The runtime's
#: JSONPath subset, as one pattern.
JsonPath = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=JSON_PATH_PATTERN),
                    Explained(JSON_PATH_PATTERN, "a path starting at $ with .name and [index] steps, "
                              "e.g. $.id or $.items[0].id (no filters, no wildcards)",
                              cel_pattern=r"^\$(\.[A-Za-z_][\w-]*|\[\d+\])*$")]
HandlerName = Annotated[str, StringConstraints(min_length=1, max_length=128, pattern=HANDLER_PATTERN.pattern),
                       Explained(HANDLER_PATTERN.pattern, "the name a handler is registered under with "
                                 "@compensator (letters, digits, . _ : / -), e.g. stripe.refund")]

#: A JSON value (a constant argument of an inverse), kept as written. Not null in an object
#: (`kubectl apply` reads a null field as "delete it"): the runtime's parser refuses it.
JsonValue = Annotated[Any, WithJsonSchema({"x-kubernetes-preserve-unknown-fields": True})]

RULE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:-]*$"
RuleName = Annotated[str, StringConstraints(min_length=1, max_length=100, pattern=RULE_NAME_PATTERN),
                    Explained(RULE_NAME_PATTERN, "a rule name of letters, digits and . _ : -, e.g. big-wires")]


def _one_source(first: str, second: str) -> dict[str, str]:
    """The CEL rule refusing an inverse argument named in both ``first`` and ``second``."""
    return cel(f"!has(self.{first}) || !has(self.{second}) || !self.{second}.exists(k, k in self.{first})",
               f"an inverse argument is named in both {first} and {second}: each comes from one place, the call "
               f"(callArgs), a constant (values) or the forward result (args); keep it in one of them",
               field_path=f".{second}")


class Inverse(CRDModel):
    """The inverse (a tool, or a named handler) and where each of its arguments comes
    from: the call (callArgs), a constant (values) or the forward result (args)."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel("has(self.tool) != has(self.handler)",
                "name exactly one inverse: tool (another tool of the same server) or handler "
                "(a function registered with @compensator)"),
            # values holds any JSON, which CEL cannot read: a name in values and in args or
            # callArgs is refused by the operator (Ready=False, Invalid), as by the runtime.
            _one_source("args", "callArgs"),
        )
    }

    tool: ToolName | None = Field(default=None, description="The inverse tool: stripe__create_refund.")
    handler: HandlerName | None = Field(
        default=None, description="Or a compensation handler registered with @compensator: stripe.refund.")
    args: dict[str, JsonPath] = Field(
        default_factory=dict,
        max_length=32,
        description='Argument name -> path into the forward result: {"charge": "$.id"}. A path the result does '
                    "not have leaves the step without an undo: a rollback escalates it to a human.",
    )
    call_args: dict[str, JsonPath] | None = Field(
        default=None,
        max_length=32,
        description='Argument name -> path into the call\'s arguments: {"repo_path": "$.repo_path"}. A call '
                    "without one of them is refused before it runs (its undo could not be built).",
    )
    values: dict[str, JsonValue] | None = Field(
        default=None,
        max_length=32,
        description='Argument name -> a constant JSON value: {"force": true}. Never a secret (it is written to '
                    "the log with the inverse). A name also in args or callArgs makes the policy Invalid.",
    )


class ToolPolicy(CRDModel):
    """One tool's declaration, as in the policy file's tools map."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel("self.semantics != 'COMPENSABLE' || has(self.compensate)",
                "a COMPENSABLE tool must declare its inverse (compensate.tool, and where its arguments come from: "
                "callArgs, values, args)",
                field_path=".compensate", reason="FieldValueRequired"),
            cel("self.semantics != 'IRREVERSIBLE' || !has(self.compensate)",
                "an IRREVERSIBLE tool has no automated undo: remove compensate, or classify it COMPENSABLE",
                field_path=".compensate", reason="FieldValueForbidden"),
        )
    }

    semantics: Semantics = Field(description="REVERSIBLE, COMPENSABLE or IRREVERSIBLE.")
    compensate: Inverse | None = Field(default=None, description="The inverse (COMPENSABLE tools).")
    policy_args: dict[str, JsonPath] | None = Field(
        default=None,
        max_length=32,
        description='Policy argument -> path into the call\'s arguments: {"amount": "$.amount"}.',
    )
    require_approval: bool = Field(
        default=False, strict=True, description="Every call needs a named human (IRREVERSIBLE tools always do)."
    )


class ArgExceeds(CRDModel):
    """Matches when the call's policy argument arg is above threshold."""

    arg: ArgName
    threshold: float = Field(strict=True, allow_inf_nan=False, description="Matches above this value.")


class GateRule(CRDModel):
    """A pre-flight rule: when its one condition matches, ask a human or refuse."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "(has(self.toolMatches) ? 1 : 0) + (has(self.tagged) ? 1 : 0) + (has(self.argExceeds) ? 1 : 0) == 1",
                "a rule has exactly one condition: toolMatches, tagged or argExceeds",
            )
        )
    }

    name: RuleName = Field(description="Names the rule in verdicts, the WAL and approval ids.")
    verdict: Verdict = Field(default="RequireApproval", description="RequireApproval or Block.")
    reason: Sentence | None = Field(default=None, description="The sentence a refused agent or an approver sees.")
    tool_matches: list[ToolGlob] | None = Field(default=None, min_length=1, max_length=32)
    tagged: Tag | None = None
    arg_exceeds: ArgExceeds | None = None


class AgentSelector(CRDModel):
    """Which agents (``AgentKit(name=...)``) a policy governs; absent: every agent."""

    agents: list[AgentGlob] = Field(min_length=1, max_length=64, description="Agent names or globs.")


class SagaPolicySpec(CRDModel):
    """The policy file's content: mode, tools, undeclared-tool handling, gate rules."""

    model_config = CRDModel.model_config | {
        "json_schema_extra": validations(
            cel(
                "!has(self.tools) || self.tools.all(t, t.matches('" + TOOL_NAME_PATTERN.replace("\\", "\\\\") + "') && size(t) <= 253)",
                "tool names are exact names from letters, digits and _ . - : / (no wildcards, no spaces)",
                field_path=".tools",
            ),
        )
    }

    mode: Mode = Field(
        default="Enforce", description="Enforce: gate and refuse. Observe: forward everything, record the surface."
    )
    undeclared_tools: Undeclared = Field(
        default="Refuse",
        description="A tool the policy does not declare: Refuse (the safe default), RequireApproval (a human "
                    "decides), or Allow (the code's own declaration stands; the MCP proxy, which has none, "
                    "treats it as IRREVERSIBLE).",
    )
    applies_to: AgentSelector | None = Field(default=None, description="Agents governed; absent: all in the namespace.")
    tools: dict[str, ToolPolicy] = Field(
        default_factory=dict, max_length=512, description="Tool name -> its declaration."
    )
    rules: list[GateRule] | None = Field(
        default=None,
        max_length=64,
        description="Gate rules, evaluated after limits, in order.",
        json_schema_extra={"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]},
    )

    @model_validator(mode="after")
    def _runtime_rules(self) -> SagaPolicySpec:
        """The runtime's cross-field rules (the CEL rules say the same to the API server)."""
        try:
            parse_policy(self.to_json_doc())
        except PolicyError as e:
            raise ValueError(str(e)) from None
        return self


class SagaPolicyStatus(BaseStatus):
    """How many tools and rules are in force."""

    tools: int | None = Field(default=None, ge=0, description="Declared tools.")
    rules: int | None = Field(default=None, ge=0, description="Gate rules.")
    agents: AgentsStatus | None = Field(default=None, description="Which agents enforce it (their heartbeats).")
    acked: str | None = Field(default=None, max_length=32, description="enforcing/matched, e.g. 3/3.")
    enforced_by: list[str] | None = Field(default=None, max_length=20, description="The agents enforcing it (agent@pod).")
    refusals: RefusalsStatus | None = Field(
        default=None, description="What the agents report it made them refuse or hold for a human.")


class SagaPolicy(Resource):
    """What each tool is, how it is undone, and which calls need a human."""

    info: ClassVar[KindInfo] = KindInfo(
        kind="SagaPolicy",
        plural="sagapolicies",
        short_names=("sp",),
        description="Per-tool semantics, inverses and gate rules (the MCP policy file as a resource).",
        columns=(
            PrinterColumn("Mode", "string", ".spec.mode"),
            PrinterColumn("Undeclared", "string", ".spec.undeclaredTools"),
            PrinterColumn("Tools", "integer", ".status.tools"),
            PrinterColumn("Rules", "integer", ".status.rules"),
            PrinterColumn("Acked", "string", ".status.acked", "Agents enforcing it / agents it governs"),
            PrinterColumn("Refused", "integer", ".status.refusals.refused", "Calls refused because of it"),
            PrinterColumn("Held", "integer", ".status.refusals.heldForHuman", "Calls it sent to a human"),
            *ready_columns(),
        ),
    )

    spec: SagaPolicySpec
    status: SagaPolicyStatus | None = None
