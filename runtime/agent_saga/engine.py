"""The saga engine: ``Saga.execute``, the durable step protocol.

    async with saga_scope(wal, gate, name="onboard") as saga:
        box = await saga.execute("aws.run_instances", ActionSemantics.COMPENSABLE,
                                 forward=lambda: ec2.run_instances(...),
                                 compensate=lambda r: Compensation(handler=..., kwargs=...))

One step, in order (records in capitals; "durable" = ``await wal.barrier``):

1. Misuse is refused before anything happens (``ConfigurationError``): a COMPENSABLE
   step without ``compensate`` (an effect with no inverse cannot be undone), an
   IRREVERSIBLE step with one, policy arguments that are not JSON or hold a secret.
2. The gate, if the saga has one, decides (GATE_VERDICT); a refusal writes STEP_REFUSED
   and raises ``GateBlocked``. With no gate, an IRREVERSIBLE step is always refused: the
   engine does not start an effect it cannot undo without a control that can ask a human.
   A saga opened without a gate asks ``no_gate_fallback()`` again before each step, so a
   lever engaged on the zero-setup kill switch mid-saga stops its next step.
3. STEP_INTENT (durable for COMPENSABLE / IRREVERSIBLE) before the forward call.
4. The forward call, retried inside the step under its ``RetryPolicy`` (STEP_RETRY per
   failed attempt), then ``fallback_action`` (STEP_FALLBACK). Same step id and
   idempotency key for every attempt.
5. Outcome: STEP_COMMITTED with the compensation descriptor (durable before ``execute``
   returns), or STEP_FAILED (it did not complete; the error propagates), or STEP_UNKNOWN
   when the step timed out or was interrupted (it may have happened; ``timeout`` raises
   ``StepOutcomeUnknown``).

Every step takes this one path, written once in ``execute``. REVERSIBLE steps write the
same records but never wait for the disk; the intent of one given no timeout, retry or
fallback names no idempotency key.

Leaving the ``saga_scope`` (``agent_saga.scope``) completes the saga or rolls it back
(``agent_saga.rollback``); user code is called through ``agent_saga.invoke``.

Boundary hooks (what tentative resources, semantic locks and snapshots stand on,
``agent_saga.isolation``): ``on_commit(fn)`` runs ``await fn()`` once every step has
settled and before SAGA_COMPLETED is written (in registration order; one that raises
rolls the saga back instead); ``on_exit(fn)`` runs ``fn(saga)`` (sync or async) after
the saga is resolved however it left its scope (completed, rolled back, partial,
quarantined, cancelled), newest first, each once.

Invariants:
- Nothing user-supplied reaches the WAL without a caller-side JSON snapshot and secret
  check (the WAL encodes on its own thread, too late to tell the caller).
- A REVERSIBLE step with an async forward and no gate, timeout, retry or fallback creates
  no task, inspects no signature and formats no log line.
- The engine reaches the log through ``BaseWAL.append`` and ``BaseWAL.fence`` only.
- A gate with an ``on_outcome(request, ok, error)`` method hears how each step it
  allowed ended (the circuit breaker's feedback); the hook never breaks a step.
- Telemetry (``agent_saga.observe``) hears each step's start, end and refusal; with no
  observer installed that costs one global read per step.
- A sync forward runs on the bounded tool executor, never on the event loop, and keeps
  running in its thread after a timeout (Python cannot stop a thread); the step is then
  UNKNOWN, which is exactly what it is.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Mapping
from types import MappingProxyType
from typing import Any, Final, TypeVar, overload

from . import observe as _observe
from .clocks import Clock
from .compensation import Compensation
from .context import step_id_var
from .errors import ConfigurationError, GateBlocked, SagaError, StepOutcomeUnknown, WALError
from .executor import ToolExecutor
from .gates import Declaration, Gate, StepRequest, consult, no_gate_fallback
from .idempotency import (
    FORWARD_SCOPE,
    IDEMPOTENCY_KWARG,
    callable_info,
    forward_key,
    idempotency_key,
    key_prefix,
)
from .invoke import PLAIN, Expired, call_with_retries, derive
from .payloads import describe_error, error_text, snapshot_mapping
from .records import ExtensionType, RecordType
from .retry import NO_RETRY, RetryPolicy
from .rollback import RollbackEntry, RollbackReport, roll_back
from .semantics import ActionSemantics, coerce_semantics
from .wal.base import BaseWAL

__all__ = ["Saga"]

T = TypeVar("T")

_REV: Final = ActionSemantics.REVERSIBLE
_COMP: Final = ActionSemantics.COMPENSABLE
_IRR: Final = ActionSemantics.IRREVERSIBLE

_INTENT: Final = RecordType.STEP_INTENT.value
_COMMITTED: Final = RecordType.STEP_COMMITTED.value
_FAILED: Final = RecordType.STEP_FAILED.value
_UNKNOWN: Final = RecordType.STEP_UNKNOWN.value

_NO_KWARGS: Final[Mapping[str, Any]] = {}

_RUNNING, _CLOSING, _COMPLETED, _ROLLED_BACK, _PARTIAL, _QUARANTINED = (
    "RUNNING", "CLOSING", "COMPLETED", "ROLLED_BACK", "ROLLBACK_PARTIAL", "QUARANTINED"
)

#: The record a quarantined saga ends with: it was frozen, not rolled back (not terminal:
#: the saga stays unresolved, and the recovery daemon skips it, until a human decides).
#: Same name as ``agent_saga.recovery.recordtypes.SAGA_QUARANTINED``.
SAGA_QUARANTINED: Final = ExtensionType.SAGA_QUARANTINED.value

CompensationFactory = Callable[[Any], "Compensation | Mapping[str, Any] | None"]


_RANK: Final = {_REV: 0, _COMP: 1, _IRR: 2}


def _tightened(
    sem: ActionSemantics, compensate: CompensationFactory | None, declared: Declaration
) -> tuple[ActionSemantics, CompensationFactory | None]:
    """How a step runs once a reviewed policy tightened its declaration (never looser).

    Stricter semantics win; the code's inverse, when it has one, is the one that runs (a
    step gated as IRREVERSIBLE but undoable by the code's compensation keeps that undo,
    and runs with COMPENSABLE durability); otherwise the policy's inverse is used."""
    if _RANK[declared.semantics] <= _RANK[sem]:
        return sem, compensate
    if compensate is not None:
        return _COMP, compensate
    if declared.semantics is _COMP and declared.compensate is not None:
        return _COMP, declared.compensate
    return _IRR, None


