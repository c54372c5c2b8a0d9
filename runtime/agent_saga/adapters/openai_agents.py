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
from collections.abc import Callable, Mapping
from typing import Any

from ..engine import CompensationFactory
from ..errors import ConfigurationError
from ..kit import AgentKit
from ..retry import RetryPolicy
from ..semantics import ActionSemantics
from ._common import SagaStep, ToolRefused, require, run_in_saga

__all__ = ["saga_run", "wrap_tool"]

_agents = require("agents", "openai_agents")


def wrap_tool(
    tool: Any,
    *,
    semantics: ActionSemantics | str,
    compensate: CompensationFactory | None = None,
    name: str | None = None,
    timeout: float | None = None,
    retry: RetryPolicy | None = None,
    policy_args: Callable[..., Mapping[str, Any]] | None = None,
    kit: AgentKit | None = None,
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

    step = SagaStep(
        None, tool=name or original.name, semantics=semantics, compensate=compensate,
        kit=kit, timeout=timeout, retry=retry, policy_args=policy_args,
    )

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


async def saga_run(
    agent: Any,
    input: Any,
    *,
    kit: AgentKit | None = None,
    name: str | None = None,
    saga_id: str | None = None,
    tags: tuple[str, ...] = (),
    **run_kwargs: Any,
) -> Any:
    """``await Runner.run(agent, input, **run_kwargs)`` as one saga.

    If the run raises (a tool with no failure function, ``MaxTurnsExceeded``, a
    guardrail tripwire) or a wrapped tool failed while the run went on, every tool that
    ran is compensated LIFO and the exception propagates. ``kit`` / ``name`` /
    ``saga_id`` / ``tags`` as ``agent_saga.adapters.langgraph.saga_run``."""
    return await run_in_saga(
        lambda: _agents.Runner.run(agent, input, **run_kwargs),
        framework="openai_agents", kit=kit, name=name, saga_id=saga_id, tags=tags,
    )
