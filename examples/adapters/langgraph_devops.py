"""A LangGraph DevOps agent whose tools are saga steps (offline: a scripted model).

    pip install 'agent-saga[langgraph]'
    python examples/adapters/langgraph_devops.py

The model scales a deployment, opens a ticket, then tries a wire the kill switch halts
(refused in-band: the model reads why and goes on), then a deploy that fails: the saga
rolls back, closing the ticket and scaling the deployment back, newest first.
A scripted chat model (langchain-core's GenericFakeChatModel) stands in for your LLM.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from agent_saga import AgentKit, Compensation, FileSwitchStore, FileWAL, KillSwitch, PreFlightGate
from agent_saga.adapters.langgraph import saga_run, wrap_tool
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition

deployments = {"web": 2}
tickets: dict[str, str] = {}


@tool
def k8s_scale_deployment(name: str, replicas_wanted: int) -> dict:
    """Scale a Kubernetes deployment; returns the previous replica count."""
    previous, deployments[name] = deployments[name], replicas_wanted
    print(f"  [k8s] scaled {name} {previous} -> {replicas_wanted}")
    return {"name": name, "previous_replicas": previous}


@tool
def zendesk_create_ticket(subject: str) -> dict:
    """Open a support ticket."""
    tickets["T-1"] = subject
    print(f"  [zendesk] opened T-1: {subject}")
    return {"id": "T-1"}


@tool
def wire_transfer(iban: str, amount: int) -> str:
    """Send a bank wire."""
    raise AssertionError("a halted tool never runs")


@tool
def deploy(version: str) -> str:
    """Deploy a release."""
    raise RuntimeError(f"image {version} not found")


def scale_back(name: str, replicas: int) -> None:
    print(f"  [k8s] scaled {name} back to {replicas}")
    deployments[name] = replicas


def close_ticket(ticket_id: str) -> None:
    print(f"  [zendesk] closed {ticket_id}")
    tickets.pop(ticket_id)


TOOLS = [
    wrap_tool(k8s_scale_deployment, semantics="COMPENSABLE", compensate=lambda r: Compensation(
        fn=scale_back, handler="k8s.scale_deployment",
        kwargs={"name": r["name"], "replicas": r["previous_replicas"]})),
    wrap_tool(zendesk_create_ticket, semantics="COMPENSABLE", compensate=lambda r: Compensation(
        fn=close_ticket, handler="zendesk.close_ticket", kwargs={"ticket_id": r["id"]})),
    wrap_tool(wire_transfer, semantics="REVERSIBLE"),
    wrap_tool(deploy, semantics="REVERSIBLE"),
]


def call(name: str, args: dict, id_: str) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": id_, "type": "tool_call"}])


SCRIPT = [
    call("k8s_scale_deployment", {"name": "web", "replicas_wanted": 5}, "c1"),
    call("zendesk_create_ticket", {"subject": "scaling web for the launch"}, "c2"),
    call("wire_transfer", {"iban": "DE00", "amount": 900}, "c3"),
    call("deploy", {"version": "v9"}, "c4"),
]


def build_graph():
    model = GenericFakeChatModel(messages=iter(SCRIPT))

    async def agent(state: MessagesState) -> dict:
        last = state["messages"][-1]
        if isinstance(last, ToolMessage):
            print(f"  model reads: {last.content}")
        return {"messages": [await model.ainvoke(state["messages"])]}

    g = StateGraph(MessagesState)
    g.add_node("agent", agent)
    g.add_node("tools", ToolNode(TOOLS))
    g.add_edge(START, "agent")
    g.add_conditional_edges("agent", tools_condition)
    g.add_edge("tools", "agent")
    return g.compile()


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        wal = FileWAL(Path(tmp) / "devops.wal")
        switch = KillSwitch(FileSwitchStore(warn=False), wal=wal)
        switch.halt("tool:wire_transfer", reason="wires are frozen during the launch", by="soc@corp")
        kit = AgentKit(name="devops", wal=wal, gate=PreFlightGate(checks=[switch]))
        try:
            await saga_run(build_graph(), {"messages": [("user", "get ready for the launch")]}, kit=kit)
        except RuntimeError as exc:
            print(f"run failed: {exc}")
        finally:
            wal.close()
    assert deployments == {"web": 2} and tickets == {}
    print("everything that ran was undone, newest first: clean")


if __name__ == "__main__":
    asyncio.run(main())
