"""``PreCheck``: what the gate asks a control consulted before the limits, and its refusal.

The kill switch (stage ``kill_switch``) and the circuit breaker (stage ``breaker``)
derive from ``PreCheck``; the gate (``agent_saga.controls.gate``) consults them in stage
order. This module sits below all three, so neither control imports the gate and the gate
imports both (it finds the process-wide ones itself).

Every hook the gate may call is declared here as a no-op, so a check overrides only what
it needs and the gate calls each hook directly:

    check(request)                  the question (required): a refusal, or None
    admission(saga_id, tags)        may a saga start? (the kill switch's DRAIN)
    quarantine_of(saga_id)          the quarantine in force on a saga, or None
    on_outcome(request, ok, error)  a step this check let pass ran (the breaker learns)
    on_refused(request)             this check let a call pass and a later stage refused it
    recheck_after_approval          consult again after a human approved (the kill switch)

An object that is shaped like a check (``name``, ``stage``, ``check``) without deriving
from ``PreCheck`` is still accepted (``isinstance(obj, PreCheck)`` is structural): the
gate wraps it once, at construction, with ``as_precheck``, which takes the hooks the
object defines and the no-ops for the others.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from ..gates import StepRequest

__all__ = ["PRECHECK_ORDER", "CheckRefusal", "PreCheck", "PreCheckStage", "as_precheck"]

PreCheckStage = Literal["kill_switch", "breaker"]

#: The order in which the gate consults its pre-checks.
PRECHECK_ORDER: dict[str, int] = {"kill_switch": 0, "breaker": 1}


@dataclass(frozen=True, slots=True)
class CheckRefusal:
    """A pre-check's refusal with audit detail (plain JSON, merged into the verdict's
    ``detail``). ``detail["quarantined"] = True`` makes the engine raise
    ``SagaQuarantined``: the saga is frozen, not rolled back."""

    reason: str
    detail: Mapping[str, Any] = field(default_factory=dict)


class _Structural(abc.ABCMeta):
    """``isinstance(obj, PreCheck)`` is True for an object with ``name``, ``stage`` and an
    async ``check`` (the shape), as for a ``typing.Protocol``; subclasses check as usual."""

    def __instancecheck__(cls, instance: Any) -> bool:
        if cls.__name__ == "PreCheck" and cls.__module__ == __name__:
            return all(hasattr(instance, n) for n in ("name", "stage", "check"))
        return super().__instancecheck__(instance)


class PreCheck(metaclass=_Structural):
    """A control consulted before the limits: the kill switch or the circuit breaker.

    ``check`` returns a refusal (a reason, or a ``CheckRefusal`` with detail), or
    ``None`` to let the call continue. It owns its failure policy (the kill switch
    honours its last known state for a grace window; the breaker fails open); if it
    raises anyway, the gate refuses the call. The other hooks (see the module doc) are
    no-ops unless overridden.
    """

    #: Consulted again after a human approved, before the call runs (the kill switch).
    recheck_after_approval: ClassVar[bool] = False

    @property
    @abc.abstractmethod
    def name(self) -> str:
        """The check's name: ``decided_by`` in the verdicts it refuses."""

    @property
    @abc.abstractmethod
    def stage(self) -> PreCheckStage:
        """``kill_switch`` or ``breaker``: where the gate consults it."""

    @abc.abstractmethod
    async def check(self, request: StepRequest) -> str | CheckRefusal | None:
        """A refusal of ``request``, or ``None`` to let it continue."""

    async def admission(self, saga_id: str, tags: tuple[str, ...]) -> str | CheckRefusal | None:
        """A refusal to start the saga ``saga_id`` (tagged ``tags``), or ``None``."""
        return None

    def quarantine_of(self, saga_id: str) -> Any:
        """The quarantine in force on ``saga_id`` (anything with ``describe()``, or a
        mapping), or ``None``."""
        return None

    def on_outcome(self, request: StepRequest, ok: bool, error: BaseException | None) -> None:
        """A step this check let pass has run: ``ok`` False if it raised ``error``."""

    def on_refused(self, request: StepRequest) -> None:
        """This check let ``request`` pass and a later stage refused it."""


class _Shaped(PreCheck):
    """A check-shaped object that does not derive from ``PreCheck``: its own hooks where
    it has them, the no-ops elsewhere (looked up once)."""

    def __init__(self, obj: Any) -> None:
        self.wrapped = obj
        self.recheck_after_approval = getattr(obj, "recheck_after_approval", False) is True  # type: ignore[misc]
        for hook in ("admission", "quarantine_of", "on_outcome", "on_refused"):
            own = getattr(obj, hook, None)
            if callable(own):
                setattr(self, hook, own)

    @property
    def name(self) -> str:
        return str(self.wrapped.name)

    @property
    def stage(self) -> PreCheckStage:
        stage: PreCheckStage = self.wrapped.stage
        return stage

    async def check(self, request: StepRequest) -> str | CheckRefusal | None:
        result: str | CheckRefusal | None = await self.wrapped.check(request)
        return result


def as_precheck(obj: Any) -> PreCheck:
    """``obj`` if it derives from ``PreCheck``, else a ``PreCheck`` over its hooks."""
    if PreCheck in type(obj).__mro__:
        return obj  # type: ignore[no-any-return]
    return _Shaped(obj)
