"""LlamaIndex: a real FunctionAgent driven by llama-index's MockFunctionCallingLLM."""

from __future__ import annotations

import pytest
from adapter_support import (
    World,
    assert_refused_in_band,
    assert_rolled_back_lifo,
    tools_for,
)
from agent_saga.adapters.llamaindex import saga_run, wrap_tool
from llama_index.core.agent.workflow import FunctionAgent
from llama_index.core.base.llms.types import ChatMessage, MessageRole, ToolCallBlock
from llama_index.core.llms.mock import MockFunctionCallingLLM
from llama_index.core.tools import FunctionTool

# llama-index's workflow engine reads deprecated pydantic attributes (``__fields__``,
# ``model_computed_fields``) while it collects an agent's steps (its code, not ours).
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning")


class Script:
    """The LLM's turns, in order; records each turn's messages and tools."""

    def __init__(self, turns: list[ChatMessage]) -> None:
        self.turns = list(turns)
        self.messages: list[list[ChatMessage]] = []
        self.tools: list[list] = []

    def __call__(self, messages, **kwargs) -> ChatMessage:
        self.messages.append(list(messages))
        self.tools.append(list(kwargs.get("tools") or []))
        return self.turns.pop(0)


def call(name: str, args: dict, id_: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT,
                       blocks=[ToolCallBlock(tool_call_id=id_, tool_name=name, tool_kwargs=args)])


def say(text: str) -> ChatMessage:
    return ChatMessage(role=MessageRole.ASSISTANT, content=text)


def agent_with(script: Script, tools: list) -> FunctionAgent:
    return FunctionAgent(tools=tools, llm=MockFunctionCallingLLM(response_generator=script),
                         system_prompt="help", streaming=False)



@pytest.fixture(scope="module")
def li_tools(world: World):
    charge, ship, wire, compensate = tools_for(world)
    originals = [FunctionTool.from_defaults(charge), FunctionTool.from_defaults(ship),
                 FunctionTool.from_defaults(wire)]
    wrapped = [
        wrap_tool(originals[0], semantics="COMPENSABLE", compensate=compensate),
        wrap_tool(originals[1], semantics="REVERSIBLE"),
        wrap_tool(originals[2], semantics="REVERSIBLE"),
    ]
    return originals, wrapped



def test_the_llm_sees_the_original_schema(li_tools) -> None:
    originals, wrapped = li_tools
    for o, w in zip(originals, wrapped, strict=True):
        assert w.metadata is o.metadata
        assert w.metadata.to_openai_tool() == o.metadata.to_openai_tool()


async def test_a_failing_tool_rolls_back_every_tool_that_ran_lifo(world: World, li_tools) -> None:
    originals, wrapped = li_tools
    script = Script([call("charge", {"amount": 10, "customer": "c1"}, "1"),
                     call("charge", {"amount": 20, "customer": "c1"}, "2"),
                     call("ship", {"order": "o-1"}, "3"),
                     call("charge", {"amount": 30, "customer": "c1"}, "4"),  # after the failure
                     say("gave up")])
    with pytest.raises(RuntimeError, match="carrier rejected o-1"):
        await saga_run(agent_with(script, wrapped), user_msg="buy and ship", kit=world.kit)
    assert world.ran == ["charge:10", "charge:20", "ship:o-1"]  # the 4th call was refused
    assert_rolled_back_lifo(world, ["ch_10", "ch_20"])
    seen = [m.content for m in script.messages[3] if m.role == MessageRole.TOOL]
    assert "carrier rejected o-1" in seen[-1]  # the agent showed the model the error, as before
    assert [t.metadata for t in script.tools[0]] == [o.metadata for o in originals]


async def test_a_halted_tool_is_refused_as_an_error_tool_output(world: World, li_tools) -> None:
    _, wrapped = li_tools
    script = Script([call("wire_transfer", {"iban": "DE00", "amount": 5}, "1"), say("wire refused")])
    result = await saga_run(agent_with(script, wrapped), user_msg="wire it", kit=world.kit)
    assert str(result) == "wire refused"  # the model went on
    tool_msgs = [m for m in script.messages[1] if m.role == MessageRole.TOOL]
    assert len(tool_msgs) == 1
    assert_refused_in_band(world, str(tool_msgs[0].content))
