"""``AgentLoop``: drive a model toward a goal through the Router, and always say why it stopped.

    loop = AgentLoop(router, tools=[LoopTool("tickets.close", close, "COMPENSABLE", reopen)],
                     deadline=120, token_budget=20_000, max_steps=12)
    result = await loop.run("Close every duplicate of ticket 4711")
    result.stop, result.detail, result.answer, result.rollback

One run is one saga. Each step asks the router (with the ContextBroker's served context,
when the loop has one) and then runs the tool calls the model made, each as a saga step
with the tool's semantics and compensation. The run stops at the first of:

    DONE          the model answered without asking for a tool: the goal is done
    DEADLINE      ``deadline`` seconds passed (checked before every model and tool call;
                  the router's call is bounded by what is left)
    TOKEN_BUDGET  the tokens the hosts reported (``usage``) reached ``token_budget``, or
                  what is left cannot pay for the next prompt (checked before calling)
    STEP_BUDGET   ``max_steps`` model calls were made without an answer
    STALLED       the model asked for the same action (tool and arguments)
                  ``stall_repeats`` times in a row: the last one is not run
    NO_PROGRESS   ``no_progress_steps`` steps in a row produced no tool result not seen before
    REFUSED       the router refused (no host can serve the call) or refused the model's
                  action after its one repair
    FAILED        a tool's outcome is unknown (it timed out), it happened but its inverse
                  could not be derived, or the context or the router raised

Invariants:
- Every stop writes a durable ``LOOP_STOPPED`` record in the run's saga (reason, detail,
  steps, tokens, seconds) before anything is undone; every model step writes a
  ``LOOP_STEP`` (the host, the routing decision's id, the served context's id, the usage
  and the actions asked for, arguments as digests). A cancelled run writes one too
  (``CANCELLED``) and then re-raises.
- Only DONE completes the saga. Any other stop is an unfinished goal: the saga is rolled
  back, so every side effect the tools caused is undone LIFO (or escalated, exactly as
  the engine does), and ``result.rollback`` is the report. After a crash the recovery
  daemon does the same from the WAL.
- A tool that raises (including a call the engine refuses as misuse, such as arguments
  that hold a secret), or that the gate refuses, did not happen: the model is told so (a
  ``tool`` message) and may try something else; the repeated-action and no-progress
  rules stop it from trying the same thing forever.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from ..clocks import SYSTEM_CLOCK, Clock
from ..credentials import redact_secrets
from ..engine import Saga
from ..errors import (
    CompensationError,
    ConfigurationError,
    GateBlocked,
    RollbackIncomplete,
    SagaError,
    StepOutcomeUnknown,
    WALError,
)
from ..gates import Gate
from ..records import ExtensionType
from ..rollback import RollbackReport
from ..routing import (
    Message,
    ModelActionRefused,
    ModelRequest,
    ModelResponse,
    RoutingRefused,
    ToolCall,
)
from ..scope import saga_scope
from ..wal.base import BaseWAL
from ._tools import LoopTool, result_text

__all__ = ["LOOP_STEP", "LOOP_STOPPED", "AgentLoop", "LoopResult", "StopReason"]

LOOP_STEP = ExtensionType.LOOP_STEP.value
LOOP_STOPPED = ExtensionType.LOOP_STOPPED.value


class StopReason(enum.StrEnum):
    """Why a run stopped (see the module doc)."""

    DONE = "DONE"
    DEADLINE = "DEADLINE"
    TOKEN_BUDGET = "TOKEN_BUDGET"
    STEP_BUDGET = "STEP_BUDGET"
    STALLED = "STALLED"
    NO_PROGRESS = "NO_PROGRESS"
    REFUSED = "REFUSED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"


@dataclass(frozen=True, slots=True)
class LoopResult:
    """How a run ended: ``stop`` and ``detail`` (why), ``answer`` (DONE only), the model
    steps taken, the tokens used, the saga, and the rollback report of an unfinished goal."""

    stop: StopReason
    detail: str
    answer: str | None
    steps: int
    tokens: int
    saga_id: str
    rollback: RollbackReport | None = None
    decisions: tuple[str, ...] = ()

    @property
    def done(self) -> bool:
        """True if the goal was reached (and its side effects stand)."""
        return self.stop is StopReason.DONE


class _Unfinished(Exception):
    """Raised inside the saga so that leaving it rolls the goal's side effects back."""

    def __init__(self, stop: StopReason, detail: str) -> None:
        super().__init__(f"the goal is unfinished: {stop.value}: {detail}")
        self.stop = stop
        self.detail = detail


