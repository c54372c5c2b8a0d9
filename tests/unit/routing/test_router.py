"""The Router against real HTTP servers speaking the chat-completions protocol.

Each host is a ``ChatServer`` (tests/fixtures/openai_server.py) on a local port with a
scripted answer: 429, 5xx, a hang (timeout), a dripping stream (slow stream), a reply.
Every decision and refusal is read back from a real FileWAL: every candidate named, with
its reason.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga import set_credential_resolver
from agent_saga.controls.breaker import BreakerPolicy
from agent_saga.errors import ConfigurationError
from agent_saga.routing import (
    CallableHost,
    Capabilities,
    Constraints,
    HostAnswer,
    Message,
    ModelActionRefused,
    ModelRequest,
    OpenAIHost,
    Route,
    Router,
    RoutingRefused,
    Tool,
)
from engine_support import read, wal_fixture  # noqa: F401
from fixtures.openai_server import ChatServer

ASK = ModelRequest((Message("user", "Which slot is free?"),), max_tokens=64)
BIG = Capabilities(8192, tools=True, json_mode=True)


@pytest.fixture
def servers() -> Iterator[list[ChatServer]]:
    started = [ChatServer().start() for _ in range(3)]
    yield started
    for s in started:
        s.close()


def hosts(servers: list[ChatServer], **kw) -> list[OpenAIHost]:
    return [OpenAIHost(n, s.url, f"model-{n}", BIG, **kw) for n, s in zip(("a", "b", "c"), servers, strict=False)]


def records(wal, type_: str) -> list[dict]:
    return [r.payload for r in read(wal, "wal") if r.type == type_]


def test_it_fails_over_past_429_and_5xx_and_names_every_candidate(wal, servers) -> None:
    a, b, c = servers
    a.always(ChatServer.status(429, "slow down"))
    b.always(ChatServer.status(503, "overloaded"))
    c.always(ChatServer.reply("Tuesday 3pm", usage=(21, 4)))
    small = CallableHost("tiny", lambda r: "never", Capabilities(16, cost_class="Free"))
    router = Router(Route([small, *hosts(servers)]), wal=wal)
    response = router.complete(ASK)
    assert (response.content, response.host, response.model) == ("Tuesday 3pm", "c", "model-c")
    assert response.usage.to_doc() == {"prompt_tokens": 21, "completion_tokens": 4, "total_tokens": 25,
                                       "reported": True}
    d = response.decision
    assert [(x.host, x.outcome) for x in d.candidates] == [("tiny", "refused"), ("a", "failed"), ("b", "failed"),
                                                           ("c", "chosen")]
    assert d.candidate("tiny").reasons == (f"context window 16 tokens < {ASK.needed_tokens()} the call needs",)
    assert d.candidate("a").reason.startswith("rate_limited: 429 rate limited") and "slow down" in d.candidate("a").reason
    assert d.candidate("b").reason.startswith("server_error: 503") and "overloaded" in d.candidate("b").reason
    [rec] = records(wal, "ROUTING_DECISION")
    assert rec == {**d.to_doc(), "saga": None}
    assert [x["host"] for x in rec["candidates"]] == ["tiny", "a", "b", "c"]
    assert rec["candidates"][3]["usage"]["total_tokens"] == 25
    assert rec["prompt_sha256"] == d.prompt_sha256 and len(d.prompt_sha256) == 64
    assert [len(s.requests) for s in servers] == [1, 1, 1]


def test_a_host_that_does_not_answer_in_time_is_failed_over(wal, servers) -> None:
    a, b, _ = servers
    a.always(ChatServer.hang(30))
    b.always(ChatServer.reply("from b"))
    router = Router(Route(hosts(servers[:2])), wal=wal, timeout=0.3)
    response = router.complete(ASK)
    assert response.host == "b"
    failed = response.decision.candidate("a")
    assert failed.outcome == "failed" and failed.reason == "timeout: no answer within 0.3s"


def test_a_slow_stream_is_abandoned_and_failed_over(wal, servers) -> None:
    a, b, _ = servers
    a.always(ChatServer.drip(("Tues", "day"), seconds=30))
    b.always(ChatServer.reply("streamed from b", usage=(9, 3)))
    router = Router(Route(hosts(servers[:2], stream=True, stall_timeout=0.3)), wal=wal)
    response = router.complete(ASK)
    assert (response.host, response.content) == ("b", "streamed from b")
    assert response.usage.total_tokens == 12
    assert response.decision.candidate("a").reason == "slow_stream: the stream stalled: no chunk for 0.3s"
    assert a.requests[0]["body"]["stream"] is True


def test_every_failing_host_refuses_with_every_reason_recorded(wal, servers) -> None:
    for s, code in zip(servers, (429, 500, 502), strict=True):
        s.always(ChatServer.status(code))
    router = Router(Route(hosts(servers)), wal=wal)
    with pytest.raises(RoutingRefused) as err:
        router.complete(ASK)
    d = err.value.decision
    assert d.refused and [c.outcome for c in d.candidates] == ["failed"] * 3
    assert "refused: no host could answer" in str(err.value) and "a: failed (rate_limited" in str(err.value)
    [rec] = records(wal, "ROUTING_REFUSED")
    assert rec["chosen"] is None and [c["reasons"][0][:16] for c in rec["candidates"]] == [
        "rate_limited: 42", "server_error: 50", "server_error: 50"]
    assert records(wal, "ROUTING_DECISION") == []


PROJECTED = {  # a ModelRoute as the operator projects it (documents.model_route_doc)
    "v": 1, "kind": "ModelRoute", "uid": "uid-7", "generation": 3,
    "hosts": [
        {"name": "local-7b", "endpoint": "http://127.0.0.1:9/v1", "model": "llama",
         "capabilities": {"contextTokens": 4096, "tools": False, "jsonMode": False, "costClass": "Free"}},
        {"name": "frontier", "endpoint": "http://127.0.0.1:9/v1", "model": "big",
         "capabilities": {"contextTokens": 200000, "tools": True, "jsonMode": True, "costClass": "High"}},
    ],
    "preference": ["local-7b", "frontier"],
    "constraints": {"requireTools": True, "maxCostClass": "Medium"},
    "appliesTo": None,
}


def test_an_unsatisfiable_route_refuses_naming_every_candidate_and_reason(wal) -> None:
    route = Route.from_document({"id": "payments/default", **PROJECTED})
    router = Router(route, wal=wal)
    with pytest.raises(RoutingRefused) as err:
        router.complete(ASK)
    d = err.value.decision
    assert d.route == {"id": "payments/default", "uid": "uid-7", "generation": 3}
    assert {c.host: c.reasons for c in d.candidates} == {
        "local-7b": ("no tool calling, and the route requires tools",),
        "frontier": ("cost class High is above the Medium allowed",),
    }
    [rec] = records(wal, "ROUTING_REFUSED")
    assert [(c["host"], c["outcome"], c["reasons"]) for c in rec["candidates"]] == [
        ("local-7b", "refused", ["no tool calling, and the route requires tools"]),
        ("frontier", "refused", ["cost class High is above the Medium allowed"])]
    assert rec["route"]["generation"] == 3 and rec["needs"]["max_cost_class"] == "Medium"


def test_a_host_whose_breaker_opened_is_not_called_and_says_why(wal, servers) -> None:
    a, b, _ = servers
    a.always(ChatServer.status(500))
    b.always(ChatServer.reply("b"))
    router = Router(Route(hosts(servers[:2])), wal=wal, breaker=BreakerPolicy(failure_threshold=2, cool_down=300))
    for _ in range(2):
        assert router.complete(ASK).host == "b"
    third = router.complete(ASK).decision.candidate("a")
    assert third.outcome == "breaker" and third.reason.startswith("circuit breaker open for model:a")
    assert len(a.requests) == 2
    assert [r["circuit"] for r in records(wal, "BREAKER_OPENED")] == ["model:a"]


def test_a_malformed_json_answer_is_repaired_once(wal, servers) -> None:
    a = servers[0]
    a.push(ChatServer.reply("Sure! {not json"), ChatServer.reply('{"slot": "tue-15"}'))
    router = Router(Route(hosts(servers[:1])), wal=wal)
    response = router.complete(ModelRequest((Message("user", "slot?"),), json_mode=True))
    assert response.json() == {"slot": "tue-15"} and response.repaired.startswith("JSON mode was asked for")
    assert [d.attempt for d in response.decisions] == [1, 2]
    repair = a.requests[1]["body"]["messages"]
    assert repair[-2] == {"role": "assistant", "content": "Sure! {not json"}
    assert repair[-1]["content"].startswith("Your last answer could not be used: JSON mode was asked for")
    [rec] = records(wal, "MODEL_ACTION_REPAIRED")
    assert rec["call"] == response.decision.id and rec["host"] == "a"
    assert records(wal, "MODEL_ACTION_REFUSED") == []


def test_an_unknown_tool_twice_is_refused_and_both_are_logged(wal, servers) -> None:
    a = servers[0]
    a.always(ChatServer.reply("", tool_calls=(("wire_money", '{"to": "x"}'),)))
    request = ModelRequest((Message("user", "book it"),), tools=(Tool("book", "Book a slot"),))
    router = Router(Route(hosts(servers[:1])), wal=wal)
    with pytest.raises(ModelActionRefused) as err:
        router.complete(request)
    assert "'wire_money', which is not one of the tools offered (book)" in err.value.problem
    assert err.value.first_problem == err.value.problem and "nothing was acted on" in str(err.value)
    assert len(a.requests) == 2
    assert [r["problem"] for r in records(wal, "MODEL_ACTION_REPAIRED")] == [err.value.first_problem]
    [refused] = records(wal, "MODEL_ACTION_REFUSED")
    assert refused["problem"] == err.value.problem and refused["call"] == err.value.decision.id
    assert len(records(wal, "ROUTING_DECISION")) == 2


def test_tool_arguments_that_are_not_an_object_are_repaired(wal) -> None:
    answers = iter([HostAnswer(tool_calls=(_call("book", "[1, 2]"),)), HostAnswer(tool_calls=(_call("book", '{"at": 3}'),))])
    host = CallableHost("inproc", lambda r: next(answers), BIG)
    response = Router(Route([host]), wal=wal).complete(
        ModelRequest((Message("user", "book"),), tools=(Tool("book"),)))
    assert response.tool_calls[0].arguments == {"at": 3}
    assert response.repaired == "the arguments of its call of book are not a JSON object: '[1, 2]'"


def _call(name: str, args: str):
    from agent_saga.routing import ToolCall

    return ToolCall("c1", name, args)


def test_the_api_key_is_sent_and_never_recorded(wal, servers) -> None:
    key = "sk-proj-" + "Q7" * 24
    previous = set_credential_resolver(lambda ref: key if ref == "frontier-api-key" else None)
    try:
        servers[0].always(ChatServer.status(401, f"Incorrect API key provided: {key}"))  # servers echo keys
        servers[1].always(ChatServer.reply("ok"))
        route = Route(hosts(servers[:2], credential_ref="frontier-api-key"))
        response = Router(route, wal=wal).complete(ASK)
    finally:
        set_credential_resolver(previous)
    assert response.host == "b"
    assert [s.requests[0]["authorization"] for s in servers[:2]] == [f"Bearer {key}"] * 2
    assert response.decision.candidate("a").reason.startswith("client_error: 401")
    wal.barrier_sync()
    assert key not in Path(wal.path).read_text() and key not in json.dumps(response.decision.to_doc())


def test_constraints_of_the_call_tighten_the_route(wal) -> None:
    cheap = CallableHost("cheap", lambda r: "cheap", Capabilities(4096, cost_class="Low"))
    dear = CallableHost("dear", lambda r: "dear", Capabilities(4096, cost_class="High"))
    router = Router(Route([dear, cheap]), wal=wal)
    assert router.complete(ASK).host == "dear"
    d = router.complete(ASK, constraints=Constraints(max_cost_class="Low")).decision
    assert (d.chosen, d.candidate("dear").reasons) == ("cheap", ("cost class High is above the Low allowed",))
    assert [c.outcome for c in router.plan(ASK)] == ["untried", "untried"]


def test_bad_input_names_the_field_and_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="max_tokens must be a positive integer"):
        ModelRequest((Message("user", "x"),), max_tokens=0)
    with pytest.raises(ConfigurationError, match="stop must be a tuple of strings"):
        ModelRequest((Message("user", "x"),), stop="\n")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="role must be one of"):
        Message("robot", "x")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError, match="preference names 'z', which is not a host"):
        Route([CallableHost("a", str, BIG)], preference=["z"])
    with pytest.raises(ConfigurationError, match="must not carry credentials"):
        OpenAIHost("a", "https://user:pw@example.com/v1", "m", BIG)
    with pytest.raises(ConfigurationError, match="Router needs a Route"):
        Router([CallableHost("a", str, BIG)])  # type: ignore[arg-type]


def test_the_ir_reaches_the_wire_as_chat_completions(wal, servers) -> None:
    servers[0].always(ChatServer.reply("", tool_calls=(("book", '{"at": "tue-15"}'),), usage=(40, 7)))
    request = ModelRequest((Message("system", "Book."), Message("user", "Tuesday")),
                           tools=(Tool("book", "Book a slot", {"type": "object", "properties": {"at": {"type": "string"}}}),),
                           json_mode=True, max_tokens=99, stop=("END",))
    response = Router(Route(hosts(servers[:1])), wal=wal).complete(request)
    body = servers[0].requests[0]["body"]
    assert body == {"model": "model-a", "messages": [{"role": "system", "content": "Book."},
                                                     {"role": "user", "content": "Tuesday"}],
                    "tools": [{"type": "function", "function": {"name": "book", "description": "Book a slot",
                                                                "parameters": {"type": "object", "properties": {
                                                                    "at": {"type": "string"}}}}}],
                    "response_format": {"type": "json_object"}, "max_tokens": 99, "stop": ["END"]}
    assert [(c.name, c.arguments) for c in response.tool_calls] == [("book", {"at": "tue-15"})]
    assert response.finish_reason == "tool_calls" and response.usage.total_tokens == 47


def test_a_host_whose_circuit_cooled_down_gets_one_trial_call_and_is_back(wal, servers) -> None:
    from agent_saga.clocks import ManualClock
    from agent_saga.controls.breaker import CircuitBreaker

    a, b, _ = servers
    a.push(ChatServer.status(503)).always(ChatServer.reply("a is back"))
    b.always(ChatServer.reply("b"))
    clock = ManualClock()
    breaker = CircuitBreaker(BreakerPolicy(failure_threshold=1, cool_down=10), wal=wal, clock=clock)
    router = Router(Route(hosts(servers[:2])), wal=wal, breaker=breaker)
    assert router.complete(ASK).host == "b"                      # a failed: its circuit opened
    assert router.complete(ASK).decision.candidate("a").outcome == "breaker"
    clock.advance(11)
    assert router.complete(ASK).host == "a"                      # the trial call, answered
    assert [r.type for r in read(wal, "wal") if r.type.startswith("BREAKER")] == [
        "BREAKER_OPENED", "BREAKER_PROBE", "BREAKER_CLOSED"]
    assert len(a.requests) == 2


def test_a_decision_that_cannot_be_recorded_is_not_returned(tmp_path) -> None:
    from agent_saga import FileWAL
    from agent_saga.errors import WALClosed

    wal = FileWAL(tmp_path / "closed.wal")
    wal.close()
    router = Router(Route([CallableHost("inproc", lambda r: "an answer", BIG)]), wal=wal)
    with pytest.raises(WALClosed):
        router.complete(ASK)
