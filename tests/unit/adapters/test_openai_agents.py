"""OpenAI Agents SDK: a real Agent and Runner, driven by a scripted ``agents.Model``."""

from __future__ import annotations

import json

import pytest
from adapter_support import (
    World,
    assert_refused_in_band,
    assert_rolled_back_lifo,
    tools_for,
)
from agent_saga.adapters.openai_agents import saga_run, wrap_tool
from agents import (
    Agent,
    FunctionTool,
    ModelSettings,
    UserError,
    function_tool,
    set_tracing_disabled,
)
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

set_tracing_disabled(True)  # no exporter: the suite runs offline


class ScriptedModel(Model):
    """Answers each turn from a script; records the tools and input it was given."""

    def __init__(self, script: list) -> None:
        self.script = list(script)
        self.tools: list[list] = []
        self.inputs: list = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,
                           handoffs, tracing, *, previous_response_id, conversation_id, prompt):
        self.tools.append(list(tools))
        self.inputs.append(input)
        return ModelResponse(output=[self.script.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):  # pragma: no cover - not used
        raise NotImplementedError


def call(name: str, args: dict, id_: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", name=name, arguments=json.dumps(args),
                                    call_id=id_, id=f"fc_{id_}", status="completed")


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="m1", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])



@pytest.fixture(scope="module")
def sdk_tools(world: World):
    charge, ship, wire, compensate = tools_for(world)
    originals = [function_tool(charge), function_tool(ship, failure_error_function=None), function_tool(wire)]
    wrapped = [
        wrap_tool(originals[0], semantics="COMPENSABLE", compensate=compensate),
        wrap_tool(originals[1], semantics="REVERSIBLE"),
        wrap_tool(originals[2], semantics="REVERSIBLE"),
    ]
    return originals, wrapped



def agent_with(model: ScriptedModel, tools: list) -> Agent:
    return Agent(name="shop", instructions="help", model=model, tools=tools,
                 model_settings=ModelSettings(parallel_tool_calls=False))


def test_the_model_sees_the_original_schema(sdk_tools) -> None:
    originals, wrapped = sdk_tools
    for o, w in zip(originals, wrapped, strict=True):
        assert isinstance(w, FunctionTool)
        assert (w.name, w.description, w.params_json_schema, w.strict_json_schema) == (
            o.name, o.description, o.params_json_schema, o.strict_json_schema)


async def test_a_failing_tool_rolls_back_every_tool_that_ran_lifo(world: World, sdk_tools) -> None:
    originals, wrapped = sdk_tools
    model = ScriptedModel([call("charge", {"amount": 10, "customer": "c1"}, "1"),
                           call("charge", {"amount": 20, "customer": "c1"}, "2"),
                           call("ship", {"order": "o-1"}, "3"), say("never reached")])
    with pytest.raises(UserError, match="carrier rejected o-1") as ei:  # the SDK's wrapping
        await saga_run(agent_with(model, wrapped), "buy and ship", kit=world.kit)
    assert isinstance(ei.value.__cause__, RuntimeError)
    assert world.ran == ["charge:10", "charge:20", "ship:o-1"]
    assert_rolled_back_lifo(world, ["ch_10", "ch_20"])
    # what the SDK sent the model about the tools is what it sends for the originals
    assert [(t.name, t.params_json_schema) for t in model.tools[0]] == [
        (t.name, t.params_json_schema) for t in originals]


async def test_a_halted_tool_is_refused_as_the_tools_output(world: World, sdk_tools) -> None:
    _, wrapped = sdk_tools
    model = ScriptedModel([call("wire_transfer", {"iban": "DE00", "amount": 5}, "1"), say("wire refused")])
    result = await saga_run(agent_with(model, wrapped), "wire it", kit=world.kit)
    assert result.final_output == "wire refused"  # the model went on
    outputs = [i for i in model.inputs[1] if isinstance(i, dict) and i.get("type") == "function_call_output"]
    assert len(outputs) == 1 and outputs[0]["call_id"] == "1"
    assert_refused_in_band(world, str(outputs[0]["output"]))


async def test_an_error_the_sdk_hands_to_the_model_still_rolls_back(world: World) -> None:
    charge, ship, _, compensate = tools_for(world)
    wrapped = [wrap_tool(function_tool(charge), semantics="COMPENSABLE", compensate=compensate),
               wrap_tool(function_tool(ship), semantics="REVERSIBLE")]  # default failure_error_function
    model = ScriptedModel([call("charge", {"amount": 7, "customer": "c2"}, "1"),
                           call("ship", {"order": "o-2"}, "2"),
                           call("charge", {"amount": 8, "customer": "c2"}, "3"),
                           say("done")])
    with pytest.raises(RuntimeError, match="carrier rejected o-2"):
        await saga_run(agent_with(model, wrapped), "go", kit=world.kit)
    assert "An error occurred while running the tool" in json.dumps(model.inputs[2])  # the SDK's failure function
    assert "agent-saga refused charge: an earlier tool call in this run (ship) failed" in json.dumps(model.inputs[3])
    assert world.ran == ["charge:7", "ship:o-2"]  # the charge after the failure was refused
    assert world.refunded == ["ch_7"]
