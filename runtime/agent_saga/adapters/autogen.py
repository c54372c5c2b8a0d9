"""AutoGen: ``wrap_tool`` for a plain callable (or a ``FunctionTool``), ``saga_run`` for a run.

    from autogen_agentchat.agents import AssistantAgent
    from agent_saga.adapters.autogen import wrap_tool, saga_run

    safe_scale = wrap_tool(k8s_scale_deployment, semantics="COMPENSABLE",
                           compensate=lambda r: Compensation(fn=scale_back, handler="k8s.scale_deployment",
                                                             kwargs={"deploy": r["name"], "replicas": r["previous_replicas"]}))
    agent = AssistantAgent("ops", model_client=client, tools=[safe_scale])
    result = await saga_run(agent, task="scale web to 3")

AutoGen builds a tool's schema from the function (name, docstring, signature, type
hints), so wrapping a plain callable fits every AutoGen tool API: ``AssistantAgent(tools=
[...])``, ``FunctionTool(fn, description=...)``, a ``StaticWorkbench``.

Invariants:
- The wrapped callable is an ``async def`` with the original's ``__name__``,
  ``__doc__``, signature and resolved type hints: AutoGen derives the same schema from
  it. A ``FunctionTool`` comes back as a ``FunctionTool`` with the same name and
  description over the wrapped callable.
- A refusal raises ``ToolRefused`` with the refusal text; AutoGen's workbench turns a
  tool's exception into an error result (``is_error=True``, the text shown to the model)
  and the agent goes on. A tool that raises still raises (shown to the model the same
  way) and dooms the run (``agent_saga.adapters._common``).
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable
from typing import Any, Unpack

from ..engine import CompensationFactory
from ..errors import ConfigurationError
from ..semantics import ActionSemantics
from ._common import SagaStep, StepOptions, ToolRefused, make_saga_run, require

__all__ = ["ToolRefused", "saga_run", "wrap_tool"]

_tools = require("autogen_core.tools", "autogen")


def wrap_tool(
    tool: Any,
    *,
    semantics: ActionSemantics | str,
    compensate: CompensationFactory | None = None,
    **options: Unpack[StepOptions],
) -> Any:
    """Return ``tool`` (a plain sync or async function, or an ``autogen_core.tools.
    FunctionTool``) as a saga step. ``name`` is the step's name for the gate and the log
    (default: the function's ``__name__`` or the tool's name). Other arguments as
    ``agent_saga.adapters.langgraph.wrap_tool``. Raises ``ConfigurationError`` for a
    declaration that can never run or a tool that is neither."""
    if isinstance(tool, _tools.FunctionTool):
        step = SagaStep.declare(tool._func, tool.name, semantics, compensate, options)
        wrapped = _wrap_callable(tool._func, step)
        return _tools.FunctionTool(wrapped, description=tool.description, name=tool.name,
                                   global_imports=tool._global_imports, strict=tool._strict)
    if not callable(tool) or isinstance(tool, _tools.BaseTool):
        raise ConfigurationError(
            f"wrap_tool needs a plain function or an autogen_core FunctionTool, got {tool!r}"
        )
    return _wrap_callable(tool, SagaStep.declare(tool, tool.__name__, semantics, compensate, options))


def _wrap_callable(fn: Callable[..., Any], step: SagaStep) -> Callable[..., Any]:
    signature = inspect.signature(fn)

    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = signature.bind(*args, **kwargs)
        return await step.acall(dict(bound.arguments))

    # AutoGen resolves type hints against the function's module globals: hand it the
    # resolved ones, so annotations written as strings resolve as in the original.
    hints = typing.get_type_hints(fn, include_extras=True)
    wrapper.__annotations__ = hints
    wrapper.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p.replace(annotation=hints.get(p.name, p.annotation)) for p in signature.parameters.values()],
        return_annotation=hints.get("return", signature.return_annotation),
    )
    return wrapper


saga_run = make_saga_run(
    "autogen", lambda agent, **kwargs: agent.run(**kwargs),
    """``await saga_run(agent, *, kit=, name=, saga_id=, tags=, **kwargs)``:
    ``agent.run(**kwargs)`` as one saga (an AgentChat agent or team:
    ``saga_run(agent, task="...")``).

    AutoGen shows a tool's exception to the model and goes on; the run is still rolled
    back when it ends (every tool that ran is compensated LIFO, and the tool's exception
    is raised), and so it is when the run itself raises. ``kit`` / ``name`` / ``saga_id``
    / ``tags`` as ``agent_saga.adapters.langgraph.saga_run``.""",
)
