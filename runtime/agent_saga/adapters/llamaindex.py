"""LlamaIndex: ``wrap_tool`` for any LlamaIndex tool, ``saga_run`` for an agent workflow.

    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.tools import FunctionTool
    from agent_saga.adapters.llamaindex import wrap_tool, saga_run

    safe_upsert = wrap_tool(FunctionTool.from_defaults(qdrant_upsert_points), semantics="COMPENSABLE",
                            compensate=lambda r: Compensation(fn=delete_points, handler="qdrant.delete_points",
                                                              kwargs={"collection": r["collection"], "ids": r["ids"]}))
    agent = FunctionAgent(tools=[safe_upsert, ...], llm=llm)
    result = await saga_run(agent, user_msg="index these")

Invariants:
- The wrapped tool's ``metadata`` is the original's ``ToolMetadata`` object (name,
  description, ``fn_schema``, ``return_direct``): the schema the LLM is given is the same.
- ``compensate`` receives the tool's raw output (``ToolOutput.raw_output``), not the
  ``ToolOutput`` wrapper.
- A refusal is a ``ToolOutput`` with ``is_error=True`` and the refusal text, the same
  channel an agent uses for a tool that raised; the agent goes on. A tool that raises
  still raises (the agent shows the model the error, as before) and dooms the run
  (``agent_saga.adapters._common``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Unpack

from ..engine import CompensationFactory
from ..semantics import ActionSemantics
from ._common import SagaStep, StepOptions, ToolRefused, make_saga_run, require

__all__ = ["saga_run", "wrap_tool"]

_types = require("llama_index.core.tools.types", "llamaindex")
_function_tool = require("llama_index.core.tools.function_tool", "llamaindex")


class SagaTool(_types.AsyncBaseTool):  # type: ignore[misc,name-defined]
    """A LlamaIndex tool whose every call is a saga step (made by ``wrap_tool``)."""

    def __init__(self, original: Any, step: SagaStep) -> None:
        self.original = original
        self._step = step

    @property
    def metadata(self) -> Any:
        """The original tool's ``ToolMetadata``, unchanged."""
        return self.original.metadata

    def _refused(self, exc: ToolRefused, kwargs: Mapping[str, Any]) -> Any:
        return _types.ToolOutput(
            content=exc.text, tool_name=self.metadata.get_name(), raw_input={"kwargs": dict(kwargs)},
            raw_output=exc.text, is_error=True, exception=exc,
        )

    def call(self, *args: Any, **kwargs: Any) -> Any:
        """Run the step from a worker thread (sync callers)."""
        kw = _kwargs(args, kwargs)
        try:
            return self._step.call(kw, lambda: self.original.call(**kw))
        except ToolRefused as exc:
            return self._refused(exc, kw)

    async def acall(self, *args: Any, **kwargs: Any) -> Any:
        """Run the step; a refusal is an error ``ToolOutput`` the agent shows the model."""
        kw = _kwargs(args, kwargs)
        try:
            return await self._step.acall(kw, lambda: self.original.acall(**kw))
        except ToolRefused as exc:
            return self._refused(exc, kw)


def _kwargs(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    if args:  # a single positional input, as BaseTool.__call__(input) passes it
        return {"input": args[0], **kwargs} if len(args) == 1 else {"args": list(args), **kwargs}
    return kwargs


def wrap_tool(
    tool: Any,
    *,
    semantics: ActionSemantics | str,
    compensate: CompensationFactory | None = None,
    **options: Unpack[StepOptions],
) -> SagaTool:
    """Return ``tool`` (a LlamaIndex ``BaseTool`` such as ``FunctionTool``, or a plain
    function) as a saga step. Other arguments as ``agent_saga.adapters.langgraph.wrap_tool``."""
    original = tool if isinstance(tool, _types.BaseTool) else _function_tool.FunctionTool.from_defaults(tool)
    if not isinstance(original, _types.AsyncBaseTool):
        original = _types.adapt_to_async_tool(original)

    def on_output(out: Any) -> Any:
        assert compensate is not None
        return compensate(out.raw_output if isinstance(out, _types.ToolOutput) else out)

    step = SagaStep.declare(None, original.metadata.get_name(), semantics,
                            on_output if compensate is not None else None, options)
    return SagaTool(original, step)


saga_run = make_saga_run(
    "llamaindex", lambda agent, *args, **kwargs: agent.run(*args, **kwargs),
    """``await saga_run(agent, *args, kit=, name=, saga_id=, tags=, **kwargs)``:
    ``agent.run(*args, **kwargs)`` as one saga (a ``FunctionAgent``, ``ReActAgent``,
    ``AgentWorkflow`` or any workflow whose steps call wrapped tools).

    LlamaIndex agents show a tool's exception to the model and go on; the run is still
    rolled back when it ends (every tool that ran is compensated LIFO, and the tool's
    exception is raised), and so it is when the workflow itself raises. ``kit`` /
    ``name`` / ``saga_id`` / ``tags`` as ``agent_saga.adapters.langgraph.saga_run``.""",
)
