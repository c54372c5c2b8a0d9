"""The pre-flight gate hook: the protocol the engine calls before any side effect.

The engine asks the gate about every step of a saga that has one, before the step's
intent is written and before the forward call, the only point at which refusal is free.
Rules, budgets, kill switches and human approvals all live behind this one call; the
approval flow happens inside ``decide``, so the engine only ever sees allowed or not.

Invariants:
- ``GateDecision.allowed`` is always a bool after construction and agrees with the
  verdict: ALLOW is allowed, BLOCK is not, REQUIRE_APPROVAL is allowed only if the gate
  says so explicitly (an approval that is not stated as granted is denied).
- A gate that raises, or returns anything but a ``GateDecision``, refuses the step
  (fail closed); the engine never treats a broken gate as a yes.
- ``consult`` writes GATE_VERDICT for every decision and STEP_REFUSED (with the call's
  ``policy_args``, as an intent holds them) for every refusal before raising ``GateBlocked`` (``SagaQuarantined`` when the decision says
  ``quarantined``: the saga is then frozen by its scope, not rolled back); with no gate, an IRREVERSIBLE step is refused (the
  engine does not start an effect it cannot undo without a control that can ask a human).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

from .errors import ConfigurationError, GateBlocked, SagaQuarantined
from .payloads import error_text, snapshot_mapping
from .records import RecordType
from .semantics import ActionSemantics

__all__ = ["Declaration", "Gate", "GateDecision", "StepRequest", "Verdict", "consult", "no_gate_fallback",
           "set_no_gate_fallback"]

Append = Callable[[str, str, "str | None", "dict[str, Any] | None"], int]

ENGINE = "agent_saga.engine"
NO_GATE_REASON = (
    "IRREVERSIBLE steps need a human on the hook and this saga has no gate: "
    "configure saga_scope(gate=...) with an approval provider"
)

Verdict = Literal["ALLOW", "REQUIRE_APPROVAL", "BLOCK"]
_VERDICTS = ("ALLOW", "REQUIRE_APPROVAL", "BLOCK")


@dataclass(frozen=True, slots=True)
class StepRequest:
    """What a gate is asked about: one step, before anything happened.

    ``policy_args`` is a read-only, JSON-safe snapshot of the arguments the caller chose
    to expose to policy (amounts, recipients); it is also what the intent record holds, so
    a gate must not mutate anything inside it. ``tags`` are the saga's tags.
    ``has_inverse``: the code gave the step a compensation (a reviewed policy's inverse
    is used only when it did not).
    """

    saga_id: str
    step_id: str
    tool: str
    semantics: ActionSemantics
    policy_args: Mapping[str, Any] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    has_inverse: bool = False


@dataclass(frozen=True, slots=True)
class GateDecision:
    """A gate's answer: the verdict, why, who decided, and whether the step may run.

    ``allowed`` defaults from the verdict (ALLOW -> True, BLOCK and REQUIRE_APPROVAL ->
    False); a gate whose approval was granted returns
    ``GateDecision("REQUIRE_APPROVAL", reason, decided_by="risk@corp", allowed=True)``.
    Raises ``ConfigurationError`` for an unknown verdict, or for ALLOW with
    ``allowed=False`` / BLOCK with ``allowed=True``.
    """

    verdict: Verdict
    reason: str = ""
    decided_by: str = ""
    allowed: bool | None = None

    def __post_init__(self) -> None:
        verdict = self.verdict.upper() if isinstance(self.verdict, str) else self.verdict
        if verdict not in _VERDICTS:
            raise ConfigurationError(
                f"GateDecision verdict {self.verdict!r} is not one of ALLOW, REQUIRE_APPROVAL, BLOCK"
            )
        object.__setattr__(self, "verdict", verdict)
        allowed = self.allowed
        if allowed is None:
            allowed = verdict == "ALLOW"
        elif not isinstance(allowed, bool):
            raise ConfigurationError(f"GateDecision.allowed must be a bool, got {allowed!r}")
        if (verdict == "ALLOW" and not allowed) or (verdict == "BLOCK" and allowed):
            raise ConfigurationError(
                f"GateDecision verdict {verdict} contradicts allowed={allowed}"
            )
        object.__setattr__(self, "allowed", allowed)

    @classmethod
    def allow(cls, reason: str = "", decided_by: str = "") -> GateDecision:
        """An ALLOW decision."""
        return cls("ALLOW", reason, decided_by, True)

    @classmethod
    def block(cls, reason: str, decided_by: str = "") -> GateDecision:
        """A BLOCK decision: the step is refused."""
        return cls("BLOCK", reason, decided_by, False)


@dataclass(frozen=True, slots=True)
class Declaration:
    """What a gate made of a step's declaration: a reviewed policy can make it stricter,
    never looser. ``semantics`` is the class the step is gated as; ``compensate`` is the
    inverse the policy names (a factory over the forward result), used only when the code
    gave none. A decision carries it as ``decision.declaration``; the engine applies it
    (``Saga.execute``) and ignores anything that would loosen the code's declaration."""

    semantics: ActionSemantics
    compensate: Callable[[Any], Any] | None = None


