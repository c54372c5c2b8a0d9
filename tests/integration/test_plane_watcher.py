"""One agent's policy-plane readers share one watcher (``agent_saga.controls._planewatch``):
one subscription and one ``P:rev`` backstop for the kill switch, SagaPolicy and
BudgetLimit readers, instead of a thread, a subscription and a backstop each.

What the sharing must not lose: a change whose notification never arrived is still read
by the backstop, for every kind; a lost pub/sub connection still fails every reader
closed and every reader reads again; closing one reader leaves the others watched."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga.controls.killswitch import Lever
from agent_saga.gates import StepRequest
from agent_saga.plane import PlaneConnection, open_plane
from agent_saga.semantics import ActionSemantics
from agent_saga.wal import FileWAL
from agent_saga_operator.testing import poll
from fixtures.redis_server import PLANE_ENV, PLANE_PREFIX, RedisServer

pytestmark = [pytest.mark.integration, pytest.mark.single_redis("kills one server's pub/sub clients")]

P = PLANE_PREFIX
PROBE = StepRequest("probe", "probe/0", "wire.send", ActionSemantics.REVERSIBLE)


def env(url: str, **more: str) -> dict[str, str]:
    return {"AGENT_SAGA_REDIS_URL": url, "AGENT_SAGA_NAMESPACE": "payments", "AGENT_SAGA_AGENT": "payments-agent",
            "POD_NAME": "pod-1", **PLANE_ENV, **more}


@pytest.fixture
def admin(fresh_redis: RedisServer) -> Iterator[Any]:
    client = fresh_redis.client()
    client.hset(f"{P}:synced", "operator", "{}")  # as the operator's projection leaves it
    yield client
    client.close()


def agent_of(fresh_redis: RedisServer, tmp_path: Path, **more: str) -> PlaneConnection:
    return open_plane(env(fresh_redis.url, **more), wal=FileWAL(str(tmp_path / "agent.wal"), sync=False))


@pytest.fixture
def agent(admin: Any, fresh_redis: RedisServer, tmp_path: Path) -> Iterator[PlaneConnection]:
    conn = agent_of(fresh_redis, tmp_path)
    try:
        watched(conn)
        yield conn
    finally:
        conn.close()


def watched(conn: PlaneConnection) -> None:
    """Wait until the watcher subscribed and read every reader through its subscription
    (each reader's second read: the first is ``start``'s own)."""
    poll(lambda: all(r.reloads >= 2 for r in readers(conn).values()), timeout=30,
         what="the watcher's first read of every reader")


def readers(conn: PlaneConnection) -> dict[str, Any]:
    return {"KillSwitch": conn.switch_store, "SagaPolicy": conn.policy, "BudgetLimit": conn.limit_source}


def silent_write(admin: Any, slug: str, doc_id: str, doc: dict[str, Any]) -> int:
    """Write a document as the operator does, but publish no notification (one lost)."""
    rev = int(admin.get(f"{P}:rev") or 0) + 1
    with admin.pipeline(transaction=True) as tx:  # atomic, as the operator's projection
        tx.set(f"{P}:rev", rev)
        tx.set(f"{P}:{slug}:{doc_id}", json.dumps({"rev": rev, "v": 1, **doc}))
        tx.sadd(f"{P}:{slug}:index", doc_id)
        tx.execute()
    return rev


def halt_doc() -> dict[str, Any]:
    return Lever.new("Halt", "tool:wire.send", reason="fraud", by="soc@corp", now=time.time()).to_doc()


def notify(admin: Any, kind: str, doc_id: str) -> None:
    admin.publish(f"{P}:events", json.dumps({"v": 1, "kind": kind, "id": doc_id, "op": "put"}))


def test_one_watcher_serves_every_reader_of_an_agent(agent: PlaneConnection) -> None:
    watchers = {id(r._watcher) for r in readers(agent).values()}
    assert len(watchers) == 1 and None not in {r._watcher for r in readers(agent).values()}
    assert all(r._thread is None for r in readers(agent).values()), "a sharing reader runs no thread of its own"


@pytest.mark.parametrize(("kind", "slug"), [("KillSwitch", "killswitch"), ("SagaPolicy", "sagapolicy"),
                                            ("BudgetLimit", "budgetlimit")])
def test_a_lost_notification_is_read_by_the_shared_backstop(agent: PlaneConnection, admin: Any, kind: str,
                                                            slug: str) -> None:
    reader = readers(agent)[kind]
    doc = halt_doc() if kind == "KillSwitch" \
        else {"name": "silent"}
    rev = silent_write(admin, slug, "payments/silent", doc)
    poll(lambda: reader.applied_rev == str(rev), timeout=30,
         what=f"the {kind} reader re-reading at rev {rev} by the backstop (no notification was sent)")
    if kind == "KillSwitch":
        assert asyncio.run(agent.kill_switch.check(PROBE)) is not None, "the silent halt is in force"


def test_the_check_interval_sets_how_late_a_lost_notification_lands(admin: Any, fresh_redis: RedisServer,
                                                                     tmp_path: Path) -> None:
    """``AGENT_SAGA_PLANE_CHECK_INTERVAL`` is the tick of the agent's one backstop: an agent
    checking every 20 s still holds the old levers after a lost notification that an agent
    at the default (0.5 s) has long read."""
    slow = agent_of(fresh_redis, tmp_path, AGENT_SAGA_PLANE_CHECK_INTERVAL="20", POD_NAME="pod-slow")
    quick = open_plane(env(fresh_redis.url, POD_NAME="pod-quick"),
                       wal=FileWAL(str(tmp_path / "quick.wal"), sync=False))
    try:
        watched(slow)
        watched(quick)
        assert {r.heartbeat for r in readers(slow).values()} == {20.0}
        assert {r.heartbeat for r in readers(quick).values()} == {0.5}
        held = slow.switch_store.applied_rev
        rev = silent_write(admin, "killswitch", "payments/silent", halt_doc())
        poll(lambda: quick.switch_store.applied_rev == str(rev), timeout=15,
             what=f"the default agent's backstop reading rev {rev} (no notification was sent)")
        assert asyncio.run(quick.kill_switch.check(PROBE)) is not None
        assert slow.switch_store.applied_rev == held, "the 20 s agent has not checked yet"
        assert asyncio.run(slow.kill_switch.check(PROBE)) is None
        watcher = slow.switch_store._watcher
        assert watcher is not None and watcher.backstops == 0
        thread = watcher._thread
        assert thread is not None
        quick.close()
        slow.close()  # mid-wait: closing ends the thread's 20 s read of the subscription at once
        assert not thread.is_alive(), "a closed agent's watcher thread outlived its close"
        poll(lambda: not admin.client_list(_type="pubsub"), timeout=5, what="no subscription left open")
    finally:
        quick.close()
        slow.close()


def test_a_lost_pubsub_connection_fails_every_reader_closed_and_each_reads_again(
        admin: Any, fresh_redis: RedisServer, tmp_path: Path) -> None:
    conn = agent_of(fresh_redis, tmp_path, AGENT_SAGA_SWITCH_GRACE="0")
    try:
        seen: dict[str, list[tuple[bool, bool]]] = {k: [] for k in readers(conn)}
        usable = {"KillSwitch": lambda: conn.switch_store.view().usable, "SagaPolicy": lambda: conn.policy.view().usable,
                  "BudgetLimit": lambda: conn.limit_source.snapshot().usable}
        for kind, reader in readers(conn).items():
            # on the watcher's thread, after every read and every loss: what the control then does
            reader.add_listener(lambda k=kind, r=reader: seen[k].append((r.connected, usable[k]())))
        watched(conn)
        before = {k: r.reloads for k, r in readers(conn).items()}
        assert admin.client_kill_filter(_type="pubsub") == 1, "the agent's one pub/sub connection"
        poll(lambda: all(any(not c for c, _ in s) for s in seen.values()), timeout=30,
             what="every reader noting the lost subscription")
        # grace 0: the kill switch and the SagaPolicy reader refuse at once; the limits hold the last read
        assert (False, False) in seen["KillSwitch"] and (False, False) in seen["SagaPolicy"]
        poll(lambda: all(r.connected and r.reloads > before[k] for k, r in readers(conn).items()), timeout=30,
             what="every reader reading again on a new subscription")
        assert all(s[-1] == (True, True) for s in seen.values()), seen
    finally:
        conn.close()


def test_one_reader_closed_leaves_the_others_watched(agent: PlaneConnection, admin: Any) -> None:
    watcher = agent.switch_store._watcher
    routes = agent.route_source()  # a fourth reader joins the agent's watcher
    assert routes._watcher is watcher and routes in watcher.readers
    routes.close()
    assert routes not in watcher.readers
    closed_reloads = routes.reloads
    # a notified ModelRoute change first, then a notified halt: once the halt is read, the
    # ModelRoute notification (delivered before it) has been handled too
    silent_write(admin, "modelroute", "payments/after-close", {"name": "after-close"})
    notify(admin, "ModelRoute", "payments/after-close")
    rev = silent_write(admin, "killswitch", "payments/halt", halt_doc())
    notify(admin, "KillSwitch", "payments/halt")
    poll(lambda: asyncio.run(agent.kill_switch.check(PROBE)) is not None, timeout=30,
         what="the kill switch, still watched, reading the halt")
    poll(lambda: agent.policy.applied_rev == str(rev), timeout=30,
         what="the SagaPolicy reader, still watched, reaching the halt's rev by its backstop")
    assert routes.reloads == closed_reloads, "a closed reader is never read again"


def test_a_notification_reloads_only_the_readers_of_its_kind(agent: PlaneConnection, admin: Any) -> None:
    # no write: P:rev does not move, so the backstop reads nothing; only notifications do
    before = {k: r.reloads for k, r in readers(agent).items()}
    notify(admin, "SagaPolicy", "payments/named")
    notify(admin, "KillSwitch", "payments/named")
    poll(lambda: agent.policy.reloads > before["SagaPolicy"] and agent.switch_store.reloads > before["KillSwitch"],
         timeout=30, what="the SagaPolicy and kill switch readers reading on their notifications")
    assert agent.limit_source.reloads == before["BudgetLimit"], "no BudgetLimit was named: it was not read"


def written(admin: Any, slug: str, doc_id: str, doc: dict[str, Any], kind: str) -> int:
    """Write a document and notify it with its rev, in one transaction, as the operator's
    projection does (``{"rev": N, "kind": ..., ...}``)."""
    rev = int(admin.get(f"{P}:rev") or 0) + 1
    with admin.pipeline(transaction=True) as tx:
        tx.set(f"{P}:rev", rev)
        tx.set(f"{P}:{slug}:{doc_id}", json.dumps({"rev": rev, "v": 1, **doc}))
        tx.sadd(f"{P}:{slug}:index", doc_id)
        tx.publish(f"{P}:events", json.dumps({"rev": rev, "v": 1, "kind": kind, "id": doc_id, "op": "put"}))
        tx.execute()
    return rev


def test_a_change_of_one_kind_costs_the_other_readers_no_read(agent: PlaneConnection, admin: Any) -> None:
    # one halt reaching an agent is one read: the SagaPolicy and BudgetLimit readers, which
    # held the rev just before it, move to its rev from the notification; the backstop
    # then finds them current instead of re-reading them (a thousand agents, a thousand reads)
    written(admin, "sagapolicy", "payments/first", {"name": "first"}, "SagaPolicy")  # every reader holds a rev
    poll(lambda: agent.policy.applied_rev == agent.limit_source.applied_rev == admin.get(f"{P}:rev").decode(),
         timeout=30, what="every reader at the current rev")
    before = {k: r.reloads for k, r in readers(agent).items()}
    rev = written(admin, "killswitch", "payments/halt", halt_doc(), "KillSwitch")
    poll(lambda: asyncio.run(agent.kill_switch.check(PROBE)) is not None, timeout=30, what="the halt read")
    watcher = agent.switch_store._watcher
    ticks = watcher.backstops
    poll(lambda: watcher.backstops >= ticks + 2, timeout=30, what="two backstop ticks after the halt")
    assert agent.policy.applied_rev == agent.limit_source.applied_rev == str(rev)
    assert agent.switch_store.reloads == before["KillSwitch"] + 1
    assert (agent.policy.reloads, agent.limit_source.reloads) == (before["SagaPolicy"], before["BudgetLimit"]), \
        "the readers a halt does not concern were read again"


def test_a_gap_in_the_revs_is_read_not_passed(agent: PlaneConnection, admin: Any) -> None:
    # a SagaPolicy written without a notification (rev r+1), then a notified halt (r+2) in
    # the same transaction: the SagaPolicy reader holds r, not r+1, so the halt's
    # notification does not move it; the backstop reads it and finds the silent policy
    written(admin, "sagapolicy", "payments/first", {"name": "first"}, "SagaPolicy")
    poll(lambda: agent.policy.applied_rev == admin.get(f"{P}:rev").decode(), timeout=30,
         what="the SagaPolicy reader at the current rev")
    before = agent.policy.reloads
    rev = int(admin.get(f"{P}:rev")) + 2
    with admin.pipeline(transaction=True) as tx:
        tx.set(f"{P}:sagapolicy:payments/silent", json.dumps({"rev": rev - 1, "v": 1, "name": "silent"}))
        tx.sadd(f"{P}:sagapolicy:index", "payments/silent")
        tx.set(f"{P}:killswitch:payments/halt", json.dumps({"rev": rev, "v": 1, **halt_doc()}))
        tx.sadd(f"{P}:killswitch:index", "payments/halt")
        tx.set(f"{P}:rev", rev)
        tx.publish(f"{P}:events", json.dumps({"rev": rev, "v": 1, "kind": "KillSwitch", "id": "payments/halt",
                                              "op": "put"}))
        tx.execute()
    poll(lambda: agent.policy.reloads > before and agent.policy.applied_rev == str(rev), timeout=30,
         what="the SagaPolicy reader reading the silent write (not moved past it by the halt's notification)")


def test_a_plane_that_counts_again_reloads_every_reader(agent: PlaneConnection, admin: Any) -> None:
    # the SagaPolicy reader holds rev r; the server is restored to an older snapshot (rev
    # r-3, without that policy) and three halts follow (r-2, r-1, r), then one more (r+1):
    # the last names the rev just after the one the reader holds, but the revs went back
    # on the way, so the reader is read again, never moved to r+1 with the old policy
    written(admin, "sagapolicy", "payments/first", {"name": "first"}, "SagaPolicy")
    rev = written(admin, "sagapolicy", "payments/gone", {"name": "gone"}, "SagaPolicy")
    poll(lambda: agent.policy.applied_rev == str(rev), timeout=30, what="the SagaPolicy reader at the current rev")
    before = agent.policy.reloads
    with admin.pipeline(transaction=True) as tx:
        tx.delete(f"{P}:sagapolicy:payments/gone")
        tx.srem(f"{P}:sagapolicy:index", "payments/gone")
        for n in range(rev - 2, rev + 2):
            tx.set(f"{P}:killswitch:payments/halt-{n}", json.dumps({"rev": n, "v": 1, **halt_doc()}))
            tx.sadd(f"{P}:killswitch:index", f"payments/halt-{n}")
            tx.publish(f"{P}:events", json.dumps({"rev": n, "v": 1, "kind": "KillSwitch", "id": f"payments/halt-{n}",
                                                  "op": "put"}))
        tx.set(f"{P}:rev", rev + 1)
        tx.execute()
    poll(lambda: agent.policy.reloads > before, timeout=30,
         what="the SagaPolicy reader read again once the notified revs went back")
