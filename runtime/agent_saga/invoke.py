"""Calling user code: the sync/async hop, the step deadline, retries, and compensation factories.

Invariants:
- An ``async def`` callable runs on the event loop; anything else runs on the bounded
  tool executor (``agent_saga.executor``), never on the loop and never on asyncio's
  default executor. If it returns an awaitable, that is awaited on the loop.
- ``idempotency_key=`` is injected only into callables that accept it (``callable_info``),
  and never overrides one the caller passed explicitly.
- ``Expired`` is raised only when the step's own deadline expired; a ``TimeoutError``
  raised by the tool itself propagates as the tool's failure.
- Retries happen inside one step with one key: attempts never change the key, and a
  deadline that expired is never retried (the attempt may have happened).
- ``derive`` never raises: a factory that fails or returns garbage after the effect
  happened is an error *value* the engine records before raising it.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .clocks import Clock
from .compensation import Compensation, coerce_compensation
from .errors import CompensationError, SagaError
from .executor import ToolExecutor
from .idempotency import IDEMPOTENCY_KWARG, callable_info
from .payloads import describe_error, error_text
from .records import RecordType
from .retry import RetryPolicy
from .semantics import ActionSemantics

__all__ = ["PLAIN", "Expired", "call", "call_with_retries", "derive"]

_NO_KWARGS: Mapping[str, Any] = {}

#: Result types that are never awaitable: a sync tool's usual return skips the
#: ``inspect.isawaitable`` check (an ABC ``isinstance``). Exact types only (a subclass
#: could define ``__await__``).
PLAIN: frozenset[type] = frozenset({dict, list, tuple, str, int, float, bool, bytes, type(None)})

STEP_RETRY = RecordType.STEP_RETRY.value  # an attempt failed and will be tried again
STEP_FALLBACK = RecordType.STEP_FALLBACK.value  # attempts exhausted: the fallback action runs

Note = Callable[[str, dict[str, Any]], None]


class Expired(Exception):
    """The step's own deadline expired: the call's outcome is unknown (internal)."""


async def call(
    fn: Callable[..., Any],
    kwargs: Mapping[str, Any],
    key: str | None,
    executor: ToolExecutor,
    timeout: float | None = None,
) -> Any:
    """Call ``fn(**kwargs)`` (+ ``idempotency_key=key`` if it accepts one) where it belongs.

    Raises whatever ``fn`` raises, or ``Expired`` when ``timeout`` seconds passed first.
    """
    info = callable_info(fn)
    if key is not None and info.accepts_key and IDEMPOTENCY_KWARG not in kwargs:
        kwargs = {**kwargs, IDEMPOTENCY_KWARG: key}
    if timeout is None:
        return await _dispatch(fn, kwargs, info.is_async, executor)
    deadline = asyncio.timeout(timeout)
    try:
        async with deadline:
            return await _dispatch(fn, kwargs, info.is_async, executor)
    except TimeoutError as exc:
        if deadline.expired():
            raise Expired(f"no result within timeout={timeout}s") from exc
        raise


async def _dispatch(
    fn: Callable[..., Any], kwargs: Mapping[str, Any], is_async: bool, executor: ToolExecutor
) -> Any:
    if is_async:
        return await fn(**kwargs)
    result = await executor.submit(fn, kwargs)
    if result.__class__ not in PLAIN and inspect.isawaitable(result):
        result = await result
    return result


async def call_with_retries(
    forward: Callable[..., Any],
    key: str,
    executor: ToolExecutor,
    timeout: float | None,
    policy: RetryPolicy,
    fallback: Callable[..., Any] | None,
    clock: Clock,
    note: Note,
) -> tuple[Any, int, bool]:
    """Run ``forward`` under ``policy``, then ``fallback``; return (result, attempts, fell back).

    ``note(type, payload)`` records STEP_RETRY before each back-off and STEP_FALLBACK
    before the fallback runs. Raises the last error when the policy does not cover it or
    there is no fallback, the fallback's own error, or ``Expired``.
    """
    attempt = 0
    while True:
        attempt += 1
        try:
            return await call(forward, _NO_KWARGS, key, executor, timeout), attempt, False
        except Expired:
            raise
        except Exception as exc:
            if not policy.covers(exc):
                raise
            if attempt < policy.max_attempts:
                delay = policy.delay(attempt)
                note(STEP_RETRY, {"attempt": attempt, "delay": delay, **describe_error(exc)})
                await clock.sleep(delay)
                continue
            if fallback is None:
                raise
            note(STEP_FALLBACK, {"attempts": attempt, **describe_error(exc)})
            return await call(fallback, _NO_KWARGS, key, executor, timeout), attempt, True


def derive(
    compensate: Callable[[Any], Any],
    result: Any,
    semantics: ActionSemantics,
    tool: str,
) -> tuple[Compensation | None, dict[str, Any] | None, SagaError | None]:
    """Build and check a step's compensation from its forward result.

    Returns (compensation to run in-process, its WAL descriptor, error):
    - a valid compensation: (comp, descriptor, None);
    - nothing to undo (REVERSIBLE factory returned None): (None, None, None);
    - not replayable (kwargs not JSON, or holding a secret): (comp, None, the error) -- it
      can still run here, but a recovery process could not replay it;
    - no usable compensation (factory raised, returned garbage, an awaitable, or None
      for a COMPENSABLE step): (None, None, CompensationError).
    """
    try:
        raw = compensate(result)
    except Exception as exc:  # noqa: BLE001 - the effect happened: escalate, don't hide it
        err = CompensationError(
            f"the compensation factory of {tool!r} raised {error_text(exc)}; the effect "
            f"happened and has no inverse, so a rollback will escalate it to a human",
            tool=tool,
        )
        err.__cause__ = exc
        return None, None, err
    if raw.__class__ is Compensation:  # the usual return: not awaitable, nothing to coerce
        try:
            return raw, raw.descriptor(), None
        except SagaError as exc:  # NotSerializable / SecretDetected: runnable here, not replayable
            return raw, None, exc
    if inspect.isawaitable(raw):
        if inspect.iscoroutine(raw):
            raw.close()  # never awaited on purpose: factories are synchronous
        return None, None, CompensationError(
            f"the compensation factory of {tool!r} returned an awaitable: factories are "
            f"synchronous (lambda r: Compensation(...)); do the async work in the handler",
            tool=tool,
        )
    try:
        comp = coerce_compensation(raw, tool)
    except CompensationError as exc:
        return None, None, exc
    if comp is None:
        if semantics is ActionSemantics.REVERSIBLE:
            return None, None, None
        return None, None, CompensationError(
            f"the compensation factory of {tool!r} returned None for a COMPENSABLE step: it "
            f"must return the inverse (a Compensation); the effect happened, so a rollback "
            f"will escalate it to a human",
            tool=tool,
        )
    try:
        return comp, comp.descriptor(), None
    except SagaError as exc:  # NotSerializable / SecretDetected: runnable here, not replayable
        return comp, None, exc
