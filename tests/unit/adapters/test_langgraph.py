"""LangGraph: a real StateGraph with a ToolNode, driven by langchain-core's fake chat model."""

from __future__ import annotations

import pytest
from adapter_support import (
    World,
    assert_refused_in_band,
    assert_rolled_back_lifo,
    tools_for,
)
from agent_saga import SagaQuarantined
from agent_saga.adapters.langgraph import saga_run, wrap_tool
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

BOUND: list[list[dict]] = []


class ScriptedModel(GenericFakeChatModel):
    """The fake chat model, plus ``bind_tools`` (it records the schemas it is given)."""

    def bind_tools(self, tools, **kwargs):
        schemas = [convert_to_openai_tool(t) for t in tools]
        BOUND.append(schemas)
        return self.bind(tools=schemas, **kwargs)


def call(name: str, args: dict, id_: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": id_, "type": "tool_call"}])


def graph_for(script: list[AIMessage], tools: list):
    model = ScriptedModel(messages=iter(script)).bind_tools(tools)

    async def agent(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()



@pytest.fixture(scope="module")
def lc_tools(world: World):
    charge, ship, wire, compensate = tools_for(world)
    originals = [tool(charge), tool(ship), tool(wire)]
    wrapped = [
        wrap_tool(originals[0], semantics="COMPENSABLE", compensate=compensate),
        wrap_tool(originals[1], semantics="REVERSIBLE"),
        wrap_tool(originals[2], semantics="REVERSIBLE"),
    ]
    return originals, wrapped



def test_the_model_sees_the_original_schema(lc_tools) -> None:
    originals, wrapped = lc_tools
    BOUND.clear()
    graph_for([], originals)
    graph_for([], wrapped)
    assert BOUND[0] == BOUND[1]  # exactly what bind_tools hands the model
    for o, w in zip(originals, wrapped, strict=True):
        assert (w.name, w.description, w.args) == (o.name, o.description, o.args)
        assert w.tool_call_schema.model_json_schema() == o.tool_call_schema.model_json_schema()


async def test_a_failing_tool_rolls_back_every_tool_that_ran_lifo(world: World, lc_tools) -> None:
    _, wrapped = lc_tools
    script = [
        call("charge", {"amount": 10, "customer": "c1"}, "t1"),
        call("charge", {"amount": 20, "customer": "c1"}, "t2"),
        call("ship", {"order": "o-1"}, "t3"),
        AIMessage(content="never reached"),
    ]
    with pytest.raises(RuntimeError, match="carrier rejected o-1") as ei:
        await saga_run(graph_for(script, wrapped), {"messages": [("user", "buy and ship")]}, kit=world.kit)
    assert world.ran == ["charge:10", "charge:20", "ship:o-1"]
    assert_rolled_back_lifo(world, ["ch_10", "ch_20"])
    assert any("rolled back" in n for n in ei.value.__notes__)


async def test_a_halted_tool_is_refused_through_a_tool_message(world: World, lc_tools) -> None:
    _, wrapped = lc_tools
    script = [
        call("wire_transfer", {"iban": "DE00", "amount": 5}, "t1"),
        AIMessage(content="the wire was refused; stopping"),
    ]
    out = await saga_run(graph_for(script, wrapped), {"messages": [("user", "wire it")]}, kit=world.kit)
    refusal = next(m for m in out["messages"] if isinstance(m, ToolMessage))
    assert refusal.status == "error" and refusal.tool_call_id == "t1"
    assert out["messages"][-1].content == "the wire was refused; stopping"  # the model went on
    assert_refused_in_band(world, str(refusal.content))


async def test_a_tool_error_the_graph_hands_to_the_model_still_rolls_back(world: World) -> None:
    charge, ship, _, compensate = tools_for(world)
    wrapped = [wrap_tool(tool(charge), semantics="COMPENSABLE", compensate=compensate),
               wrap_tool(tool(ship), semantics="REVERSIBLE")]
    model = ScriptedModel(messages=iter([
        call("charge", {"amount": 7, "customer": "c2"}, "t1"),
        call("ship", {"order": "o-2"}, "t2"),
        call("charge", {"amount": 8, "customer": "c2"}, "t3"),  # after the failure: refused
        AIMessage(content="done"),
    ])).bind_tools(wrapped)

    async def agent(state: MessagesState) -> dict:
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(wrapped, handle_tool_errors=True))  # the graph swallows errors
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    with pytest.raises(RuntimeError, match="carrier rejected o-2"):
        await saga_run(g.compile(), {"messages": [("user", "go")]}, kit=world.kit)
    assert world.ran == ["charge:7", "ship:o-2"]  # the third call was refused, not run
    assert world.refunded == ["ch_7"]


async def test_a_quarantined_run_is_frozen_not_rolled_back(world: World, lc_tools) -> None:
    _, wrapped = lc_tools
    world.switch.quarantine("lg-quarantined", reason="suspected account takeover", by="soc@corp")
    script = [call("charge", {"amount": 5, "customer": "c9"}, "t1"), AIMessage(content="ok")]
    with pytest.raises(SagaQuarantined):
        await saga_run(graph_for(script, wrapped), {"messages": [("user", "charge")]}, kit=world.kit,
                       saga_id="lg-quarantined")
    assert world.ran == [] and world.refunded == []  # refused, and nothing rolled back
    types = [r.type for r in world.records("lg-quarantined")]
    assert types[-1] == "SAGA_QUARANTINED" and "SAGA_ROLLED_BACK" not in types, types


async def test_outside_saga_run_the_wrapped_tool_is_the_original(world: World, lc_tools) -> None:
    _, wrapped = lc_tools
    before = len(world.records())
    assert await wrapped[0].ainvoke({"amount": 3, "customer": "c3"}) == {"id": "ch_3", "amount": 3, "customer": "c3"}
    assert len(world.records()) == before


def test_the_langgraph_example_runs_offline_and_ends_clean(capsys) -> None:
    import runpy
    from pathlib import Path

    example = Path(__file__).resolve().parents[3] / "examples" / "adapters" / "langgraph_devops.py"
    runpy.run_path(str(example), run_name="__main__")  # in-process: LangGraph is imported already
    out = capsys.readouterr().out
    assert out.rstrip().endswith("clean")
    assert "model reads: agent-saga refused wire_transfer" in out
    undo = [ln.strip() for ln in out.splitlines() if "closed T-1" in ln or "scaled web back" in ln]
    assert undo == ["[zendesk] closed T-1", "[k8s] scaled web back to 2"]  # newest first
