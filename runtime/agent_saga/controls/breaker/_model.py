"""The breaker's policy and what counts as a failure.

``BreakerPolicy`` says when a circuit opens and how long it stays open; ``by_tool_name``
and ``by_service`` map a tool to its circuit; ``counts_as_failure`` is the one place that
decides which outcomes say something about a dependency (docs/breaker.md: a refusal is not
a failure; a timeout is).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from ...errors import (
    CompensationError,
    ConfigurationError,
    SagaRefused,
    StepOutcomeUnknown,
    WALError,
)

__all__ = ["BreakerPolicy", "State", "by_service", "by_tool_name", "counts_as_failure"]

State = Literal["closed", "open", "half_open"]


def by_tool_name(tool: str) -> str:
    """One circuit per tool (the default)."""
    return tool


def by_service(tool: str) -> str:
    """One circuit per service: the tool name up to its first dot (``stripe.charge`` ->
    ``stripe``), so every call to a failing provider is stopped together."""
    return tool.split(".", 1)[0]


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a circuit opens and how long it stays open (seconds).

    Opens after ``failure_threshold`` consecutive failures, or when at least
    ``min_volume`` calls finished in the last ``window`` seconds and the share that
    failed is ``failure_rate`` or more. After ``cool_down`` one trial call passes.
    Raises ``ConfigurationError`` for values that cannot work.
    """

    failure_threshold: int = 5
    failure_rate: float = 0.5
    min_volume: int = 10
    window: float = 60.0
    cool_down: float = 30.0

    def __post_init__(self) -> None:
        def bad(what: str, value: object, need: str) -> ConfigurationError:
            return ConfigurationError(f"BreakerPolicy {what} must be {need}, got {value!r}")

        if isinstance(self.failure_threshold, bool) or not isinstance(self.failure_threshold, int) \
                or self.failure_threshold < 1:
            raise bad("failure_threshold", self.failure_threshold, "an integer >= 1")
        if not isinstance(self.failure_rate, int | float) or not 0 < self.failure_rate <= 1:
            raise bad("failure_rate", self.failure_rate, "in (0, 1]")
        if isinstance(self.min_volume, bool) or not isinstance(self.min_volume, int) or self.min_volume < 1:
            raise bad("min_volume", self.min_volume, "an integer >= 1")
        for name in ("window", "cool_down"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v < math.inf:
                raise bad(name, v, "a positive number of seconds")

    def to_doc(self) -> dict[str, Any]:
        return {"failure_threshold": self.failure_threshold, "failure_rate": self.failure_rate,
                "min_volume": self.min_volume, "window": self.window, "cool_down": self.cool_down}


def counts_as_failure(error: BaseException | None) -> bool | None:
    """True: the tool ran and failed; False: it ran and returned; None: the outcome says
    nothing about the dependency (a refusal, misuse, a WAL failure)."""
    if error is None:
        return False
    if isinstance(error, StepOutcomeUnknown):
        return True  # it did not answer in time: exactly what a breaker is for
    if isinstance(error, CompensationError | ConfigurationError):
        return False  # raised after the tool returned (its inverse could not be built)
    if isinstance(error, SagaRefused | WALError):
        return None
    return True
