"""The OpenAI Agents SDK: ``wrap_tool`` for a ``FunctionTool`` and ``saga_run`` for ``Runner.run``.

    from agents import Agent, function_tool
    from agent_saga.adapters.openai_agents import wrap_tool, saga_run

    safe_refund = wrap_tool(issue_refund, semantics="COMPENSABLE",      # a @function_tool
                            compensate=lambda r: Compensation(fn=reverse_refund, handler="billing.reverse",
                                                              kwargs={"refund_id": r["id"]}))
    agent = Agent(name="support", tools=[safe_refund, ...])
    result = await saga_run(agent, "refund order 42")

Invariants:
- The wrapped tool is a copy of the original ``FunctionTool`` (``dataclasses.replace``):
  the same name, description, ``params_json_schema``, strictness, guardrails, approval
  and failure policy; only the invoker differs.
- A refusal is the tool's output string (the SDK's channel for "return a string error
  message, which will be sent back to the LLM"); the run goes on.
- A tool that raises goes through the tool's own ``failure_error_function`` as before
  (the model reads it, or the run fails when it is ``None``); either way the run is
  rolled back (see ``agent_saga.adapters._common``).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from typing import Any, Unpack

from ..engine import CompensationFactory
from ..errors import ConfigurationError
from ..semantics import ActionSemantics
from ._common import SagaStep, StepOptions, ToolRefused, make_saga_run, require

__all__ = ["saga_run", "wrap_tool"]

_agents = require("agents", "openai_agents")


def wrap_tool(
    tool: Any,
    *,
    semantics: ActionSemantics | str,
    compensate: CompensationFactory | None = None,
    **options: Unpack[StepOptions],
) -> Any:
    """Return ``tool`` (a ``FunctionTool``, e.g. from ``@function_tool``, or a plain
    function) as a saga step. ``compensate`` receives what the tool's function returned.

    Other arguments as ``agent_saga.adapters.langgraph.wrap_tool``. Raises
    ``ConfigurationError`` for a declaration that can never run or a tool that is not a
    ``FunctionTool`` (hosted tools run on OpenAI's side: there is nothing to wrap)."""
    if isinstance(tool, _agents.FunctionTool):
        original = tool
    elif inspect.isfunction(tool) or inspect.ismethod(tool):
        original = _agents.function_tool(tool)
    else:
        raise ConfigurationError(
            f"wrap_tool needs a FunctionTool (@function_tool) or a plain function, got {tool!r}"
        )
    invoker = original.on_invoke_tool
    # @function_tool's invoker applies the failure policy around the function's own call:
    # the step runs the inner call, and the copy keeps the policy around the step.
    raw = getattr(invoker, "_invoke_tool_impl", invoker)
    handled = getattr(invoker, "_on_handled_error", None)

    step = SagaStep.declare(None, original.name, semantics, compensate, options)

    async def invoke(ctx: Any, input: str) -> Any:
        try:
            args = json.loads(input) if input else {}
        except ValueError:
            args = {}
        try:
            return await step.acall(args if isinstance(args, dict) else {}, call=lambda: raw(ctx, input))
        except ToolRefused as exc:
            return exc.text

    prepare = getattr(raw, "__agents_prepare_arguments__", None)
    if prepare is not None:
        invoke.__agents_prepare_arguments__ = prepare  # type: ignore[attr-defined]
    new_invoker: Any = invoke
    if handled is not None:
        new_invoker = type(invoker)(invoke, handled)
    return dataclasses.replace(original, on_invoke_tool=new_invoker)


saga_run = make_saga_run(
    "openai_agents", lambda agent, input, **kwargs: _agents.Runner.run(agent, input, **kwargs),
    """``await saga_run(agent, input, *, kit=, name=, saga_id=, tags=, **kwargs)``:
    ``Runner.run(agent, input, **kwargs)`` as one saga.

    If the run raises (a tool with no failure function, ``MaxTurnsExceeded``, a
    guardrail tripwire) or a wrapped tool failed while the run went on, every tool that
    ran is compensated LIFO and the exception propagates. ``kit`` / ``name`` /
    ``saga_id`` / ``tags`` as ``agent_saga.adapters.langgraph.saga_run``.""",
)
