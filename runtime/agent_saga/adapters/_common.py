"""What every framework adapter shares: the run (one saga), the step, the refusal text.

    step = SagaStep(forward, tool="zendesk_create_ticket", semantics=C, compensate=...)
    result = await run_in_saga(lambda: graph.ainvoke(state), framework="langgraph")

An adapter module (``agent_saga.adapters.<framework>``) only translates: it builds a
framework tool with the original's name, description and argument schema whose body
calls ``SagaStep.acall`` (or ``SagaStep.call`` from a worker thread), and turns a
``ToolRefused`` into the framework's own tool-error channel.

Invariants:
- A step is declared through ``AgentKit.safe_tool`` (checked when wrapped) and each call
  is exactly one ``Saga.execute`` of the run's saga: the same records, gate, compensation
  and LIFO rollback as everywhere else (no engine of its own).
- ``run_in_saga`` opens one ``AgentKit.transaction``: every wrapped tool the framework
  calls while it runs is a step of that saga; any exception leaving the run rolls back
  every step that ran, newest first.
- A refusal (``SagaRefused``: the kill switch, a limit, a rule, a denied approval) is
  not a failure: it raises ``ToolRefused`` for the adapter to hand to the model, and the
  run goes on so the model can react.
- A QUARANTINE (``SagaQuarantined``) is told to the model the same way, but every later
  step is refused and the run leaves its scope with it once the framework returns: the
  saga is frozen for a human (SAGA_QUARANTINED), never rolled back.
- Any other exception from a step (the tool raised, its outcome is unknown, the log
  failed) dooms the run even when the framework catches it and shows it to the model:
  every later step is refused, and when the framework's run returns, ``run_in_saga``
  raises that exception so the saga rolls back. A transaction with a failed step does
  not commit.
- Outside a run a wrapped tool is the original call, untouched (as ``AgentKit.safe_tool``
  outside a transaction): nothing is logged or gated.
- Importing this module imports no framework.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypedDict, TypeVar, Unpack, cast

from ..engine import CompensationFactory, Saga
from ..errors import ConfigurationError, SagaQuarantined, SagaRefused
from ..kit import AgentKit, _json_kwargs
from ..retry import RetryPolicy
from ..semantics import ActionSemantics, coerce_semantics

__all__ = [
    "RunOptions", "SagaStep", "StepOptions", "ToolRefused", "make_saga_run", "refusal_text", "require",
    "run_in_saga",
]

T = TypeVar("T")


class ToolRefused(Exception):
    """A step was refused before it ran; ``text`` is what the model is shown.

    Adapters catch it and hand ``text`` back through the framework's tool-error channel.
    ``cause`` is the control's ``SagaRefused`` (or ``None`` for a doomed run)."""

    def __init__(self, text: str, *, tool: str, cause: SagaRefused | None = None) -> None:
        super().__init__(text)
        self.text = text
        self.tool = tool
        self.cause = cause


class StepOptions(TypedDict, total=False):
    """What every ``wrap_tool`` takes besides the tool, ``semantics`` and ``compensate``.

    ``name``: the step's name for the gate and the log (default: the tool's name; the
    name the model sees never changes). ``timeout`` / ``retry`` / ``policy_args``: as
    ``AgentKit.safe_tool``. ``kit``: the ``AgentKit`` whose ``guarantees()`` list the
    tool (the gate is the run's)."""

    name: str | None
    timeout: float | None
    retry: RetryPolicy | None
    policy_args: Callable[..., Mapping[str, Any]] | None
    kit: AgentKit | None


class RunOptions(TypedDict, total=False):
    """What every ``saga_run`` takes besides the framework's own arguments.

    ``kit``: the WAL and the gate (default: ``AgentKit(name=<framework>)``, its gate from
    the environment); ``name`` / ``saga_id`` / ``tags``: as ``AgentKit.transaction``."""

    kit: AgentKit | None
    name: str | None
    saga_id: str | None
    tags: tuple[str, ...]


@dataclass(slots=True)
class _Run:
    """One framework run inside one saga (shared by reference with the framework's tasks)."""

    saga: Saga
    loop: asyncio.AbstractEventLoop
    failure: BaseException | None = None
    failed_tool: str = ""


_run: ContextVar[_Run | None] = ContextVar("agent_saga_adapter_run", default=None)

_kits: dict[str, AgentKit] = {}
_kits_lock = threading.Lock()