class Saga:
    """One running saga: call ``execute`` for each side effect. Made by ``saga_scope``.

    Attributes: ``saga_id``, ``name``, ``tags``, ``wal``, ``gate``, ``status``
    (RUNNING, COMPLETED, ROLLED_BACK, ROLLBACK_PARTIAL, QUARANTINED) and
    ``rollback_report`` (set once a rollback ran).
    """

    __slots__ = (
        "__weakref__", "_append", "_clock", "_commit_hooks", "_done", "_executor", "_exit_hooks", "_fence", "_inflight",
        "_key_prefix", "_next", "_on_outcome", "_settled", "_state", "gate", "name", "rollback_report", "saga_id", "tags", "wal",
    )

    def __init__(
        self,
        saga_id: str,
        name: str | None,
        tags: tuple[str, ...],
        wal: BaseWAL,
        gate: Gate | None,
        clock: Clock,
        executor: ToolExecutor,
    ) -> None:
        self.saga_id = saga_id
        self.name = name
        self.tags = tags
        self.wal = wal
        self.rollback_report: RollbackReport | None = None
        self._append: Callable[..., int] = wal.append
        # What a step awaits for durability: the WAL's fence (``BaseWAL.fence``), None once
        # the record is durable; no coroutine of its own on a batching WAL.
        self._fence: Callable[[int], Awaitable[None] | None] = wal.fence
        # What each step's forward idempotency key starts with (``forward_key``).
        self._key_prefix = key_prefix(saga_id) if saga_id.__class__ is str else None
        self._clock = clock
        self._executor = executor
        # A step joins as (step_id, tool, semantics, compensation) or a RollbackEntry: see _entries.
        self._done: list[RollbackEntry | tuple[Any, ...]] = []
        self._next = 0
        self._inflight = 0
        self._settled: asyncio.Future[None] | None = None
        self._state = _RUNNING
        self._commit_hooks: list[Callable[[], Awaitable[None]]] = []
        self._exit_hooks: list[Callable[[Saga], Any]] = []
        self._on_outcome: Callable[[StepRequest, bool, BaseException | None], None] | None = None
        self._use_gate(gate)

    def _use_gate(self, gate: Gate | None) -> None:
        """Adopt ``gate`` (at open, or mid-saga once the zero-setup switch has a lever): the
        steps ask it, and its ``on_outcome`` hears how each step it allowed ended."""
        self.gate = gate
        hook = getattr(gate, "on_outcome", None)
        self._on_outcome = hook if callable(hook) else None

    @property
    def status(self) -> str:
        """RUNNING, COMPLETED, ROLLED_BACK, ROLLBACK_PARTIAL or QUARANTINED."""
        return _RUNNING if self._state == _CLOSING else self._state

    def __repr__(self) -> str:
        return f"<Saga {self.saga_id} {self.status} steps={self._next}>"

    # ------------------------------------------------------------------ boundary hooks

    def on_commit(self, fn: Callable[[], Awaitable[None]]) -> None:
        """Run ``await fn()`` at the commit point: after every step settled, before the
        durable SAGA_COMPLETED. If it raises, the saga rolls back instead (the error
        leaves the scope). Raises ``ConfigurationError`` unless the saga is running."""
        self._hook(fn, "on_commit")
        self._commit_hooks.append(fn)

    def on_exit(self, fn: Callable[[Saga], Any]) -> None:
        """Run ``fn(saga)`` (awaited if it returns an awaitable) once the saga is resolved,
        on every exit path: completed, rolled back (clean or partial), quarantined or
        cancelled. Hooks run newest first; one that raises is logged and the others still
        run. Raises ``ConfigurationError`` unless the saga is running."""
        self._hook(fn, "on_exit")
        self._exit_hooks.append(fn)

    def _hook(self, fn: object, what: str) -> None:
        if not callable(fn):
            raise ConfigurationError(f"{what} takes a callable, got {fn!r}", saga_id=self.saga_id)
        if self._state is not _RUNNING:
            raise ConfigurationError(
                f"saga {self.saga_id} is {self.status.lower().replace('_', ' ')}: {what} hooks can only be "
                f"added while it runs", saga_id=self.saga_id,
            )

    async def _run_exit_hooks(self) -> None:
        hooks, self._exit_hooks = self._exit_hooks, []
        for fn in reversed(hooks):
            try:
                out = fn(self)
                if inspect.isawaitable(out):
                    await out
            except Exception as exc:  # noqa: BLE001 - one hook never stops the others
                import logging

                logging.getLogger("agent_saga.engine").error(
                    "saga %s: an on_exit hook failed (%s: %s)", self.saga_id, type(exc).__name__, exc
                )

    # ------------------------------------------------------------------ execute

    @overload
    async def execute(
        self,
        tool: str,
        semantics: ActionSemantics | str,
        forward: Callable[..., Awaitable[T]],
        compensate: CompensationFactory | None = None,
        *,
        timeout: float | None = None,
        policy_args: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        fallback_action: Callable[..., Any] | None = None,
    ) -> T: ...

    @overload
    async def execute(
        self,
        tool: str,
        semantics: ActionSemantics | str,
        forward: Callable[..., T],
        compensate: CompensationFactory | None = None,
        *,
        timeout: float | None = None,
        policy_args: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        fallback_action: Callable[..., Any] | None = None,
    ) -> T: ...

    async def execute(
        self,
        tool: str,
        semantics: ActionSemantics | str,
        forward: Callable[..., Any],
        compensate: CompensationFactory | None = None,
        *,
        timeout: float | None = None,
        policy_args: Mapping[str, Any] | None = None,
        retry: RetryPolicy | None = None,
        fallback_action: Callable[..., Any] | None = None,
    ) -> Any:
        """Run one side effect as a saga step and return the forward call's result.

        Args:
            tool: the tool's stable name (``"stripe.charge"``), used by gates and the log.
            semantics: REVERSIBLE, COMPENSABLE or IRREVERSIBLE (member or name).
            forward: the call, sync or async (a sync callable that returns an awaitable
                counts as async). Receives ``idempotency_key=`` if it accepts it.
            compensate: a factory over the forward result returning a ``Compensation``,
                the dict form ``{"handler", "kwargs"}``, or (REVERSIBLE only) ``None`` for
                nothing to undo. Required for COMPENSABLE, refused for IRREVERSIBLE.
                Called with ``None`` on rollback if the outcome is unknown.
            timeout: seconds per attempt; when it expires the step is UNKNOWN.
            policy_args: JSON arguments shown to the gate and written in the intent.
            retry: a ``RetryPolicy``; attempts share the step id and idempotency key.
            fallback_action: called (like ``forward``) once retries are exhausted for an
                error the policy covers; its result becomes the step's result.

        Guarantees: the gate decided before any record of intent; for a non-REVERSIBLE
        step the intent is durable before ``forward`` runs and the compensation descriptor
        is durable before this returns.

        Raises: ``ConfigurationError`` (misuse, nothing happened; ``NotSerializable`` /
        ``SecretDetected`` for policy_args), ``GateBlocked`` (refused, nothing happened),
        whatever ``forward`` raised (STEP_FAILED: it did not complete),
        ``StepOutcomeUnknown`` (timed out: it may have happened), ``CompensationError``
        or ``NotSerializable`` / ``SecretDetected`` for the compensation (the effect
        happened and stays in the rollback set), ``WALError`` if the log failed.
        """
        if self._state is not _RUNNING:
            raise self._closed_error(tool)
        sem = semantics if semantics.__class__ is ActionSemantics else coerce_semantics(semantics)
        if not isinstance(tool, str) or not tool:
            raise ConfigurationError(
                f"tool must be a non-empty string naming the tool (e.g. 'stripe.charge'), got {tool!r}",
                saga_id=self.saga_id,
            )
        if not callable(forward):
            raise ConfigurationError(f"forward of {tool!r} must be callable, got {forward!r}", saga_id=self.saga_id, tool=tool)
        if compensate is None:
            if sem is not _REV:
                self._check_declaration(tool, sem, compensate)
        elif sem is _IRR or not callable(compensate):  # else nothing _check_declaration refuses
            self._check_declaration(tool, sem, compensate)
        if policy_args is not None:
            policy_args = snapshot_mapping(policy_args, "policy_args")
        options = timeout is not None or retry is not None or fallback_action is not None
        if options:
            self._check_options(tool, timeout, retry, fallback_action)

        index = self._next
        self._next = index + 1
        step_id = f"{self.saga_id}/{index}"
        request: StepRequest | None = None
        if self.gate is None:  # an idle zero-setup kill switch gates nothing until a lever lands
            self._use_gate(no_gate_fallback())
        if self.gate is not None or sem is _IRR:
            try:
                request, declared = await self._check_gate(step_id, tool, sem, policy_args, compensate is not None)
            except GateBlocked as refused:
                if _observe.current is not None:
                    _observe.safely(_observe.current.step_refused, self.saga_id, step_id, tool, sem.value,
                                    refused.control or "gate", refused)
                raise
            if declared is not None:
                sem, compensate = _tightened(sem, compensate, declared)

        token = step_id_var.set(step_id)
        self._inflight += 1
        obs = _observe.current
        seen = None if obs is None else _observe.safely(obs.step_started, self.saga_id, step_id, tool, sem.value)
        try:
            # The step: the one path every step takes. REVERSIBLE steps write the same
            # records as the others but wait for no fence.
            saga_id = self.saga_id
            append = self._append
            durable = sem is not _REV
            # One attempt with no deadline: the tool is called here, not by call_with_retries.
            single = not options or (retry is NO_RETRY and timeout is None and fallback_action is None)
            if durable or options:
                prefix = self._key_prefix
                key = (
                    forward_key(prefix, step_id) if prefix is not None
                    else idempotency_key(saga_id, step_id, FORWARD_SCOPE)
                )
                seq = append(_INTENT, saga_id, step_id, {
                    "tool": tool, "semantics": sem.value, "policy_args": policy_args, "idempotency_key": key,
                })
            else:
                # A REVERSIBLE step given no timeout, retry or fallback: its intent names no
                # key (one is drawn only for a tool that takes it).
                key = None
                seq = append(_INTENT, saga_id, step_id, {"tool": tool, "semantics": "REVERSIBLE", "policy_args": policy_args})
            if durable:
                try:
                    waiter = self._fence(seq)
                    if waiter is not None:
                        await waiter
                except BaseException as exc:
                    # The forward was never called: say so rather than leave a bare intent.
                    self._failed(step_id, tool, exc, started=False)
                    raise
            try:
                if single:
                    # What call_with_retries does for one attempt, without its frames: an
                    # async tool awaited here, a sync one sent on one executor hop.
                    info = callable_info(forward)
                    if info.is_async:
                        if info.accepts_key:
                            result = await forward(
                                idempotency_key=key or idempotency_key(saga_id, step_id, FORWARD_SCOPE)
                            )
                        else:
                            result = await forward()
                    else:
                        result = await self._executor.submit(forward, {
                            IDEMPOTENCY_KWARG: key or idempotency_key(saga_id, step_id, FORWARD_SCOPE)
                        } if info.accepts_key else _NO_KWARGS)
                        if result.__class__ not in PLAIN and inspect.isawaitable(result):
                            result = await result
                    retried: tuple[int, bool] | None = None
                else:
                    assert key is not None
                    result, attempts, used_fallback = await call_with_retries(
                        forward, key, self._executor, timeout, retry or NO_RETRY, fallback_action, self._clock,
                        self._noter(step_id, tool),
                    )
                    retried = (attempts, used_fallback)
            except Expired as exc:
                unknown_seq = self._unknown(step_id, tool, sem, compensate, exc, timeout=timeout)
                if durable and unknown_seq is not None:
                    waiter = self._fence(unknown_seq)
                    if waiter is not None:
                        await waiter
                raise StepOutcomeUnknown(
                    f"step {step_id} ({tool}) did not finish within timeout={timeout}s: it may have "
                    f"happened, so it is recorded STEP_UNKNOWN and will be compensated from "
                    f"compensate(None) or escalated on rollback, never assumed not to have happened",
                    saga_id=saga_id, step_id=step_id, tool=tool,
                ) from exc.__cause__
            except Exception as exc:
                failed_seq = self._failed(step_id, tool, exc)
                if durable and failed_seq is not None:
                    await self._failed_fence(step_id, exc, failed_seq)
                raise
            except BaseException as exc:  # cancelled in the tool: it may have happened
                self._unknown(step_id, tool, sem, compensate, exc)
                raise
            # STEP_COMMITTED with the compensation descriptor. The step joins the rollback
            # set first: if the append fails, the effect still gets undone.
            if compensate is None:
                committed: dict[str, Any] = {"compensation": None}
                error: SagaError | None = None
                self._done.append((step_id, tool, sem, None))  # nothing to undo: see _entries
            else:
                comp, descriptor, error = derive(compensate, result, sem, tool)
                committed = {"compensation": descriptor}
                if error is None:
                    self._done.append((step_id, tool, sem, comp))  # see _entries
                else:
                    self._done.append(self._compensation_error(committed, error, step_id, tool, sem, comp))
            if retried is not None:  # called by call_with_retries: say how
                if retried[0] > 1:
                    committed["attempts"] = retried[0]
                if retried[1]:
                    committed["fallback"] = True
            seq = append(_COMMITTED, saga_id, step_id, committed)
            if durable:
                waiter = self._fence(seq)
                if waiter is not None:
                    await waiter
            if error is not None:
                raise error
        except Exception as exc:
            if request is not None and self._on_outcome is not None:
                self._report(request, exc)
            if obs is not None:
                unknown = isinstance(exc, StepOutcomeUnknown)
                _observe.safely(obs.step_ended, seen, _observe.STEP_UNKNOWN if unknown else _observe.STEP_FAILED, exc)
            raise
        except BaseException as exc:  # cancelled mid-step: it may have happened
            if obs is not None:
                _observe.safely(obs.step_ended, seen, _observe.STEP_UNKNOWN, exc)
            raise
        else:
            if request is not None and self._on_outcome is not None:
                self._report(request, None)
            if obs is not None:
                _observe.safely(obs.step_ended, seen, _observe.STEP_COMMITTED, None)
            return result
        finally:
            self._inflight -= 1
            if not self._inflight and self._settled is not None and not self._settled.done():
                self._settled.set_result(None)
            step_id_var.reset(token)

    async def _failed_fence(self, step_id: str, exc: BaseException, seq: int) -> None:
        """Wait for a durable step's STEP_FAILED; a log error is noted on ``exc``, not raised."""
        try:
            waiter = self._fence(seq)
            if waiter is not None:
                await waiter
        except WALError as werr:
            exc.add_note(f"agent-saga: the STEP_FAILED record of {step_id} is not durable: {werr}")

    def _noter(self, step_id: str, tool: str) -> Callable[[str, dict[str, Any]], None]:
        """What ``call_with_retries`` writes STEP_RETRY and STEP_FALLBACK with."""
        append, saga_id = self._append, self.saga_id

        def note(type_: str, payload: dict[str, Any]) -> None:
            append(type_, saga_id, step_id, {"tool": tool, **payload})

        return note

    def _compensation_error(
        self,
        committed: dict[str, Any],
        error: SagaError,
        step_id: str,
        tool: str,
        sem: ActionSemantics,
        comp: Compensation | None,
    ) -> RollbackEntry | tuple[Any, ...]:
        """Describe ``error`` (the compensation could not be derived, or not replayed) in
        the STEP_COMMITTED payload ``committed``; return the step's rollback entry."""
        error.saga_id, error.step_id, error.tool = self.saga_id, step_id, tool
        committed["compensation_error"] = {**describe_error(error), "in_process": comp is not None}
        if comp is not None:  # runnable here, not replayable by another process
            return (step_id, tool, sem, comp)
        return RollbackEntry(step_id, tool, sem, None, f"no usable compensation: {error_text(error)}")

    def _failed(self, step_id: str, tool: str, exc: BaseException, *, started: bool = True) -> int | None:
        """Record that the step did not complete (STEP_FAILED); never masks ``exc``."""
        payload: dict[str, Any] = {"tool": tool, **describe_error(exc)}
        if not started:
            payload["started"] = False
        try:
            return self._append(_FAILED, self.saga_id, step_id, payload)
        except WALError as werr:
            exc.add_note(f"agent-saga: the STEP_FAILED record of {step_id} was not written: {werr}")
            return None

    def _unknown(
        self,
        step_id: str,
        tool: str,
        sem: ActionSemantics,
        compensate: CompensationFactory | None,
        exc: BaseException,
        *,
        timeout: float | None = None,
    ) -> int | None:
        """Record that the step may have happened; it joins the rollback set as unknown."""
        self._done.append(RollbackEntry(step_id, tool, sem, None, unknown=True, factory=compensate))
        payload: dict[str, Any] = {"tool": tool, **describe_error(exc)}
        if timeout is not None:
            payload["timeout"] = timeout
        try:
            return self._append(_UNKNOWN, self.saga_id, step_id, payload)
        except WALError as werr:
            exc.add_note(f"agent-saga: the STEP_UNKNOWN record of {step_id} was not written: {werr}")
            return None

    # ------------------------------------------------------------------ checks

    def _check_declaration(
        self, tool: str, sem: ActionSemantics, compensate: CompensationFactory | None
    ) -> None:
        if compensate is not None and not callable(compensate):
            raise ConfigurationError(
                f"compensate of {tool!r} must be a factory over the forward result "
                f"(lambda r: Compensation(...)), got {compensate!r}",
                saga_id=self.saga_id, tool=tool,
            )
        if sem is _COMP and compensate is None:
            raise ConfigurationError(
                f"{tool!r} is declared COMPENSABLE but has no compensate=: an effect without an "
                f"inverse cannot be undone. Pass compensate=lambda r: Compensation(...), or "
                f"declare it IRREVERSIBLE (gated) if no inverse exists",
                saga_id=self.saga_id, tool=tool,
            )
        if sem is _IRR and compensate is not None:
            raise ConfigurationError(
                f"{tool!r} is declared IRREVERSIBLE but has a compensate=: if an inverse exists, "
                f"declare it COMPENSABLE; IRREVERSIBLE means no automated undo exists",
                saga_id=self.saga_id, tool=tool,
            )

    def _check_options(
        self,
        tool: str,
        timeout: float | None,
        retry: RetryPolicy | None,
        fallback: Callable[..., Any] | None,
    ) -> None:
        if timeout is not None and (
            isinstance(timeout, bool) or not isinstance(timeout, int | float) or not 0 < timeout < float("inf")
        ):
            raise ConfigurationError(
                f"timeout of {tool!r} must be a positive number of seconds, got {timeout!r}",
                saga_id=self.saga_id, tool=tool,
            )
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigurationError(
                f"retry of {tool!r} must be a RetryPolicy(...), got {retry!r}", saga_id=self.saga_id, tool=tool
            )
        if fallback is not None and not callable(fallback):
            raise ConfigurationError(
                f"fallback_action of {tool!r} must be callable, got {fallback!r}", saga_id=self.saga_id, tool=tool
            )

    async def _check_gate(
        self, step_id: str, tool: str, sem: ActionSemantics, policy_args: dict[str, Any] | None,
        has_inverse: bool = False,
    ) -> tuple[StepRequest, Declaration | None]:
        # Read-only view: the same dict is in the intent record the flusher thread encodes.
        args = MappingProxyType(policy_args if policy_args is not None else {})
        request = StepRequest(self.saga_id, step_id, tool, sem, args, self.tags, has_inverse)
        decision = await consult(self.gate, request, self._append)
        declared = getattr(decision, "declaration", None)
        return request, declared if isinstance(declared, Declaration) else None

    def _report(self, request: StepRequest, error: Exception | None) -> None:
        """Tell the gate how a step it allowed ended; a failing hook never breaks the step."""
        assert self._on_outcome is not None
        try:
            self._on_outcome(request, error is None, error)
        except Exception as exc:  # noqa: BLE001 - feedback is advisory
            import logging

            logging.getLogger("agent_saga.engine").warning(
                "the gate's on_outcome hook failed for %s (%s: %s)", request.step_id, type(exc).__name__, exc
            )

    def _closed_error(self, tool: object) -> ConfigurationError:
        return ConfigurationError(
            f"saga {self.saga_id} is {self.status.lower().replace('_', ' ')} and accepts no "
            f"more steps (tool {tool!r} was not run): start a new saga_scope()",
            saga_id=self.saga_id,
        )

    # ------------------------------------------------------------------ exit

    def _entries(self) -> list[RollbackEntry]:
        """The rollback set as ``RollbackEntry``s, oldest first. A step that committed
        with a usable compensation (or nothing to undo) joins as the tuple
        (step_id, tool, semantics, compensation), the same entry as
        ``RollbackEntry(step_id, tool, semantics, compensation)``."""
        return [e if isinstance(e, RollbackEntry) else RollbackEntry(e[0], e[1], e[2], e[3]) for e in self._done]

    async def _settle(self) -> None:
        """Wait for steps still running in other tasks (e.g. under gather) to finish."""
        while self._inflight:
            self._settled = asyncio.get_running_loop().create_future()
            await self._settled

    async def _complete(self) -> None:
        self._state = _CLOSING
        await self._settle()
        hooks, self._commit_hooks = self._commit_hooks, []
        for fn in hooks:
            await fn()
        self._state = _COMPLETED
        seq = self._append(RecordType.SAGA_COMPLETED.value, self.saga_id, None, {"steps": self._next})
        waiter = self._fence(seq)
        if waiter is not None:
            await waiter

    async def _freeze(self, lever: Mapping[str, Any] | None, cause: BaseException | None) -> None:
        """Stop a quarantined saga WITHOUT rolling it back: wait for sibling steps, then
        write a durable SAGA_QUARANTINED listing the steps left standing for a human."""
        self._state = _CLOSING
        try:
            await self._settle()
        finally:
            self._state = _QUARANTINED
        standing = [
            {"step": e.step_id, "tool": e.tool, "semantics": e.semantics.value, "unknown": e.unknown}
            for e in self._entries()
        ]
        doc = dict(lever) if lever else {}
        # reason/by as the recovery daemon reads them (agent_saga.recovery.quarantine)
        payload: dict[str, Any] = {
            "reason": doc.get("reason") or "quarantined", "by": doc.get("requestedBy") or doc.get("by") or "",
            "lever": doc or None, "standing": standing, "steps": self._next,
        }
        if cause is not None:
            payload["cause"] = describe_error(cause)
        seq = self._append(SAGA_QUARANTINED, self.saga_id, None, payload)
        waiter = self._fence(seq)
        if waiter is not None:
            await waiter

    async def _rollback(self, cause: BaseException) -> tuple[RollbackReport, bool]:
        """Roll back in a task shielded from cancellation; returns (report, cancelled)."""
        self._state = _CLOSING

        async def run() -> RollbackReport:
            await self._settle()
            return await roll_back(self.saga_id, self.wal, self._executor, self._entries(), cause)

        task = asyncio.ensure_future(run())
        cancelled = False
        while True:
            try:
                report = await asyncio.shield(task)
                break
            except asyncio.CancelledError:
                if task.done():
                    raise
                cancelled = True  # finish undoing first; the cancellation is honoured after
        self.rollback_report = report
        self._state = _ROLLED_BACK if report.clean else _PARTIAL
        return report, cancelled
