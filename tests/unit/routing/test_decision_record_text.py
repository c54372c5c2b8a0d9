"""The decision record built from a route's screened texts is the record the ordinary path
writes: the same bytes, so the same digest, the same readers, and no secret in either.

A screened route keeps its host names, models and the verdicts built from them as text
scrubbed once; what is new to a call (a host's error, a breaker's reason, the context id,
the saga, a host's usage) is scrubbed per record on the WAL's flusher. Each test here
compares that text with ``canonical_json(scrub_payload(decision.to_doc()))``: what the
flusher made of the document before.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga import FileWAL
from agent_saga.chain import RESERVED_SAGA, verify_records
from agent_saga.context import saga_id_var
from agent_saga.controls.breaker import BreakerPolicy
from agent_saga.errors import WALError
from agent_saga.mesh import MeshWAL
from agent_saga.records import canonical_json
from agent_saga.routing import (
    CallableHost,
    Candidate,
    Capabilities,
    Constraints,
    HostAnswer,
    Message,
    ModelRequest,
    Route,
    Router,
    RoutingDecision,
    RoutingRefused,
    Usage,
)
from agent_saga.routing._record import decision_payload
from agent_saga.scrubber import REDACTED, scrub_payload
from agent_saga.wal.file import iter_file_records
from agent_saga.wal.prepared import PreparedPayload

DECISION = "ROUTING_DECISION"
STRIPE = "sk_live_51HxYzAbCdEfGhIjKlMnOpQr"
AWS = "AKIAIOSFODNN7EXAMPLE"
GOOD = HostAnswer('{"ok": true}', usage=Usage(12, 3))


class Flaky:
    """A host function that fails ``n`` times, then answers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __call__(self, request: ModelRequest) -> HostAnswer:
        if self.n > 0:
            self.n -= 1
            raise RuntimeError("upstream 502: bad gateway")
        return GOOD


def fleet(first: Flaky | None = None) -> list[CallableHost]:
    return [
        CallableHost("tiny", lambda r: GOOD, Capabilities(16, json_mode=True), model="tiny-1"),
        CallableHost("dear", lambda r: GOOD, Capabilities(8192, json_mode=True, cost_class="High")),
        CallableHost("flaky", first or Flaky(0), Capabilities(8192, json_mode=True, cost_class="Low")),
        CallableHost("main", lambda r: GOOD, Capabilities(8192, tools=True, json_mode=True, cost_class="Low")),
        CallableHost("spare", lambda r: GOOD, Capabilities(8192, json_mode=True, cost_class="Low")),
    ]


def ask(words: int) -> ModelRequest:
    return ModelRequest((Message("user", "slot " * words),), json_mode=True, max_tokens=16)


def ordinary(decision: RoutingDecision, saga: str | None) -> str:
    doc = decision.to_doc()
    doc["saga"] = saga
    return canonical_json(scrub_payload(doc, DECISION, RESERVED_SAGA))


@contextlib.contextmanager
def in_saga(saga: str | None) -> Iterator[None]:
    token = saga_id_var.set(saga)
    try:
        yield
    finally:
        saga_id_var.reset(token)


def decisions() -> Iterator[tuple[str, Route, RoutingDecision]]:
    """Real decisions of every kind of verdict, on one reused route."""
    route = Route(fleet(Flaky(2)), constraints=Constraints(max_cost_class="Medium"))
    router = Router(route, wal=None, breaker=BreakerPolicy(failure_threshold=1, cool_down=300))
    yield "failed, then chosen", route, router.complete(ask(3)).decision
    yield "breaker open", route, router.complete(ask(4)).decision
    yield "too big for one", route, router.complete(ask(40), context=f"ctx-{AWS}").decision
    try:
        router.complete(ask(5000))
    except RoutingRefused as refused:
        yield "refused by all", route, refused.decision
    # Verdicts the router never builds itself: a host's own words with credentials in them,
    # usage that is not integers. They must be scrubbed all the same.
    odd = (Candidate("tiny", "tiny-1", 1, "failed", (f"error: key {STRIPE}",), elapsed_ms=1.5),
           Candidate("dear", "dear", 2, "breaker", (f"password=hunter2 {AWS}",)),
           Candidate("flaky", "flaky", 3, "chosen", (), Usage(12.5, 3), 0.25),  # type: ignore[arg-type]
           Candidate("main", "main", 4, "refused", ("context window 1 tokens < 9 the call needs",)))
    yield "hand-built", route, RoutingDecision("c-1", route.to_doc(), {"tokens": 9, "context_tokens": 9,
                                                                        "tools": False, "json_mode": True,
                                                                        "max_cost_class": None},
                                               odd, "flaky", "ab" * 32, f"ctx {STRIPE}", 2)
    # A chosen verdict without timing or usage, and needs that are not the router's own
    # measures (a key it never writes, holding a credential): encoded as the document is.
    bare = (Candidate("tiny", "tiny-1", 1, "chosen"), Candidate("dear", "dear", 2, "chosen", (), Usage(4, 2), 0.5))
    yield "hand-built needs", route, RoutingDecision("c-2", route.to_doc(), {"tokens": 9, "context_tokens": 9,
                                                                              "tools": False, "json_mode": True,
                                                                              "max_cost_class": "Low",
                                                                              "note": f"key {STRIPE}"},
                                                     bare, "tiny", "cd" * 32, None, 1)