@dataclass(slots=True)
class _Run:
    steps: int = 0
    tokens: int = 0
    last_action: str | None = None
    repeats: int = 0
    idle: int = 0
    seen: set[str] = field(default_factory=set)
    decisions: list[str] = field(default_factory=list)


def _positive(name: str, value: object, kind: type | tuple[type, ...] = (int, float)) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, kind) or value <= 0):  # type: ignore[operator]
        raise ConfigurationError(f"AgentLoop {name} must be a positive number (or None for no limit), got {value!r}")


class AgentLoop:
    """A harness over a ``Router`` with a deadline, a token budget, a step budget and stall
    detection (see the module doc).

    Args:
        router: a ``Router`` (anything with ``complete(request, *, context=, timeout=)``
            returning a ``ModelResponse``).
        tools: the ``LoopTool`` list offered to the model.
        deadline: seconds of wall time for the whole run (``None``: no deadline).
        token_budget: the most tokens (prompt + completion, as the hosts report them) the
            run may use (``None``: no budget).
        max_steps: the most model calls (default 20).
        stall_repeats: the same action this many times in a row is a stall (default 3).
        no_progress_steps: this many steps in a row with no new tool result is no
            progress (default 5).
        max_tokens: the most one answer may use (bounded by what the budget has left).
        system: a system message put first.
        context: a ``ContextBroker``: served (re-verified, recorded) before every model call.
        wal, gate, lease_seconds, name: as for ``saga_scope``.
        clock: the time seam (tests pass a ``ManualClock``).

    Raises ``ConfigurationError`` for a bad argument, naming it.
    """

    def __init__(
        self,
        router: Any,
        *,
        tools: Iterable[LoopTool] = (),
        deadline: float | None = None,
        token_budget: int | None = None,
        max_steps: int = 20,
        stall_repeats: int = 3,
        no_progress_steps: int = 5,
        max_tokens: int | None = None,
        system: str | None = None,
        context: Any = None,
        wal: BaseWAL | None = None,
        gate: Gate | None = None,
        lease_seconds: float | None = None,
        name: str = "agent-loop",
        clock: Clock | None = None,
    ) -> None:
        if not callable(getattr(router, "complete", None)):
            raise ConfigurationError(f"AgentLoop router must be a Router (with complete(request)), got {router!r}")
        self.tools = {t.name: t for t in tools}
        for t in self.tools.values():
            if not isinstance(t, LoopTool):
                raise ConfigurationError(f"AgentLoop tools must be LoopTool(...) objects, got {t!r}")
        _positive("deadline", deadline)
        for label, value in (("token_budget", token_budget), ("max_steps", max_steps), ("stall_repeats", stall_repeats),
                             ("no_progress_steps", no_progress_steps), ("max_tokens", max_tokens)):
            _positive(label, value, int)
        if max_steps is None or stall_repeats is None or no_progress_steps is None:
            raise ConfigurationError("AgentLoop max_steps, stall_repeats and no_progress_steps must be positive integers")
        if context is not None and not callable(getattr(context, "serve", None)):
            raise ConfigurationError(f"AgentLoop context must be a ContextBroker (with serve()), got {context!r}")
        self.router = router
        self.deadline = deadline
        self.token_budget = token_budget
        self.max_steps = max_steps
        self.stall_repeats = stall_repeats
        self.no_progress_steps = no_progress_steps
        self.max_tokens = max_tokens
        self.system = system
        self.context = context
        self.wal = wal
        self.gate = gate
        self.lease_seconds = lease_seconds
        self.name = name
        self.clock = clock or SYSTEM_CLOCK

    async def run(self, goal: str, *, saga_id: str | None = None) -> LoopResult:
        """Work toward ``goal`` until a stop (see the module doc) and return how it ended.

        Returns a ``LoopResult`` for every stop, DONE or not; an unfinished goal's side
        effects are rolled back first (``result.rollback``). Raises only what leaves a
        saga anyway: ``GateBlocked`` when the saga is refused at its start (a kill-switch
        drain), a cancellation (after the rollback), or a failed log.
        """
        if not isinstance(goal, str) or not goal.strip():
            raise ConfigurationError("AgentLoop.run needs a non-empty goal")
        run = _Run()
        started = self.clock.monotonic()
        scope = saga_scope(self.wal, self.gate, self.name, saga_id=saga_id, lease_seconds=self.lease_seconds)
        saga: Saga | None = None
        try:
            async with scope as saga:
                try:
                    stop, detail, answer = await self._drive(saga, goal, run, started)
                except asyncio.CancelledError:
                    self._stopped(saga, run, started, StopReason.CANCELLED, "the run was cancelled")
                    raise
                except WALError:
                    raise  # the log itself failed: nothing more can be recorded
                except Exception as exc:  # noqa: BLE001 - a broken context, router or hook: a stop like any other
                    stop, detail, answer = StopReason.FAILED, f"{type(exc).__name__}: {exc}", None
                await saga.wal.barrier(self._stopped(saga, run, started, stop, detail))
                if stop is not StopReason.DONE:
                    raise _Unfinished(stop, detail)
        except _Unfinished as unfinished:
            assert saga is not None
            return self._result(unfinished.stop, unfinished.detail, None, run, saga, saga.rollback_report)
        except RollbackIncomplete as partial:
            if not isinstance(partial.__cause__, _Unfinished) or saga is None:
                raise
            return self._result(partial.__cause__.stop, partial.__cause__.detail, None, run, saga, partial.report)
        assert saga is not None
        return self._result(StopReason.DONE, detail, answer, run, saga, None)

    def _result(self, stop: StopReason, detail: str, answer: str | None, run: _Run, saga: Saga,
                report: RollbackReport | None) -> LoopResult:
        return LoopResult(stop, detail, answer, run.steps, run.tokens, saga.saga_id, report, tuple(run.decisions))

    # ------------------------------------------------------------------ the loop

    async def _drive(self, saga: Saga, goal: str, run: _Run, started: float) -> tuple[StopReason, str, str | None]:
        conversation: list[Message] = [Message("system", self.system)] if self.system else []
        conversation.append(Message("user", goal))
        specs = tuple(t.spec() for t in self.tools.values())
        while True:
            if run.steps >= self.max_steps:
                return StopReason.STEP_BUDGET, f"{run.steps} model steps without reaching the goal (max_steps={self.max_steps})", None
            left = self._time_left(started)
            if left is not None and left <= 0:
                return StopReason.DEADLINE, f"the deadline of {self.deadline}s passed before step {run.steps + 1}", None
            served = self.context.serve() if self.context is not None else None
            prefix: tuple[Message, ...] = tuple(served.messages) if served is not None else ()
            request = ModelRequest(prefix + tuple(conversation), tools=specs, max_tokens=self.max_tokens)
            if self.token_budget is not None:
                remaining = self.token_budget - run.tokens
                prompt = request.prompt_tokens()
                if remaining <= prompt:
                    return StopReason.TOKEN_BUDGET, (
                        f"{run.tokens} of {self.token_budget} tokens used; the next prompt needs ~{prompt}: not called"
                    ), None
                cap = remaining - prompt if self.max_tokens is None else min(self.max_tokens, remaining - prompt)
                request = ModelRequest(request.messages, request.tools, max_tokens=cap)
            try:
                response: ModelResponse = await asyncio.to_thread(
                    self.router.complete, request, context=served, timeout=left
                )
            except (RoutingRefused, ModelActionRefused) as exc:
                return StopReason.REFUSED, redact_secrets(exc.message), None
            except SagaError as exc:
                return StopReason.FAILED, f"the router failed: {redact_secrets(exc.message)}", None
            run.steps += 1
            run.tokens += response.usage.total_tokens
            run.decisions.append(response.decision.id)
            self._step(saga, run, response, served)
            if not response.tool_calls:
                return StopReason.DONE, f"answered after {run.steps} step(s)", response.content
            if self.token_budget is not None and run.tokens >= self.token_budget:
                return StopReason.TOKEN_BUDGET, (
                    f"{run.tokens} of {self.token_budget} tokens used by step {run.steps}: its "
                    f"{len(response.tool_calls)} tool call(s) were not run"
                ), None
            conversation.append(Message("assistant", response.content, response.tool_calls))
            progressed = False
            for call in response.tool_calls:
                action = _action(call)
                run.repeats = run.repeats + 1 if action == run.last_action else 1
                run.last_action = action
                if run.repeats >= self.stall_repeats:
                    return StopReason.STALLED, (
                        f"the model asked for {call.name}({_args_text(call)}) {run.repeats} times in a row; not run again"
                    ), None
                left = self._time_left(started)
                if left is not None and left <= 0:
                    return StopReason.DEADLINE, f"the deadline of {self.deadline}s passed before the call of {call.name}", None
                text, fatal = await self._call(saga, call)
                if fatal is not None:
                    return StopReason.FAILED, fatal, None
                digest = hashlib.sha256(f"{call.name}\0{text}".encode()).hexdigest()
                if digest not in run.seen:
                    run.seen.add(digest)
                    progressed = True
                conversation.append(Message("tool", text, tool_call_id=call.id, name=call.name))
            run.idle = 0 if progressed else run.idle + 1
            if run.idle >= self.no_progress_steps:
                return StopReason.NO_PROGRESS, (
                    f"{run.idle} step(s) in a row produced no tool result not seen before"
                ), None

    async def _call(self, saga: Saga, call: ToolCall) -> tuple[str, str | None]:
        """Run one tool call as a saga step: (what the model reads, a fatal reason or None)."""
        tool = self.tools.get(call.name)
        args = call.arguments
        if tool is None or args is None:
            return f"error: no tool {call.name!r} with those arguments; offered: {sorted(self.tools)}", None
        try:
            value = await saga.execute(
                tool.name, tool.semantics, functools.partial(tool.fn, **args), tool.compensate, policy_args=args,
            )
        except GateBlocked as exc:
            return f"refused: {redact_secrets(exc.message)}", None
        except (StepOutcomeUnknown, WALError, CompensationError) as exc:
            # it may have happened, the log failed, or it happened with no usable inverse
            return "", f"{tool.name}: {type(exc).__name__}: {redact_secrets(exc.message)}"
        except Exception as exc:  # noqa: BLE001 - the call failed: it did not happen; the model is told
            return f"error: {type(exc).__name__}: {redact_secrets(str(exc))}", None
        return result_text(value), None

    def _time_left(self, started: float) -> float | None:
        if self.deadline is None:
            return None
        return self.deadline - (self.clock.monotonic() - started)

    # ------------------------------------------------------------------ records

    def _step(self, saga: Saga, run: _Run, response: ModelResponse, served: Any) -> None:
        saga.wal.append(LOOP_STEP, saga.saga_id, None, {
            "step": run.steps, "host": response.host, "model": response.model,
            "decision": response.decision.id, "context": getattr(served, "id", None),
            "usage": response.usage.to_doc(), "tokens_used": run.tokens,
            "actions": [{"tool": c.name, "arguments_sha256": hashlib.sha256(c.arguments_raw.encode()).hexdigest()}
                        for c in response.tool_calls],
            "repaired": response.repaired is not None,
        })

    def _stopped(self, saga: Saga, run: _Run, started: float, stop: StopReason, detail: str) -> int:
        return saga.wal.append(LOOP_STOPPED, saga.saga_id, None, {
            "reason": stop.value, "detail": redact_secrets(detail), "steps": run.steps, "tokens": run.tokens,
            "token_budget": self.token_budget, "max_steps": self.max_steps, "deadline": self.deadline,
            "seconds": round(self.clock.monotonic() - started, 3),
        })


def _action(call: ToolCall) -> str:
    args = call.arguments
    canonical = json.dumps(args, sort_keys=True) if args is not None else call.arguments_raw
    return f"{call.name}:{canonical}"


def _args_text(call: ToolCall) -> str:
    text = call.arguments_raw
    return text if len(text) <= 120 else text[:117] + "..."