def require(module: str, extra: str) -> ModuleType:
    """Import a framework module, or raise ``ImportError`` naming the extra to install."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"agent_saga.adapters.{extra} needs {module!r}, which is not installed: "
            f"pip install 'agent-saga[{extra}]'"
        ) from exc


def default_kit(framework: str) -> AgentKit:
    """The kit a run uses when none is given: ``AgentKit(name=framework)``, made once.

    Its gate comes from the environment (``AgentKit``'s default): with the policy plane
    configured, the fleet's kill switch, limits and policies apply to the run."""
    with _kits_lock:
        kit = _kits.get(framework)
        if kit is None:
            kit = _kits[framework] = AgentKit(name=framework)
        return kit


def _tool_kit() -> AgentKit:
    """The kit that registers tools wrapped without ``kit=`` (no gate: a step is gated
    by the saga it runs in)."""
    with _kits_lock:
        kit = _kits.get("")
        if kit is None:
            kit = _kits[""] = AgentKit(name="adapters", gate=None)
        return kit


def refusal_text(tool: str, exc: SagaRefused) -> str:
    """What the model reads when ``tool`` was refused: who refused, why, nothing ran."""
    reason = (getattr(exc, "reason", "") or getattr(exc, "message", "") or str(exc)).rstrip(". ")
    by = getattr(exc, "decided_by", "")
    text = f"agent-saga refused {tool}: {reason}"
    if by:
        text += f" (decided by {by})"
    return text + ("." if "nothing was executed" in reason.lower() else ". Nothing was executed.")


class SagaStep:
    """One wrapped tool: ``forward(**kwargs)`` run as a saga step inside a run.

    Args:
        forward: the original tool's call, sync or async, taking the tool's arguments
            as keywords; its return value is what ``compensate`` receives. ``None``
            when the adapter passes ``call=`` to every ``acall``.
        tool: the step's tool name (what the gate, the kill switch and the log see).
        semantics, compensate, timeout, retry, policy_args: as ``AgentKit.safe_tool``.
        kit: the ``AgentKit`` to register the tool with (its ``guarantees()`` list it);
            the gate is the run's, not the kit's.

    Raises ``ConfigurationError`` now for a declaration that can never run (COMPENSABLE
    without ``compensate``, IRREVERSIBLE with one).
    """

    __slots__ = ("_compensate", "_forward", "_policy_args", "_retry", "_semantics", "_timeout", "tool")

    def __init__(
        self,
        forward: Callable[..., Any] | None,
        *,
        tool: str,
        semantics: ActionSemantics | str,
        compensate: CompensationFactory | None,
        kit: AgentKit | None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        policy_args: Callable[..., Mapping[str, Any]] | None = None,
    ) -> None:
        if not isinstance(tool, str) or not tool:
            raise ConfigurationError(f"wrap_tool: the tool needs a non-empty name, got {tool!r}")
        if kit is not None and not isinstance(kit, AgentKit):
            raise ConfigurationError(f"wrap_tool: kit= must be an AgentKit, got {kit!r}")
        # The kit checks the declaration now (not at the first call) and lists the tool
        # in its guarantees(); each call is then one Saga.execute of the run's saga.
        (kit or _tool_kit()).safe_tool(
            forward or _given_per_call, semantics=semantics, compensate=compensate, name=tool,
            timeout=timeout, retry=retry, policy_args=policy_args,
        )
        self.tool = tool
        self._forward = forward
        self._semantics = coerce_semantics(semantics)
        self._compensate = compensate
        self._timeout = timeout
        self._retry = retry
        self._policy_args = policy_args

    @classmethod
    def declare(
        cls,
        forward: Callable[..., Any] | None,
        tool: str,
        semantics: ActionSemantics | str,
        compensate: CompensationFactory | None,
        options: StepOptions,
    ) -> SagaStep:
        """The step of a ``wrap_tool(tool, semantics=, compensate=, **options)`` call;
        ``tool`` is the framework tool's name (``options["name"]`` wins for the step)."""
        return cls(
            forward, tool=options.get("name") or tool, semantics=semantics, compensate=compensate,
            kit=options.get("kit"), timeout=options.get("timeout"), retry=options.get("retry"),
            policy_args=options.get("policy_args"),
        )

    async def acall(self, kwargs: Mapping[str, Any], call: Callable[[], Any] | None = None) -> Any:
        """Run the step (inside a run) or the original call (outside one).

        ``kwargs`` are the tool's arguments (the gate sees them); ``call``, when given,
        is how this framework runs the original with them (default ``forward(**kwargs)``).
        Raises ``ToolRefused`` when a control refused it or the run is already doomed;
        any other exception is the tool's (or the log's), and dooms the run."""
        if call is not None:
            forward: Callable[[], Any] = call
        elif self._forward is not None:
            forward = functools.partial(self._forward, **kwargs)
        else:
            raise ConfigurationError(f"{self.tool}: this step is run with call= (the adapter's own call)")
        run = _run.get()
        if run is None:
            result = forward()
            return await result if inspect.isawaitable(result) else result
        if run.failure is not None:
            raise ToolRefused(_doomed_text(self.tool, run), tool=self.tool)
        pargs = self._policy_args(**kwargs) if self._policy_args is not None else _json_kwargs(dict(kwargs))
        try:
            return await run.saga.execute(
                self.tool, self._semantics, forward, self._compensate,
                timeout=self._timeout, retry=self._retry, policy_args=pargs,
            )
        except SagaQuarantined as exc:
            # Frozen, not refused: the model is told, and the run then leaves its scope
            # with this exception, so the saga is quarantined (never rolled back).
            if run.failure is None:
                run.failure, run.failed_tool = exc, self.tool
            raise ToolRefused(refusal_text(self.tool, exc), tool=self.tool, cause=exc) from exc
        except SagaRefused as exc:
            raise ToolRefused(refusal_text(self.tool, exc), tool=self.tool, cause=exc) from exc
        except BaseException as exc:
            if run.failure is None:
                run.failure, run.failed_tool = exc, self.tool
            raise

    def call(self, kwargs: Mapping[str, Any], call: Callable[[], Any] | None = None) -> Any:
        """``acall`` for a framework that calls tools synchronously on a worker thread.

        Inside a run the step is run on the run's event loop and this thread waits for
        it. Raises ``ConfigurationError`` when called on the run's own loop thread (a sync
        tool there would block the loop the step needs)."""
        run = _run.get()
        if run is None:
            result = call() if call is not None else (self._forward or _given_per_call)(**kwargs)
            if inspect.isawaitable(result):
                return _run_coroutine(result)
            return result
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is run.loop:
            raise ConfigurationError(
                f"{self.tool} was called synchronously on the event loop of its saga run; "
                f"call it through the framework's async API (or from a worker thread)"
            )
        return asyncio.run_coroutine_threadsafe(self.acall(kwargs, call), run.loop).result()


def _doomed_text(tool: str, run: _Run) -> str:
    if isinstance(run.failure, SagaQuarantined):
        return (f"agent-saga refused {tool}: this run's saga is quarantined; no further tool runs "
                f"and a human decides what happens to it. Nothing was executed.")
    return (f"agent-saga refused {tool}: an earlier tool call in this run ({run.failed_tool}) "
            f"failed, so the run is being rolled back. Nothing was executed.")


def _given_per_call(**kwargs: Any) -> Any:
    """The stand-in forward of a step whose adapter passes ``call=`` each time."""
    raise ConfigurationError("this tool's call is given by its adapter")


def _run_coroutine(coro: Awaitable[T]) -> T:
    async def wait() -> T:
        return await coro

    return asyncio.run(wait())


def make_saga_run(framework: str, start: Callable[..., Awaitable[Any]], doc: str) -> Callable[..., Any]:
    """An adapter's ``saga_run(target, *args, kit=, name=, saga_id=, tags=, **kwargs)``:
    ``await start(target, *args, **kwargs)`` as one saga (``run_in_saga``)."""

    async def saga_run(target: Any, *args: Any, **kwargs: Any) -> Any:
        options = {k: kwargs.pop(k) for k in ("kit", "name", "saga_id", "tags") if k in kwargs}
        return await run_in_saga(
            lambda: start(target, *args, **kwargs), framework=framework, **cast(RunOptions, options)
        )

    saga_run.__doc__ = doc
    saga_run.__qualname__ = saga_run.__name__ = "saga_run"
    return saga_run


async def run_in_saga(
    body: Callable[[], Awaitable[T]],
    *,
    framework: str,
    **options: Unpack[RunOptions],
) -> T:
    """Await ``body()`` as one saga: every wrapped tool it calls is a step of it.

    Returns what ``body`` returned, after a durable SAGA_COMPLETED. Any exception from
    ``body`` rolls back every step that ran, LIFO, and propagates (``RollbackIncomplete``
    when the rollback was partial). A step that failed while the framework carried on
    (it showed the error to the model) is raised here once ``body`` returns, so the saga
    rolls back all the same. Nested runs are refused (``ConfigurationError``).
    """
    if _run.get() is not None:
        raise ConfigurationError(
            "saga_run is already running in this task: nested runs are not supported; "
            "call the inner agent's tools as steps of the outer run"
        )
    kit = options.get("kit")
    kit = kit if kit is not None else default_kit(framework)
    if not isinstance(kit, AgentKit):
        raise ConfigurationError(f"saga_run: kit= must be an AgentKit, got {kit!r}")
    tags = tuple(options.get("tags", ()))
    async with kit.transaction(options.get("name"), saga_id=options.get("saga_id"), tags=(framework, *tags)) as saga:
        run = _Run(saga, asyncio.get_running_loop())
        token = _run.set(run)
        try:
            result = await body()
        finally:
            _run.reset(token)
        if run.failure is not None:
            failure = run.failure
            if not isinstance(failure, SagaQuarantined):
                failure.add_note(
                    f"agent-saga: {run.failed_tool} failed during the {framework} run, which handed "
                    f"the error to the model and went on; the run is rolled back"
                )
            raise failure
        return result
