"""The example agents on a real node: a Deployment of three payments agents
(examples/payments/deployment.yaml) running sagas against the chart's in-cluster Redis,
and the recovery fleet behind them.

- the example KillSwitch (examples/k8s/killswitch.yaml, in the agents' namespace): every agent pod refuses wire.send;
  deleting it, every pod sends again;
- an agent pod force-deleted in the middle of a saga: a recoveryd pod refunds its charge,
  exactly once (the bank's own count of refund requests, not a balance), and no sweep of
  any replica touches it again;
- a recoveryd pod killed in the middle of those refunds (the bank holds them): the other
  replica takes its sagas over once its claims expire and finishes them; every charge is
  refunded once, and only the refunds the dead pod had started were requested twice,
  under the same idempotency key (what the key is for).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import yaml
from agent_saga import RedisWAL
from node_support import REPO_ROOT, Agents, Release, bank, pod_http, poll

KILLSWITCH = REPO_ROOT / "examples" / "k8s" / "killswitch.yaml"


def killswitch_in(namespace: str) -> str:
    """The example KillSwitch in ``namespace`` (the example names the one the example
    agents run in, next to the chart: agent-saga; these agents run in the release's)."""
    obj = yaml.safe_load(KILLSWITCH.read_text())
    assert obj["metadata"]["namespace"] == "agent-saga", obj["metadata"]
    obj["metadata"]["namespace"] = namespace
    return yaml.safe_dump(obj, sort_keys=False)
DONE = "{agent-saga}:recovery:done"  # recoveryd's ledger (keyNamespace agent-saga)
ATTEMPTS = "{agent-saga}:recovery:attempts"


def refused(agents: Agents, pod: str) -> bool:
    out = agents.http(pod, "/wire", {"amount": 1})
    return bool(out["kind"] == "GateBlocked" and "halt-wire-send" in out["error"])


def sends(agents: Agents, pod: str) -> bool:
    return bool(agents.http(pod, "/wire", {"amount": 1})["ok"])


def test_every_agent_obeys_the_kill_switch(agents: Agents) -> None:
    rel = agents.release
    pods = agents.pods()
    assert len(pods) >= 3
    # They run sagas against the in-cluster Redis on their own.
    before = {p: agents.stats(p) for p in pods}
    for p in pods:
        poll(lambda p=p: agents.stats(p)["ok"] > before[p]["ok"], what=f"{p} running sagas")
        assert sends(agents, p)
    rel.kubectl("apply", "-f", "-", input=killswitch_in(rel.namespace))
    try:
        for p in pods:
            poll(lambda p=p: refused(agents, p), what=f"{p} refusing wire.send")
        halted = {p: agents.stats(p)["refused"] for p in pods}
        for p in pods:  # its own payments too: refused at wire.send (and the charge refunded)
            poll(lambda p=p: agents.stats(p)["refused"] > halted[p], what=f"{p}'s payments refused")
            last = agents.stats(p)["last"]
            assert last["kind"] == "GateBlocked" and "fraud pattern on outbound wires" in last["error"], last
    finally:
        rel.kubectl("delete", "-f", "-", "--wait=true", input=killswitch_in(rel.namespace))
    for p in pods:
        poll(lambda p=p: sends(agents, p), what=f"{p} sending again")


def recoveryd_sweeps(rel: Release) -> dict[str, float]:
    """Completed sweeps of each recoveryd pod, from its /metrics."""
    out = {}
    for pod in rel.component_pods("recoveryd"):
        name = pod["metadata"]["name"]
        status, text = pod_http(rel.cluster, rel.namespace, name, "/metrics", port=9102)
        assert status == 200, text
        out[name] = sum(float(line.rsplit(" ", 1)[1]) for line in str(text).splitlines()
                        if line.startswith("agent_saga_recovery_sweeps_total{") and 'result="ok"' in line)
    return out


def wal_records(url: str, sagas: set[str]) -> list[Any]:
    async def read() -> list[Any]:
        wal = RedisWAL(url, key="agent-saga:wal", writer="node-e2e-reader")
        try:
            return [r async for r in wal.read_all() if r.saga in sagas]
        finally:
            wal.close()
    return asyncio.run(read())


def done_per_step(records: list[Any]) -> Counter[tuple[str, str]]:
    return Counter((r.saga, r.step) for r in records if r.type == "COMPENSATION_DONE")


def test_agent_killed_mid_saga_is_compensated_once(agents: Agents) -> None:
    rel = agents.release
    pod = agents.pods()[0]
    held = agents.http(pod, "/pay", {"amount": 7, "hold": True})
    assert held["ok"] and held["refund_key"], held
    key, saga = held["refund_key"], held["saga"]
    with rel.redis() as (r, url):
        assert r.hget(bank.CALLS, key) is None
        rel.kubectl("delete", "pod", pod, "--grace-period=0", "--force")
        poll(lambda: r.hget(bank.REFUNDS, key), what=f"recoveryd refunding {saga}")
        assert r.hget(bank.CALLERS, key).startswith(f"{rel.name}-recoveryd-")
        # Every replica sweeps twice more: nobody compensates it again.
        swept = recoveryd_sweeps(rel)
        poll(lambda: all(recoveryd_sweeps(rel).get(p, 0) >= n + 2 for p, n in swept.items()),
             what="two more sweeps by every recoveryd replica")
        assert r.hget(bank.CALLS, key) == "1"
        assert r.hexists(DONE, key)
        records = wal_records(url, {saga})
    assert done_per_step(records) == Counter({(saga, f"{saga}/0"): 1})
    assert [r.type for r in records if r.type.startswith("SAGA_ROLLED")] == ["SAGA_ROLLED_BACK"]
    agents.wait_ready()


def test_recoveryd_killed_mid_sweep_is_taken_over_and_compensates_once(agents: Agents) -> None:
    rel = agents.release
    with rel.redis() as (r, url):
        r.set(bank.PAUSED, "recoveryd kill test")  # every refund request now waits inside the handler
        try:
            victims = agents.pods()[:2]
            held = [agents.http(p, "/pay", {"amount": n, "hold": True}) for p in victims for n in (1, 2)]
            keys = {h["refund_key"]: h["saga"] for h in held}
            for p in victims:
                rel.kubectl("delete", "pod", p, "--grace-period=0", "--force")
            poll(lambda: all(r.hget(bank.CALLS, k) for k in keys), what="every refund requested (and held)")
            first = {k: r.hget(bank.CALLERS, k) for k in keys}
            killed = first[next(iter(keys))]
            rel.kubectl("delete", "pod", killed, "--grace-period=0", "--force")
            # Its claims expire (claimTtl 5 s) and another replica requests those refunds again.
            theirs = [k for k, c in first.items() if c == killed]
            poll(lambda: all(r.hget(bank.CALLS, k) == "2" and r.hget(bank.CALLERS, k) != killed for k in theirs),
                 what=f"the refunds {killed} had started taken over")
        finally:
            r.delete(bank.PAUSED)
        poll(lambda: all(r.hexists(DONE, k) for k in keys), what="every refund finished and in recoveryd's ledger")
        calls = {k: r.hget(bank.CALLS, k) for k in keys}
        assert {k: calls[k] for k in keys if first[k] != killed} == {k: "1" for k in keys if first[k] != killed}
        assert {k: calls[k] for k in theirs} == {k: "2" for k in theirs}
        assert {k: r.hget(ATTEMPTS, k) for k in keys} == calls
        assert None not in r.hmget(bank.REFUNDS, list(keys))
        records = wal_records(url, set(keys.values()))
    assert done_per_step(records) == Counter({(s, f"{s}/0"): 1 for s in keys.values()})
    agents.wait_ready()
    rel.wait_ready()
