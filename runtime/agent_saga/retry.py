"""Per-step retry policy: which failures are tried again, and after how long.

A retry happens *inside* one step: the step id, the idempotency key and any approval
id never change between attempts, so attempt 2 of a charge carries the same key as
attempt 1 and the payment network can recognise it.

Invariants:
- ``RetryPolicy`` is a frozen, validated value; a bad policy fails at construction.
- Never retried, whatever ``include`` says: refusals (``SagaRefused``), misuse
  (``ConfigurationError``), an outcome that is unknown (a timed-out attempt may have
  happened: it becomes STEP_UNKNOWN instead of being tried again), and anything that is
  not an ``Exception`` (cancellation, ``KeyboardInterrupt``).
- Delays are deterministic (no jitter): ``exponential`` = ``base_delay * 2**(n-1)``,
  ``linear`` = ``base_delay * n`` for the n-th failed attempt, capped at ``max_delay``.
- All sleeping goes through a ``Clock`` (``agent_saga.clocks``) so tests never sleep
  for real.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from .errors import ConfigurationError, SagaRefused, StepOutcomeUnknown

__all__ = ["RetryPolicy"]

_NEVER_RETRIED: tuple[type[BaseException], ...] = (
    SagaRefused,
    ConfigurationError,
    StepOutcomeUnknown,
)


def _exception_types(value: object, field: str) -> tuple[type[BaseException], ...]:
    items = value if isinstance(value, tuple | list) else (value,)
    for item in items:
        if not (isinstance(item, type) and issubclass(item, BaseException)):
            raise ConfigurationError(
                f"RetryPolicy.{field} must be exception classes (e.g. (TimeoutError, "
                f"ConnectionError)), got {item!r}"
            )
    return tuple(items)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often, and after which errors, a step's forward call is tried again.

    Args:
        max_attempts: total attempts including the first (>= 1).
        backoff: ``"exponential"`` or ``"linear"``.
        base_delay: seconds before the second attempt (>= 0).
        max_delay: the cap on any single delay (>= base_delay).
        include: exception classes that are retried (default: ``Exception``).
        exclude: exception classes that are never retried, even if included; such an error
            is final, and no ``fallback_action`` runs for it.

    Guarantee: every attempt of one step carries the same step id and idempotency key.
    Raises ``ConfigurationError`` at construction for an invalid value.
    """

    max_attempts: int = 3
    backoff: Literal["exponential", "linear"] = "exponential"
    base_delay: float = 0.1
    max_delay: float = 10.0
    include: tuple[type[BaseException], ...] = (Exception,)
    exclude: tuple[type[BaseException], ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ConfigurationError(
                f"RetryPolicy.max_attempts must be an int >= 1 (1 means no retry), got {self.max_attempts!r}"
            )
        if self.backoff not in ("exponential", "linear"):
            raise ConfigurationError(
                f"RetryPolicy.backoff must be 'exponential' or 'linear', got {self.backoff!r}"
            )
        for name in ("base_delay", "max_delay"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int | float) or not v >= 0 or v == float("inf"):
                raise ConfigurationError(f"RetryPolicy.{name} must be a finite number >= 0, got {v!r}")
        if self.max_delay < self.base_delay:
            raise ConfigurationError(
                f"RetryPolicy.max_delay ({self.max_delay}) must be >= base_delay ({self.base_delay})"
            )
        object.__setattr__(self, "include", _exception_types(self.include, "include"))
        object.__setattr__(self, "exclude", _exception_types(self.exclude, "exclude"))

    def delay(self, failed_attempt: int) -> float:
        """Seconds to wait after the ``failed_attempt``-th attempt failed (1-based)."""
        n = max(1, failed_attempt)
        if self.backoff == "linear":
            d = self.base_delay * n
        else:
            d = self.base_delay * (2.0 ** min(n - 1, 1000))
        return float(min(d, self.max_delay))

    def covers(self, exc: BaseException) -> bool:
        """True if ``exc`` is a failure this policy handles (retry, then fallback)."""
        return (
            isinstance(exc, Exception)
            and not isinstance(exc, _NEVER_RETRIED)
            and isinstance(exc, self.include)
            and not isinstance(exc, self.exclude)
        )


NO_RETRY = RetryPolicy(max_attempts=1)
