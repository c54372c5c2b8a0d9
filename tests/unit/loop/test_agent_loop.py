"""AgentLoop over a real Router and in-process scripted hosts: every stop, and its unwinding.

What is pinned, for each stop (DONE, TOKEN_BUDGET before and after a call, STALLED,
NO_PROGRESS, STEP_BUDGET, DEADLINE, REFUSED): the result names it and why, a durable
LOOP_STOPPED record in the run's saga says the same, and only DONE leaves the tools' side
effects standing; every other stop rolls them back (the compensations ran, LIFO). A tool
that fails is reported to the model, not fatal.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_saga import (
    AgentLoop,
    Compensation,
    ConfigurationError,
    FileWAL,
    LoopTool,
    ManualClock,
    StopReason,
    saga_states,
)
from agent_saga.routing import (
    CallableHost,
    Capabilities,
    HostAnswer,
    ModelRequest,
    Route,
    Router,
    ToolCall,
    Usage,
)
from agent_saga.wal.file import iter_file_records

Script = Callable[[ModelRequest, int], HostAnswer]


def call(name: str, n: int = 0, usage: Usage | None = None, **args: Any) -> HostAnswer:
    return HostAnswer(tool_calls=(ToolCall(f"c{n}", name, json.dumps(args)),), usage=usage or Usage(100, 20))


def answer(text: str) -> HostAnswer:
    return HostAnswer(content=text, usage=Usage(100, 20))


class World:
    """The notes the tools write (the side effects an unfinished goal must undo)."""

    def __init__(self) -> None:
        self.notes: dict[str, str] = {}
        self.calls: list[str] = []
        self.undone: list[str] = []

    def write(self, key: str, text: str) -> dict[str, str]:
        self.calls.append(f"write:{key}")
        self.notes[key] = text
        return {"key": key}

    def erase(self, key: str) -> None:
        self.undone.append(key)
        self.notes.pop(key, None)

    def search(self, q: str) -> str:
        self.calls.append(f"search:{q}")
        return "nothing found"

    def tools(self) -> list[LoopTool]:
        return [
            LoopTool("notes.write", self.write, "COMPENSABLE",
                     lambda r: Compensation(fn=self.erase, kwargs={"key": r["key"]}), "write a note"),
            LoopTool("search", self.search, description="search the notes"),
        ]


@pytest.fixture
def wal(tmp_path: Path):
    w = FileWAL(tmp_path / "loop.wal")
    yield w
    w.close()


def make_loop(wal: FileWAL, world: World, script: Script, *, context_tokens: int = 8000, **kw: Any) -> tuple[AgentLoop, list[int]]:
    seen: list[int] = []

    def host(request: ModelRequest) -> HostAnswer:
        seen.append(len(request.messages))
        return script(request, len(seen))

    router = Router(Route([CallableHost("scripted", host, Capabilities(context_tokens=context_tokens, tools=True))]), wal=wal)
    return AgentLoop(router, tools=world.tools(), wal=wal, **kw), seen


def stopped(wal: FileWAL, saga_id: str) -> list[dict[str, Any]]:
    return [r.payload for _, r in iter_file_records(wal.path) if r.type == "LOOP_STOPPED" and r.saga == saga_id]


def status(wal: FileWAL, saga_id: str) -> str:
    return saga_states(r for _, r in iter_file_records(wal.path))[saga_id].status


async def test_done_keeps_the_side_effects_and_records_every_step(wal: FileWAL) -> None:
    world = World()
    loop, seen = make_loop(wal, world, lambda r, n: call("notes.write", n, key="k", text="t") if n == 1 else answer("filed"))
    result = await loop.run("file a note")
    assert (result.stop, result.answer, result.steps, result.tokens) == (StopReason.DONE, "filed", 2, 240)
    assert world.notes == {"k": "t"} and result.rollback is None
    assert status(wal, result.saga_id) == "COMPLETED"
    (stop,) = stopped(wal, result.saga_id)
    assert stop["reason"] == "DONE" and stop["tokens"] == 240
    steps = [r.payload for _, r in iter_file_records(wal.path) if r.type == "LOOP_STEP"]
    assert [s["actions"][0]["tool"] for s in steps[:1]] == ["notes.write"] and len(steps) == 2
    assert [s["decision"] for s in steps] == list(result.decisions)
    assert seen == [1, 3]  # the second call saw the assistant's call and the tool's answer


async def test_a_spent_token_budget_stops_before_running_the_calls_and_unwinds(wal: FileWAL) -> None:
    world = World()
    big = Usage(400, 20)  # the host reports more than the estimate: the budget is spent
    loop, seen = make_loop(wal, world, lambda r, n: call("notes.write", n, big if n == 2 else None, key=f"k{n}", text="t"),
                           token_budget=500)
    result = await loop.run("write notes forever")
    assert result.stop is StopReason.TOKEN_BUDGET and result.tokens == 540
    assert "tool call(s) were not run" in result.detail
    assert world.calls == ["write:k1"] and world.undone == ["k1"] and world.notes == {}
    assert result.rollback is not None and result.rollback.clean
    assert status(wal, result.saga_id) == "ROLLED_BACK"
    assert stopped(wal, result.saga_id)[0]["reason"] == "TOKEN_BUDGET"


async def test_a_budget_that_cannot_pay_for_the_next_prompt_does_not_call(wal: FileWAL) -> None:
    world = World()
    loop, seen = make_loop(wal, world, lambda r, n: call("search", n, q=str(n)), token_budget=130)
    result = await loop.run("search")
    assert result.stop is StopReason.TOKEN_BUDGET and "not called" in result.detail
    assert seen == [1] and result.steps == 1


async def test_the_same_action_three_times_is_a_stall_and_the_third_is_not_run(wal: FileWAL) -> None:
    world = World()
    loop, _ = make_loop(wal, world, lambda r, n: call("notes.write", n, key="same", text="t"))
    result = await loop.run("thrash")
    assert result.stop is StopReason.STALLED and "3 times in a row" in result.detail
    assert world.calls == ["write:same", "write:same"] and world.notes == {}
    assert world.undone == ["same", "same"]  # both writes were compensated, LIFO
    assert stopped(wal, result.saga_id)[0]["reason"] == "STALLED"


async def test_steps_that_learn_nothing_new_stop_as_no_progress(wal: FileWAL) -> None:
    world = World()
    loop, _ = make_loop(wal, world, lambda r, n: call("search", n, q="ab"[n % 2]), no_progress_steps=3)
    result = await loop.run("find it")
    assert result.stop is StopReason.NO_PROGRESS and result.steps == 4
    assert world.calls == ["search:b", "search:a", "search:b", "search:a"]


async def test_the_step_budget(wal: FileWAL) -> None:
    world = World()
    loop, seen = make_loop(wal, world, lambda r, n: call("notes.write", n, key=f"k{n}", text="t"), max_steps=3)
    result = await loop.run("write")
    assert result.stop is StopReason.STEP_BUDGET and len(seen) == 3 and result.steps == 3
    assert world.undone == ["k3", "k2", "k1"] and world.notes == {}


async def test_the_deadline_is_checked_before_every_model_and_tool_call(wal: FileWAL) -> None:
    world = World()
    clock = ManualClock()

    def slow(request: ModelRequest, n: int) -> HostAnswer:
        clock.advance(10)
        return call("notes.write", n, key=f"k{n}", text="t")

    loop, seen = make_loop(wal, world, slow, deadline=15, clock=clock)
    result = await loop.run("write slowly")
    assert result.stop is StopReason.DEADLINE and "before the call of notes.write" in result.detail
    assert len(seen) == 2 and world.calls == ["write:k1"] and world.notes == {}
    assert stopped(wal, result.saga_id)[0]["seconds"] == 20


async def test_a_routing_refusal_stops_the_run_as_refused(wal: FileWAL) -> None:
    world = World()
    loop, seen = make_loop(wal, world, lambda r, n: answer("x"), context_tokens=50)
    result = await loop.run("a goal far too long for this host " * 20)
    assert result.stop is StopReason.REFUSED and "context window 50 tokens" in result.detail
    assert seen == [] and stopped(wal, result.saga_id)[0]["reason"] == "REFUSED"


async def test_a_malformed_action_is_repaired_once_then_refused(wal: FileWAL) -> None:
    world = World()
    loop, seen = make_loop(wal, world, lambda r, n: call("no.such.tool", n))
    result = await loop.run("call something")
    assert result.stop is StopReason.REFUSED and len(seen) == 2


async def test_a_failing_tool_is_reported_to_the_model_not_fatal(wal: FileWAL) -> None:
    world = World()

    def script(request: ModelRequest, n: int) -> HostAnswer:
        if n == 1:
            return call("notes.write", n, key="k")  # missing text: the tool raises
        assert request.messages[-1].role == "tool" and request.messages[-1].content.startswith("error: TypeError")
        return answer("gave up politely")

    loop, _ = make_loop(wal, world, script)
    result = await loop.run("write")
    assert result.stop is StopReason.DONE and result.answer == "gave up politely"


def test_bad_arguments_are_refused_naming_the_field(wal: FileWAL) -> None:
    world = World()
    router = Router(Route([CallableHost("h", lambda r: "x", Capabilities(context_tokens=100))]), wal=wal)
    with pytest.raises(ConfigurationError, match="token_budget must be a positive number"):
        AgentLoop(router, token_budget=0)
    with pytest.raises(ConfigurationError, match="router must be a Router"):
        AgentLoop(object())
    with pytest.raises(ConfigurationError, match="COMPENSABLE but has no compensate"):
        LoopTool("w", world.write, "COMPENSABLE")


async def test_a_context_that_raises_is_a_recorded_stop_and_unwinds(wal: FileWAL) -> None:
    world = World()

    class Broken:
        served = 0

        def serve(self) -> object:
            Broken.served += 1
            if Broken.served == 2:
                raise KeyError("recall names chunk-9, which this broker does not hold")
            return type("Served", (), {"messages": (), "id": "s1"})()

    loop, _ = make_loop(wal, world, lambda r, n: call("notes.write", n, key="k", text="t"), context=Broken())
    result = await loop.run("write")
    assert result.stop is StopReason.FAILED and "KeyError" in result.detail
    assert world.undone == ["k"] and stopped(wal, result.saga_id)[0]["reason"] == "FAILED"