@pytest.mark.parametrize("saga", [None, "refund-42", f"pay-{AWS}"])
def test_the_text_is_byte_for_byte_what_the_ordinary_path_writes(saga: str | None) -> None:
    seen = set()
    for name, route, d in decisions():
        assert route.screened
        text = decision_payload(d, route, DECISION, saga).text()
        assert text == ordinary(d, saga), name
        assert STRIPE not in text and AWS not in text and "hunter2" not in text, name
        seen |= {c.outcome for c in d.candidates}
    assert seen == {"chosen", "failed", "breaker", "refused", "untried"}


def test_decisions_on_disk_verify_and_read_back_as_their_documents(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "routing.wal")
    route = Route(fleet(Flaky(1)), constraints=Constraints(max_cost_class="Medium"))
    router = Router(route, wal=wal)
    made = []
    with in_saga("refund-42"):
        made.append(router.complete(ask(3)).decision)
        made.append(router.complete(ask(30), context=f"ctx-{STRIPE}").decision)
    with pytest.raises(RoutingRefused) as refused:
        router.complete(ask(9000))
    made.append(refused.value.decision)
    wal.close()
    raw = (tmp_path / "routing.wal").read_text()
    assert STRIPE not in raw
    items = list(iter_file_records(tmp_path / "routing.wal"))
    assert verify_records(items).ok
    got = [r.payload for _, r in items if r.type in (DECISION, "ROUTING_REFUSED")]
    sagas = ["refund-42", "refund-42", None]
    assert [canonical_json(p) for p in got] == [ordinary(d, s) for d, s in zip(made, sagas, strict=True)]
    assert got[1]["context"] == f"ctx-{REDACTED}"
    assert [c["outcome"] for c in got[0]["candidates"]] == ["refused", "refused", "failed", "chosen", "untried"]


def test_a_route_whose_names_the_scrubber_would_touch_takes_the_ordinary_path(tmp_path: Path) -> None:
    hosts = [CallableHost("leaky", lambda r: GOOD, Capabilities(8192, json_mode=True), model=f"m-{STRIPE}")]
    route = Route(hosts)
    assert not route.screened
    wal = FileWAL(tmp_path / "routing.wal")
    d = Router(route, wal=wal).complete(ask(3)).decision
    wal.close()
    raw = (tmp_path / "routing.wal").read_text()
    assert STRIPE not in raw and f"m-{REDACTED}" in raw
    [rec] = [r for _, r in iter_file_records(tmp_path / "routing.wal") if r.type == DECISION]
    assert canonical_json(rec.payload) == ordinary(d, None)


def test_a_wrapping_wal_gets_the_decision_through_its_own_append(tmp_path: Path) -> None:
    mesh = MeshWAL(tmp_path, "tablet-1")
    d = Router(Route(fleet()), wal=mesh).complete(ask(3)).decision
    mesh.close()
    [rec] = [r for _, r in iter_file_records(mesh.path) if r.type == DECISION]
    stamp = rec.payload.pop("mesh")
    assert stamp["device"] == "tablet-1"
    assert canonical_json(rec.payload) == ordinary(d, None)


