"""The router's per-route screening tables and the durability of its decision records.

Screening is prepared once per route and call shape (tool calling, JSON mode, cost
class) and kept with the route; only the context window is compared per call. These
tests check that what a call is told never comes from an earlier call of another size or
shape, and that a decision is durable exactly when the documentation says: with the next
fence of the WAL by default, before ``complete`` returns with ``durable=True``.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
from agent_saga import FileWAL
from agent_saga.errors import WALStalled
from agent_saga.routing import (
    CallableHost,
    Capabilities,
    Constraints,
    HostAnswer,
    Message,
    ModelRequest,
    Route,
    Router,
    Tool,
    Usage,
)
from engine_support import read, wal_fixture  # noqa: F401

ANSWER = HostAnswer('{"ok": true}')


def fleet() -> list[CallableHost]:
    return [
        CallableHost("small", lambda r: ANSWER, Capabilities(40, json_mode=True, cost_class="Free")),
        CallableHost("plain", lambda r: ANSWER, Capabilities(4096, cost_class="Free")),
        CallableHost("dear", lambda r: ANSWER, Capabilities(4096, tools=True, json_mode=True, cost_class="High")),
        CallableHost("good", lambda r: ANSWER, Capabilities(4096, tools=True, json_mode=True, cost_class="Low")),
        CallableHost("spare", lambda r: ANSWER, Capabilities(4096, tools=True, json_mode=True, cost_class="Low")),
    ]


def ask(words: int, *, json_mode: bool = False, tools: bool = False) -> ModelRequest:
    return ModelRequest((Message("user", "slot " * words),), json_mode=json_mode,
                        tools=(Tool("book"),) if tools else ())


def reasons(router: Router, request: ModelRequest, constraints: Constraints | None = None) -> dict[str, tuple]:
    d = router.complete(request, constraints=constraints).decision
    return {c.host: (c.outcome, c.reasons) for c in d.candidates}


def test_each_call_is_screened_for_its_own_size_and_shape_on_a_reused_route() -> None:
    route = Route(fleet(), constraints=Constraints(max_cost_class="Medium"))
    router = Router(route, wal=None)
    calls = [(ask(1), None), (ask(30), None), (ask(1, json_mode=True), None), (ask(30, tools=True), None),
             (ask(1), Constraints(require_tools=True)), (ask(30, json_mode=True), Constraints(min_context_tokens=100)),
             (ask(1), None)]
    for request, constraints in calls * 2:  # the second pass reads every table the first one built
        fresh = Router(Route(fleet(), constraints=Constraints(max_cost_class="Medium")), wal=None)
        assert reasons(router, request, constraints) == reasons(fresh, request, constraints)
    # the context reason names this call's size, never a remembered one
    for words in (40, 60):
        needed = ask(words).needed_tokens()
        assert reasons(router, ask(words))["small"] == ("refused", (f"context window 40 tokens < {needed} the call "
                                                                    f"needs",))
    got = reasons(router, ask(1, json_mode=True, tools=True), Constraints(min_context_tokens=100))
    assert got["small"] == ("refused", ("context window 40 tokens < 100 the route requires",
                                        "no tool calling, and the call offers tools"))
    assert got["plain"] == ("refused", ("no tool calling, and the call offers tools",
                                        "no JSON mode, and the call asks for JSON"))
    assert got["dear"] == ("refused", ("cost class High is above the Medium allowed",))
    assert got["good"][0] == "chosen" and got["spare"] == ("untried", ("eligible; good answered first",))
    route_tools = reasons(router, ask(1), Constraints(require_tools=True, require_json_mode=True))
    assert route_tools["plain"] == ("refused", ("no tool calling, and the route requires tools",
                                                "no JSON mode, and the route requires JSON mode"))


def wedged_wal(tmp_path: Path, stall: float) -> tuple[FileWAL, threading.Event]:
    """A FileWAL whose flusher waits before every fdatasync until the event is set."""
    release = threading.Event()

    def hook(point: str) -> None:
        if point == "before_sync":
            release.wait(30)

    return FileWAL(tmp_path / "wedged.wal", stall_timeout=stall, fault_hook=hook), release


def test_by_default_a_decision_is_in_the_chain_at_once_and_durable_with_the_next_fence(tmp_path: Path) -> None:
    wal, release = wedged_wal(tmp_path, 30)
    try:
        router = Router(Route(fleet()), wal=wal)
        response = router.complete(ask(1))           # returns while the disk is wedged
        assert response.host == "small"
        seq = wal.stats().appended_seq
        assert wal.stats().durable_seq < seq         # appended (seq fixed), not yet durable
        release.set()
        wal.barrier_sync()                           # e.g. the next step's intent
        assert wal.stats().durable_seq >= seq
        [rec] = [r for r in read(wal, "wal") if r.type == "ROUTING_DECISION"]
        assert rec.seq == seq and rec.payload["call"] == response.decision.id
    finally:
        release.set()
        wal.close()


def test_durable_router_returns_only_once_the_decision_is_fsynced(wal) -> None:
    router = Router(Route(fleet()), wal=wal, durable=True)
    response = router.complete(ask(1))
    stats = wal.stats()
    assert stats.durable_seq == stats.appended_seq and stats.syncs >= 1
    [rec] = [r for r in read(wal, "wal") if r.type == "ROUTING_DECISION"]
    assert rec.payload["call"] == response.decision.id


def test_durable_router_raises_when_the_decision_cannot_be_made_durable(tmp_path: Path) -> None:
    wal, release = wedged_wal(tmp_path, 0.2)
    try:
        router = Router(Route(fleet()), wal=wal, durable=True)
        with pytest.raises(WALStalled):
            router.complete(ask(1))                  # no answer is handed back unrecorded
        with pytest.raises(WALStalled):
            router.complete(ask(1))                  # nor later, on a log known to be wedged
    finally:
        release.set()
        with contextlib.suppress(WALStalled):        # close of a stalled writer says so too
            wal.close()


def test_windows_smaller_than_the_call_are_refused_whatever_their_rank_and_other_reasons() -> None:
    hosts = [
        CallableHost("wide", lambda r: ANSWER, Capabilities(4096, json_mode=True)),
        CallableHost("mid", lambda r: ANSWER, Capabilities(100, json_mode=True)),
        CallableHost("tiny", lambda r: ANSWER, Capabilities(50)),
        CallableHost("mid2", lambda r: ANSWER, Capabilities(100, json_mode=True)),
        CallableHost("edge", lambda r: ANSWER, Capabilities(104, json_mode=True)),
    ]
    router = Router(Route(hosts), wal=None)
    request = ask(80, json_mode=True)  # 400 characters + 4: 104 tokens
    assert request.needed_tokens() == 104
    need = "context window {} tokens < 104 the call needs"
    got = reasons(Router(Route(hosts[1:] + hosts[:1]), wal=None), request)
    assert got == {"mid": ("refused", (need.format(100),)),
                   "tiny": ("refused", (need.format(50), "no JSON mode, and the call asks for JSON")),
                   "mid2": ("refused", (need.format(100),)),
                   "edge": ("chosen", ()),
                   "wide": ("untried", ("eligible; edge answered first",))}
    assert reasons(router, ask(1, json_mode=True))["tiny"] == ("refused", ("no JSON mode, and the call asks for JSON",))
    assert [c.outcome for c in router.complete(request).decision.candidates] == [
        "chosen", "refused", "refused", "refused", "untried"]


def test_the_router_hands_back_the_public_types_with_every_field_as_their_constructors_set_it() -> None:
    import dataclasses

    from agent_saga.routing import Candidate, ModelResponse, RoutingDecision
    from agent_saga.routing._decision import new_candidate, new_decision, new_response

    c = new_candidate("h", "m", 2, "chosen", (), Usage(3, 4), 1.5)
    assert c == Candidate("h", "m", 2, "chosen", (), Usage(3, 4), 1.5) and type(c) is Candidate
    assert repr(c) == repr(Candidate("h", "m", 2, "chosen", (), Usage(3, 4), 1.5))
    d = new_decision("id", {"id": None}, {"tokens": 1}, (c,), "h", "00", None, 1)
    assert d == RoutingDecision("id", {"id": None}, {"tokens": 1}, (c,), "h", "00", None, 1)
    r = new_response("x", (), "stop", Usage(), "h", "m", d, (d,), None)
    assert r == ModelResponse("x", (), "stop", Usage(), "h", "m", d, (d,), None) and type(r) is ModelResponse
    with pytest.raises(dataclasses.FrozenInstanceError):
        c.rank = 3  # type: ignore[misc]
    response = Router(Route(fleet()), wal=None).complete(ask(20))
    assert type(response) is ModelResponse and type(response.decision) is RoutingDecision
    assert {type(x) for x in response.decision.candidates} == {Candidate}
    for obj in (response, response.decision, *response.decision.candidates):  # every field set, and a copy equal
        assert dataclasses.replace(obj) == obj and dataclasses.asdict(obj) == dataclasses.asdict(dataclasses.replace(obj))
