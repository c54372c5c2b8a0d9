"""CrewAI: a real Crew and Agent driven by a scripted ``BaseLLM`` (ReAct text turns).

CrewAI cannot share the main test environment (it pins mcp<2, openai<3, pydantic<2.13),
so these cases run in their own venv, ``.venv-crewai`` (made by ``make crewai-venv``, which ``make test`` runs), from
``test_crewai.py``: ``.venv-crewai/bin/python -m pytest tests/unit/adapters/crewai_cases.py``.
"""

from __future__ import annotations

import json
import os
import warnings

# No telemetry or trace export from a test run (the suite runs offline).
os.environ["CREWAI_DISABLE_TELEMETRY"] = "true"
os.environ["OTEL_SDK_DISABLED"] = "true"
os.environ["CREWAI_TRACING_ENABLED"] = "false"

import pytest  # noqa: E402
from adapter_support import (  # noqa: E402
    World,
    assert_refused_in_band,
    assert_rolled_back_lifo,
    tools_for,
)

# CrewAI's own import sets attributes on a namespace package (an ImportWarning from its
# code, not ours): imported once here with that warning silenced.
with warnings.catch_warnings():
    warnings.simplefilter("ignore", ImportWarning)
    from agent_saga.adapters.crewai import saga_run, wrap_tool
    from crewai import Agent, Crew, Task
    from crewai.llms.base_llm import BaseLLM
    from crewai.tools import tool

# CrewAI reads its own deprecated fields while it builds and runs a crew, through a warning
# wrapper in crewai/__init__.py (its code, not ours): those are not errors here.
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")


class ScriptedLLM(BaseLLM):
    """Answers each turn from a script (ReAct text); records every prompt."""

    def __init__(self, turns: list[str]) -> None:
        super().__init__(model="scripted")
        self._turns = list(turns)
        self._seen: list = []

    def call(self, messages, tools=None, callbacks=None, available_functions=None, from_task=None,
             from_agent=None, response_model=None):
        self._seen.append(json.dumps(messages, default=str))
        return self._turns.pop(0)

    def supports_function_calling(self) -> bool:
        return False


def act(name: str, args: dict) -> str:
    return f"Thought: use {name}\nAction: {name}\nAction Input: {json.dumps(args)}"


def crew_with(llm: ScriptedLLM, tools: list) -> Crew:
    agent = Agent(role="shop", goal="sell", backstory="a shop assistant", llm=llm, tools=tools,
                  verbose=False, max_iter=8)
    return Crew(agents=[agent], tasks=[Task(description="serve the customer", expected_output="a result",
                                            agent=agent)], verbose=False)



@pytest.fixture(scope="module")
def crew_tools(world: World):
    charge, ship, wire, compensate = tools_for(world)
    originals = [tool("charge")(charge), tool("ship")(ship), tool("wire_transfer")(wire)]
    wrapped = [wrap_tool(originals[0], semantics="COMPENSABLE", compensate=compensate),
               wrap_tool(originals[1], semantics="REVERSIBLE"),
               wrap_tool(originals[2], semantics="REVERSIBLE")]
    return originals, wrapped



def test_the_model_sees_the_original_tool(crew_tools) -> None:
    originals, wrapped = crew_tools
    for o, w in zip(originals, wrapped, strict=True):
        assert (w.name, w.description) == (o.name, o.description)
        assert w.args_schema.model_json_schema() == o.args_schema.model_json_schema()


async def test_a_failing_tool_rolls_back_every_tool_that_ran_lifo(world: World, crew_tools) -> None:
    _, wrapped = crew_tools
    llm = ScriptedLLM([act("charge", {"amount": 10, "customer": "c1"}),
                       act("charge", {"amount": 20, "customer": "c1"}),
                       act("ship", {"order": "o-1"}),
                       act("charge", {"amount": 30, "customer": "c1"}),  # after the failure
                       "Thought: stop\nFinal Answer: gave up"])
    with pytest.raises(RuntimeError, match="carrier rejected o-1"):
        await saga_run(crew_with(llm, wrapped), kit=world.kit)
    assert world.ran == ["charge:10", "charge:20", "ship:o-1"]  # the 4th call was refused
    assert_rolled_back_lifo(world, ["ch_10", "ch_20"])
    # CrewAI retries a tool that raised: the retry was refused in-band (ship ran once).
    assert "agent-saga refused ship: an earlier tool call in this run (ship) failed" in llm._seen[3]


async def test_a_halted_tool_is_refused_as_a_tool_failure(world: World, crew_tools) -> None:
    _, wrapped = crew_tools
    llm = ScriptedLLM([act("wire_transfer", {"iban": "DE00", "amount": 5}),
                       "Thought: refused\nFinal Answer: wire refused"])
    out = await saga_run(crew_with(llm, wrapped), kit=world.kit)
    assert out.raw == "wire refused"  # the model went on
    assert_refused_in_band(world, llm._seen[1])
    failures = out.tasks_output[0].tool_failures
    assert [f.failure.code for f in failures] == ["agent_saga_refused"]