def test_a_prepared_payload_that_cannot_be_built_is_rejected_and_the_log_goes_on(tmp_path: Path) -> None:
    def broken() -> str:
        raise TypeError("a value that has no JSON form")

    wal = FileWAL(tmp_path / "routing.wal")
    bad = wal.append_prepared(DECISION, RESERVED_SAGA, None, PreparedPayload(broken))
    with pytest.raises(WALError, match="rejected"):
        wal.barrier_sync(bad)
    after = wal.append_prepared(DECISION, RESERVED_SAGA, None, PreparedPayload('{"call":"c-2"}'))
    wal.barrier_sync(after)
    wal.close()
    items = list(iter_file_records(tmp_path / "routing.wal"))
    assert verify_records(items).ok
    assert [(r.seq, r.type) for _, r in items] == [(bad, "RECORD_REJECTED"), (after, DECISION)]
    assert items[0][1].payload["original_type"] == DECISION
    assert items[1][1].payload == {"call": "c-2"}


def test_a_requests_canonical_text_is_canonical_json_of_its_document() -> None:
    from agent_saga.routing import Tool, ToolCall

    call = ToolCall("c1", "book", '{"slot": "tue"}')
    variants = [
        ModelRequest((Message("user", "hi"),)),
        ModelRequest((Message("system", 'quotes " \\ é \u2028 \n\t\x01'), Message("user", "")), json_mode=True,
                     max_tokens=256),
        ModelRequest((Message("user", "book it"), Message("assistant", "", (call,)),
                      Message("tool", "booked", tool_call_id="c1", name="book")),
                     tools=(Tool("book", "Book a slot", {"type": "object", "properties": {"slot": {"type": "string"}}}),),
                     stop=("\n\n", "END"), max_tokens=9),
    ]
    for r in variants:
        assert r.canonical_text() == canonical_json(r.to_doc())
        # the size the router screens by is the documented estimate, message by message
        from agent_saga.routing import estimate_tokens

        assert r.prompt_tokens() == sum(estimate_tokens(m.content) + 4 for m in r.messages) + (
            estimate_tokens(json.dumps([t.to_doc() for t in r.tools])) if r.tools else 0)


class Swap:
    """A route source whose route is replaced, as a reloaded ModelRoute replaces it."""

    def __init__(self, route: Route) -> None:
        self.current = route

    def route(self) -> Route:
        return self.current


def edited(generation: int, a_cost: str, a_model: str) -> Route:
    hosts = [CallableHost("a", lambda r: GOOD, Capabilities(8192, json_mode=True, cost_class=a_cost), model=a_model),
             CallableHost("b", lambda r: GOOD, Capabilities(8192, json_mode=True, cost_class="Low"), model="b-1"),
             CallableHost("c", lambda r: GOOD, Capabilities(8192, json_mode=True, cost_class="Low"), model="c-1")]
    return Route(hosts, constraints=Constraints(max_cost_class="Medium"), id="payments/route", uid="u-1",
                 generation=generation)


def test_an_edited_route_decides_the_next_call_and_writes_its_record_not_a_remembered_one(tmp_path: Path) -> None:
    source = Swap(edited(1, "Low", "a-1"))
    wal = FileWAL(tmp_path / "routing.wal")
    router = Router(source, wal=wal)
    made = [router.complete(ask(3)).decision for _ in range(2)]  # the second reads the route's tables
    # The same call shape on the edited route: every table and text is the new route's.
    source.current = edited(2, "High", "a-2")
    made.append(router.complete(ask(3)).decision)
    # An edit in place of the route's identity is recorded too (the route's text is not reused).
    source.current.generation = 3
    made.append(router.complete(ask(3)).decision)
    wal.close()
    items = list(iter_file_records(tmp_path / "routing.wal"))
    assert verify_records(items).ok
    got = [r.payload for _, r in items if r.type == DECISION]
    assert [canonical_json(p) for p in got] == [ordinary(d, None) for d in made]
    assert [p["route"]["generation"] for p in got] == [1, 1, 2, 3]
    assert [p["chosen"] for p in got] == ["a", "a", "b", "b"]
    first = got[2]["candidates"][0]
    assert (first["model"], first["outcome"], first["reasons"]) == (
        "a-2", "refused", ["cost class High is above the Medium allowed"])
    assert got[2]["candidates"][2]["reasons"] == ["eligible; b answered first"]
    assert got[1]["candidates"][1]["reasons"] == ["eligible; a answered first"]
