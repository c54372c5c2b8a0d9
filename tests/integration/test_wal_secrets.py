"""The secret scrubber runs at every backend's record codec: planted keys never reach the
stored bytes of a FileWAL file, a Redis stream or a PostgreSQL table, and the chain of what
was stored still verifies."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from _wal_backends import Harness, harness_for

PLANTED = ("sk_live_51HxYzAbCdEfGhIjKlMnOpQr", "AKIAIOSFODNN7EXAMPLE", "hunter2")


@pytest.fixture(params=["file", "redis", "postgres"])
def h(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_for(request.param, request, tmp_path) as harness:
        yield harness


async def test_planted_keys_never_reach_the_store(h: Harness) -> None:
    wal = h.open()
    wal.append("SAGA_STARTED", "s-1", None, {"name": "pay", "tags": [PLANTED[0]]})
    wal.append("STEP_COMMITTED", "s-1", "s-1/0", {
        "compensation": {"handler": "stripe.refund", "kwargs": {"charge": "ch_1"},
                         "description": f"refund with {PLANTED[1]}"},
    })
    wal.append("SAGA_QUARANTINED", "s-1", None, {"reason": "the db password=hunter2 leaked", "by": "ops"})
    await wal.barrier()
    wal.close()
    stored = "\n".join(str(loc) + repr(item.to_dict()) for loc, item in h.chain())
    for secret in PLANTED:
        assert secret not in stored, secret
    recs = h.records()
    assert recs[0].payload["tags"] == ["[REDACTED]"]
    assert recs[1].payload["compensation"]["kwargs"] == {"charge": "ch_1"}
    assert recs[2].payload["reason"] == "the db password=[REDACTED] leaked"
    assert h.verify().ok


async def test_a_routing_decision_prepared_from_screened_parts_is_stored_scrubbed_and_verifies(h: Harness) -> None:
    """A router's record takes the prepared path (its text built on the flusher from the
    route's screened parts) on every backend, and what is new to the call is scrubbed."""
    from agent_saga.routing import CallableHost, Capabilities, Message, ModelRequest, Route, Router

    def broken(request: ModelRequest) -> str:
        raise RuntimeError(f"upstream 401 for key {PLANTED[0]}")

    caps = Capabilities(4096)
    route = Route([CallableHost("first", broken, caps), CallableHost("second", lambda r: "ok", caps)])
    assert route.screened
    wal = h.open()
    decision = Router(route, wal=wal).complete(ModelRequest((Message("user", "hi"),)),
                                               context=f"ctx-{PLANTED[1]}").decision
    await wal.barrier()
    wal.close()
    stored = "\n".join(str(loc) + repr(item.to_dict()) for loc, item in h.chain())
    for secret in PLANTED:
        assert secret not in stored, secret
    [rec] = [r for r in h.records() if r.type == "ROUTING_DECISION"]
    assert rec.payload["call"] == decision.id and rec.payload["context"] == "ctx-[REDACTED]"
    assert [(c["host"], c["outcome"]) for c in rec.payload["candidates"]] == [("first", "failed"),
                                                                             ("second", "chosen")]
    assert h.verify().ok
