"""LangGraph (and any LangChain tool user): ``wrap_tool`` and ``saga_run``.

    from agent_saga.adapters.langgraph import wrap_tool, saga_run

    safe_ticket = wrap_tool(zendesk_create_ticket, semantics="COMPENSABLE",
                            compensate=lambda r: Compensation(fn=close_ticket, handler="zendesk.close_ticket",
                                                              kwargs={"ticket_id": r["id"]}))
    graph = build_graph(tools=[safe_ticket, ...])       # ToolNode, create_agent, your own node
    result = await saga_run(graph, {"messages": [...]})

Invariants:
- The wrapped tool is a ``StructuredTool`` with the original's name, description,
  ``args_schema``, ``return_direct``, ``response_format``, tags and metadata: the schema
  ``bind_tools`` sends to the model, and the router's view, are the original's.
- A refusal comes back as the tool's result, a ``ToolMessage`` with ``status="error"``
  and the refusal text (through the tool's ``handle_tool_error``), so the model reads
  it and the graph goes on. Other ``ToolException`` s are handled as the original tool
  handled them.
- ``saga_run`` is ``graph.ainvoke`` inside one saga (``agent_saga.adapters._common``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Unpack

from ..engine import CompensationFactory
from ..semantics import ActionSemantics
from ._common import SagaStep, StepOptions, ToolRefused, make_saga_run, require

__all__ = ["saga_run", "wrap_tool"]

_tools = require("langchain_core.tools", "langgraph")


def wrap_tool(
    tool: Any,
    *,
    semantics: ActionSemantics | str,
    compensate: CompensationFactory | None = None,
    **options: Unpack[StepOptions],
) -> Any:
    """Return ``tool`` (a LangChain ``BaseTool`` or a plain function) as a saga step.

    ``semantics`` / ``compensate`` / ``timeout`` / ``retry`` / ``policy_args`` as
    ``AgentKit.safe_tool``; ``compensate`` receives what the original tool returned.
    ``name`` is the step's name for the gate and the log (default: the tool's name; the
    name the model sees never changes). Raises ``ConfigurationError`` for a declaration
    that can never run.
    """
    original = tool if isinstance(tool, _tools.BaseTool) else _tools.tool(tool)
    if isinstance(original, _tools.StructuredTool) and (original.coroutine or original.func):
        forward: Callable[..., Any] = original.coroutine or original.func
    else:

        async def forward(**kwargs: Any) -> Any:
            return await original.ainvoke(kwargs)

    step = SagaStep.declare(forward, original.name, semantics, compensate, options)
    inherited = original.handle_tool_error

    def handle_tool_error(exc: Any) -> Any:
        if isinstance(exc, _Refused):
            return exc.text
        if not inherited:
            raise exc
        if isinstance(inherited, str):
            return inherited
        if callable(inherited):
            return inherited(exc)
        return exc.args[0] if exc.args else "Tool execution error"

    async def arun(**kwargs: Any) -> Any:
        try:
            return await step.acall(kwargs)
        except ToolRefused as exc:
            raise _Refused(exc.text) from exc

    def run(**kwargs: Any) -> Any:
        try:
            return step.call(kwargs)
        except ToolRefused as exc:
            raise _Refused(exc.text) from exc

    return _tools.StructuredTool(
        name=original.name,
        description=original.description,
        args_schema=original.args_schema,
        return_direct=original.return_direct,
        response_format=original.response_format,
        tags=original.tags,
        metadata=original.metadata,
        extras=original.extras,
        verbose=original.verbose,
        callbacks=original.callbacks,
        handle_validation_error=original.handle_validation_error,
        handle_tool_error=handle_tool_error,
        func=run,
        coroutine=arun,
    )


class _Refused(_tools.ToolException):  # type: ignore[misc,name-defined]
    """A refusal, raised as a ``ToolException`` so LangChain hands it to the model."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text


saga_run = make_saga_run(
    "langgraph", lambda graph, input, config=None, **kwargs: graph.ainvoke(input, config, **kwargs),
    """``await saga_run(graph, input, config=None, *, kit=, name=, saga_id=, tags=, **kwargs)``:
    ``graph.ainvoke(input, config, **kwargs)`` as one saga.

    Every wrapped tool the graph runs is a step of it; if any node raises (or a wrapped
    tool failed and the graph carried on), every tool that ran is compensated LIFO and
    the exception propagates (``RollbackIncomplete`` if the rollback was partial).
    ``kit`` supplies the WAL and the gate (default: ``AgentKit(name="langgraph")``, its
    gate from the environment); ``name`` / ``saga_id`` / ``tags`` as
    ``AgentKit.transaction``.""",
)
