"""AutoGen AgentChat: a real AssistantAgent driven by autogen_ext's ReplayChatCompletionClient."""

from __future__ import annotations

import json

import pytest
from adapter_support import (
    World,
    assert_refused_in_band,
    assert_rolled_back_lifo,
    tools_for,
)
from agent_saga.adapters.autogen import saga_run, wrap_tool
from autogen_agentchat.agents import AssistantAgent
from autogen_core import FunctionCall
from autogen_core.models import CreateResult, ModelInfo, RequestUsage
from autogen_core.tools import FunctionTool
from autogen_ext.models.replay import ReplayChatCompletionClient

INFO = ModelInfo(vision=False, function_calling=True, json_output=False, family="unknown",
                 structured_output=False)


class Recording(ReplayChatCompletionClient):
    """The replay client, recording the messages and tools of every turn."""

    def __init__(self, turns) -> None:
        super().__init__(turns, model_info=INFO)
        self.seen: list[tuple[list, list]] = []

    async def create(self, messages, *, tools=(), **kwargs):
        self.seen.append((list(messages), list(tools)))
        return await super().create(messages, tools=tools, **kwargs)


def call(name: str, args: dict, id_: str) -> CreateResult:
    return CreateResult(finish_reason="function_calls", usage=RequestUsage(0, 0), cached=False,
                        content=[FunctionCall(id=id_, name=name, arguments=json.dumps(args))])


def say(text: str) -> CreateResult:
    return CreateResult(finish_reason="stop", content=text, usage=RequestUsage(0, 0), cached=False)


def agent_with(client: Recording, tools: list) -> AssistantAgent:
    return AssistantAgent("shop", model_client=client, tools=tools, max_tool_iterations=6)



@pytest.fixture(scope="module")
def ag_tools(world: World):
    charge, ship, wire, compensate = tools_for(world)
    wrapped = [wrap_tool(charge, semantics="COMPENSABLE", compensate=compensate),
               wrap_tool(ship, semantics="REVERSIBLE"),
               wrap_tool(FunctionTool(wire, description="Send a bank wire."), semantics="REVERSIBLE")]
    return (charge, ship, FunctionTool(wire, description="Send a bank wire.")), wrapped



def schema(t) -> dict:
    return (t if isinstance(t, FunctionTool) else FunctionTool(t, description=t.__doc__ or "")).schema


def test_the_model_sees_the_original_schema(ag_tools) -> None:
    originals, wrapped = ag_tools
    for o, w in zip(originals, wrapped, strict=True):
        assert schema(w) == schema(o)
    assert isinstance(wrapped[2], FunctionTool)


async def test_a_failing_tool_rolls_back_every_tool_that_ran_lifo(world: World, ag_tools) -> None:
    originals, wrapped = ag_tools
    client = Recording([call("charge", {"amount": 10, "customer": "c1"}, "1"),
                        call("charge", {"amount": 20, "customer": "c1"}, "2"),
                        call("ship", {"order": "o-1"}, "3"),
                        call("charge", {"amount": 30, "customer": "c1"}, "4"),  # after the failure
                        say("gave up")])
    with pytest.raises(RuntimeError, match="carrier rejected o-1"):
        await saga_run(agent_with(client, wrapped), task="buy and ship", kit=world.kit)
    assert world.ran == ["charge:10", "charge:20", "ship:o-1"]  # the 4th call was refused
    assert_rolled_back_lifo(world, ["ch_10", "ch_20"])
    assert "carrier rejected o-1" in str(client.seen[3][0][-1])  # AutoGen showed the model the error
    assert client.seen[0][1] == [schema(o) for o in originals]  # the ToolSchemas the model got


async def test_a_halted_tool_is_refused_as_an_error_result(world: World, ag_tools) -> None:
    _, wrapped = ag_tools
    client = Recording([call("wire_transfer", {"iban": "DE00", "amount": 5}, "1"), say("wire refused")])
    result = await saga_run(agent_with(client, wrapped), task="wire it", kit=world.kit)
    assert result.messages[-1].content == "wire refused"  # the model went on
    (execution,) = client.seen[1][0][-1].content
    assert execution.is_error and execution.call_id == "1"
    assert_refused_in_band(world, execution.content)