@runtime_checkable
class Gate(Protocol):
    """A pre-flight control consulted before every step of a saga that has one.

    ``decide`` must return a ``GateDecision``; it may wait (for a human approval, with its
    own deadline). Guarantee the engine gives in return: if ``decide`` raises or returns
    something else, the step is refused with ``GateBlocked``, never run.
    """

    async def decide(self, request: StepRequest) -> GateDecision:
        """Decide whether the step described by ``request`` may run."""
        ...


#: The module that registers the fallback when imported (the controls' ``kill_switch_gate``):
#: named, not imported, because the controls sit above this module; the first saga without
#: a gate imports it, so ``import agent_saga`` does not load the controls.
_CONTROLS_FALLBACK = "agent_saga.controls.gate._nogate"


def _load_controls_fallback() -> Gate | None:
    importlib.import_module(_CONTROLS_FALLBACK)  # registers its fallback, replacing this one
    registered = _fallback
    if registered is None or registered is _load_controls_fallback:
        return None
    return registered()


_fallback: Callable[[], Gate | None] | None = _load_controls_fallback


def set_no_gate_fallback(factory: Callable[[], Gate | None] | None) -> None:
    """Register what a saga opened without a gate is gated by (the controls register the
    process-wide kill switch here: a fleet-wide halt stops a saga that has no gate)."""
    global _fallback
    _fallback = factory


def no_gate_fallback() -> Gate | None:
    """The gate of a saga opened without one: ``None`` unless a kill switch is configured
    for this process (then a gate that consults it, and refuses IRREVERSIBLE as no gate
    would)."""
    return _fallback() if _fallback is not None else None


async def consult(gate: Gate | None, request: StepRequest, append: Append) -> GateDecision:
    """Ask ``gate`` about ``request``, record the verdict, raise ``GateBlocked`` if refused.

    With ``gate`` None only an IRREVERSIBLE step is asked about, and it is refused.
    A gate that raises or returns something other than a ``GateDecision`` refuses the
    step (the gate's error is chained). Returns the decision only if the step may run.
    """
    saga_id, step_id, tool = request.saga_id, request.step_id, request.tool
    base: dict[str, Any] = {"tool": tool, "semantics": request.semantics.value}
    if gate is None:
        append(
            RecordType.STEP_REFUSED.value, saga_id, step_id,
            {**base, "reason": NO_GATE_REASON, "decided_by": ENGINE, "policy_args": dict(request.policy_args)},
        )
        raise GateBlocked(
            f"step {step_id} ({tool}) refused: {NO_GATE_REASON}; nothing was executed",
            reason=NO_GATE_REASON, decided_by=ENGINE, saga_id=saga_id, step_id=step_id, tool=tool,
        )
    failure: Exception | None = None
    try:
        decision = await gate.decide(request)
        if not isinstance(decision, GateDecision):
            raise ConfigurationError(
                f"{type(gate).__name__}.decide() returned {type(decision).__name__}, not a GateDecision"
            )
    except Exception as exc:  # noqa: BLE001 - a broken gate refuses (fail closed)
        failure = exc
        decision = GateDecision.block(
            f"the gate failed, so the step is refused: {error_text(exc)}", type(gate).__name__
        )
    verdict = {
        **base,
        "verdict": decision.verdict,
        "allowed": decision.allowed,
        "reason": decision.reason,
        "decided_by": decision.decided_by,
    }
    fields = getattr(decision, "wal_fields", None)
    if callable(fields):  # a gate's own detail (which limit, which approver), plain JSON
        try:
            detail = snapshot_mapping(fields(), "gate verdict detail")
        except Exception as exc:  # noqa: BLE001 - the verdict stands; say the detail was unusable
            detail = {"detail_error": error_text(exc)}
        verdict.update({k: v for k, v in detail.items() if k not in verdict})
    append(RecordType.GATE_VERDICT.value, saga_id, step_id, verdict)
    if decision.allowed:
        return decision
    # The refused call's policy arguments: the step wrote no intent, and a replay of the
    # log under another policy needs them (the engine checked them as it does an intent's).
    append(RecordType.STEP_REFUSED.value, saga_id, step_id, {**verdict, "policy_args": dict(request.policy_args)})
    by = f", decided by {decision.decided_by}" if decision.decided_by else ""
    stage = verdict.get("stage")
    if getattr(decision, "quarantined", False) is True:
        lever = verdict.get("detail", {}).get("lever") if isinstance(verdict.get("detail"), dict) else None
        raise SagaQuarantined(
            f"step {step_id} ({tool}) refused: {decision.reason or 'the saga is quarantined'}",
            lever=lever, reason=decision.reason, decided_by=decision.decided_by,
            control=stage if isinstance(stage, str) else "", saga_id=saga_id, step_id=step_id, tool=tool,
        )
    reason = decision.reason or "no reason given"
    # Said once: a control's own reason (the kill switch, the breaker) may already say it.
    tail = "" if "nothing was executed" in reason else "; nothing was executed"
    raise GateBlocked(
        f"step {step_id} ({tool}) refused by the gate ({decision.verdict}{by}): {reason}{tail}",
        reason=decision.reason, decided_by=decision.decided_by,
        control=stage if isinstance(stage, str) else "",
        saga_id=saga_id, step_id=step_id, tool=tool,
    ) from failure
