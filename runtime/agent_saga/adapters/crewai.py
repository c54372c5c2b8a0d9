"""CrewAI: ``wrap_tool`` for a CrewAI tool, ``saga_run`` for a crew's kickoff.

    from crewai import Agent, Crew, Task
    from crewai.tools import tool
    from agent_saga.adapters.crewai import wrap_tool, saga_run

    safe_ticket = wrap_tool(zendesk_create_ticket, semantics="COMPENSABLE",    # a @tool
                            compensate=lambda r: Compensation(fn=close_ticket, handler="zendesk.close_ticket",
                                                              kwargs={"ticket_id": r["id"]}))
    crew = Crew(agents=[Agent(role="support", ..., tools=[safe_ticket])], tasks=[...])
    result = await saga_run(crew, inputs={"customer": "c1"})

Invariants:
- The wrapped tool has the original's ``name``, ``description`` and ``args_schema``
  (and ``result_as_answer``, ``max_usage_count``, ``tool_failure_policy``): the text
  and schema CrewAI shows the model are the original's.
- A refusal is a ``ToolFailure`` (code ``agent_saga_refused``, not retryable), CrewAI's
  own "the tool ran but did not succeed" result: the agent reads the refusal text, the
  failure is recorded on the task output, and the tool's failure policy applies.
- A tool that raises still raises (CrewAI shows the model the error, as before) and
  dooms the run (``agent_saga.adapters._common``).
- ``saga_run`` awaits ``crew.akickoff`` (CrewAI's native async kickoff): every tool call
  happens inside the run's context, so each is a step of its saga.
"""

from __future__ import annotations

from typing import Any, Unpack

from ..engine import CompensationFactory
from ..errors import ConfigurationError
from ..semantics import ActionSemantics
from ._common import SagaStep, StepOptions, ToolRefused, make_saga_run, require

__all__ = ["saga_run", "wrap_tool"]

_tools = require("crewai.tools", "crewai")
_failure = require("crewai.tools.tool_failure", "crewai")
_pydantic = require("pydantic", "crewai")

REFUSED_CODE = "agent_saga_refused"


class SagaTool(_tools.BaseTool):  # type: ignore[misc,name-defined]
    """A CrewAI tool whose every call is a saga step (made by ``wrap_tool``)."""

    original: Any = _pydantic.Field(exclude=True)
    _step: Any = _pydantic.PrivateAttr(default=None)

    def _refused(self, exc: ToolRefused) -> Any:
        return _failure.ToolFailure(message=exc.text, code=REFUSED_CODE, retryable=False,
                                    details={"tool": exc.tool})

    def _run(self, **kwargs: Any) -> Any:
        try:
            return self._step.call(kwargs, lambda: self.original.run(**kwargs))
        except ToolRefused as exc:
            return self._refused(exc)

    async def _arun(self, **kwargs: Any) -> Any:
        try:
            return await self._step.acall(kwargs, lambda: self.original.arun(**kwargs))
        except ToolRefused as exc:
            return self._refused(exc)


def wrap_tool(
    tool: Any,
    *,
    semantics: ActionSemantics | str,
    compensate: CompensationFactory | None = None,
    **options: Unpack[StepOptions],
) -> Any:
    """Return ``tool`` (a CrewAI ``BaseTool``, e.g. from ``@tool``) as a saga step.
    Other arguments as ``agent_saga.adapters.langgraph.wrap_tool``."""
    if not isinstance(tool, _tools.BaseTool):
        raise ConfigurationError(
            f"wrap_tool needs a CrewAI tool (crewai.tools.BaseTool, e.g. from @tool), got {tool!r}"
        )
    step = SagaStep.declare(None, tool.name, semantics, compensate, options)
    wrapped = SagaTool(
        original=tool, name=tool.name, description=tool.description, args_schema=tool.args_schema,
        result_as_answer=tool.result_as_answer, max_usage_count=tool.max_usage_count,
        tool_failure_policy=tool.tool_failure_policy,
    )
    wrapped._step = step
    return wrapped


saga_run = make_saga_run(
    "crewai", lambda crew, **kwargs: crew.akickoff(**kwargs),
    """``await saga_run(crew, *, kit=, name=, saga_id=, tags=, **kwargs)``:
    ``crew.akickoff(**kwargs)`` as one saga (a ``Crew``; an ``Agent`` or ``Flow`` with
    ``akickoff`` works the same way).

    If the kickoff raises, or a wrapped tool failed while the crew carried on, every tool
    that ran is compensated LIFO and the exception propagates. ``kit`` / ``name`` /
    ``saga_id`` / ``tags`` as ``agent_saga.adapters.langgraph.saga_run``.""",
)
