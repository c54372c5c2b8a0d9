"""Disaster drills: the failures operators fear, rehearsed on real parts.

A real kube-apiserver + etcd, the operator process, a Redis of the module's own and an
agent process (``operator_agent.py``: the runtime library only, never the Kubernetes
API). Each drill proves one runbook page (docs/runbooks/drill-*.md) and reports its
numbers on stdout (``DRILL <name>: ...``; run with ``-s`` to see them): how long until the
policy plane was whole again, and what the agent refused meanwhile.

One fleet serves the module (a namespace, Redis, the operator, one agent, a KillSwitch,
a BudgetLimit, a SagaPolicy and a ModelRoute): each drill starts from a healthy fleet and
leaves one behind, in file order (the last one replaces the operator by the previous
release's, installs that release's chart and CRDs, and upgrades them to this tree's).
The intervals are short (resync 1 s, marker check 2 s, the agent's kill-switch reads
0.2 s apart and a grace window of 1 s); nothing waits for wall-clock time to pass,
everything polls with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import previous_release
import pytest
import redis
from agent_saga.audit.checkpoints import generate_signing_key
from agent_saga.controls.approvals._signing import approver_header
from agent_saga.errors import WALCorrupt
from agent_saga.history import COMPLETED, saga_states
from agent_saga.wal.file import read_log
from agent_saga_operator.models import GROUP, VERSION
from agent_saga_operator.testing import OperatorProcess, install_crds, poll
from chart_helpers import CHART, CHART_CRDS, Helm
from e2e_namespaces import namespace
from fixtures.controlplane import KubeCluster
from fixtures.redis_server import RedisServer
from kubernetes import client
from kubernetes.client.rest import ApiException
from test_chart_apiserver import uninstall
from test_operator_agents import (
    ANSWERED,
    DEADLINE,
    ROOT,
    Agent,
    apply,
    approvals,
    get,
    switch,
    until_call,
)

pytestmark = pytest.mark.e2e

P = "agentsaga:v1"
MARKER = f"{P}:synced"
PROJECTED = ("killswitch", "budgetlimit", "sagapolicy", "modelroute")
ORDINARY = "notes.write"  # a tool no KillSwitch nor BudgetLimit here names
GRACE = 1.0  # seconds the agent honours its last known levers once the plane is lost
APPROVER = "risk@corp"  # signs CLI decisions with a key the operator publishes


# ---------------------------------------------------------------------- the fleet
class Fleet:
    """The module's namespace, Redis, operator and agent."""

    def __init__(self, kube: KubeCluster, ns: str, server: RedisServer, tmp: Path) -> None:
        self.kube, self.ns, self.server, self.tmp = kube, ns, server, tmp
        self.r = redis.Redis.from_url(server.url, decode_responses=True)
        operator_key, _ = generate_signing_key(tmp / "operator.pem")
        self.approver_key, public = generate_signing_key(tmp / "risk.pem")
        Path(public).write_text(approver_header([APPROVER]) + Path(public).read_text())
        self.args = ["--standalone", "--resync-interval", "1", "--usage-interval", "0.5", "--retry-delay", "0.5",
                     "--approval-poll-interval", "0.5", "--health-host", "127.0.0.1",
                     "--approval-signing-key", operator_key, "--approval-keys", public]
        self.starts = 0
        self.op = self.start_operator()
        self.agent = Agent(server.url, ns, tmp / "agent", grace=GRACE)
        self.known: set[str] = set()  # Approvals seen so far

    def start_operator(self) -> OperatorProcess:
        self.starts += 1
        op = OperatorProcess(self.kube.kubeconfig, self.server.url, self.tmp / f"operator-{self.starts}.log",
                             namespaces=[self.ns], extra_args=self.args)
        op.start()
        op.wait_ready()
        return op

    def enforcing(self, *, halted: str = "wire.send", over: int = 1000) -> None:
        """The agent refuses ``halted`` (a KillSwitch) and a ledger.post of ``over`` (the
        BudgetLimit), and runs an ordinary call."""
        until_call(self.agent, False, self.op, tool=halted, amount=1)
        until_call(self.agent, False, self.op, tool="ledger.post", amount=over)
        ordinary = self.agent.send("call", tool=ORDINARY, amount=1)
        assert ordinary["ok"], ordinary

    def whole(self) -> None:
        """The plane carries the operator's marker, and the agent trusts it."""
        poll(lambda: self.r.hexists(MARKER, "operator") and trusted(self.agent), timeout=DEADLINE,
             what="the plane whole and trusted")

    def docs(self) -> dict[str, dict[str, Any]]:
        """Every projected document of the namespace (``<slug>:<ns>/<name>`` -> it, without its rev)."""
        return {k: {f: v for f, v in d.items() if f != "rev"} for k, d in self.raw_docs().items()}

    def revs(self) -> dict[str, int]:
        return {k: int(d["rev"]) for k, d in self.raw_docs().items()}

    def raw_docs(self) -> dict[str, dict[str, Any]]:
        out = {}
        for slug in PROJECTED:
            for id_ in self.r.smembers(f"{P}:{slug}:index"):  # type: ignore[union-attr]
                raw = self.r.get(f"{P}:{slug}:{id_}")
                if str(id_).startswith(f"{self.ns}/") and raw is not None:
                    out[f"{slug}:{id_}"] = json.loads(raw)  # type: ignore[arg-type]
        return out

    def ask(self, name: str, amount: int) -> tuple[int, str]:
        """An IRREVERSIBLE call that waits for a human: (its ticket, its Approval's name)."""
        ticket = self.agent.submit("call", name=name, tool="wire.final", semantics="IRREVERSIBLE", amount=amount,
                                   approval_timeout=ANSWERED)
        return ticket, self.new_approval()

    def new_approval(self) -> str:
        found = poll(lambda: [a["metadata"]["name"] for a in approvals(self.kube, self.ns)
                              if a["metadata"]["name"] not in self.known], timeout=DEADLINE, what="a new Approval")
        assert len(found) == 1, found
        self.known.add(found[0])
        return str(found[0])

    def decide(self, name: str, decision: str) -> None:
        self.kube.kubectl("patch", "-n", self.ns, "approval", name, "--type=merge", "-p",
                          json.dumps({"spec": {"decision": decision, "approver": APPROVER}}))

    def no_duplicate_approvals(self) -> None:
        assert sorted(a["metadata"]["name"] for a in approvals(self.kube, self.ns)) == sorted(self.known)


@pytest.fixture(scope="module")
def fleet(crds: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    tmp = tmp_path_factory.mktemp("drills")
    server = RedisServer(tmp / "redis").start()
    made: Fleet | None = None
    try:
        with namespace(crds, "dr") as ns:
            made = Fleet(crds, ns, server, tmp)
            apply(crds, ns, switch("halt-wires", "Halt", {"tool": "wire.send"}))
            apply(crds, ns, budget("ledger", 100, ["ledger.*"]))
            for example in ("policy.yaml", "modelroute.yaml"):
                apply(crds, ns, ROOT / "examples/k8s" / example)
            made.enforcing()
            made.whole()
            yield made
    finally:
        if made is not None:
            made.agent.close()
            made.op.stop()
            made.r.close()
        server.close()


def budget(name: str, max_total: int, tools: list[str]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "BudgetLimit", "metadata": {"name": name},
            "spec": {"kind": "Budget", "arg": "amount", "maxTotal": max_total, "window": "1h", "tools": tools}}


def trusted(agent: Agent) -> bool:
    """The agent's kill switch and limits read the plane as authoritative."""
    st = agent.send("status")
    return st["switch"]["data_lost"] is None and st["limits"]["data_lost"] is None and st["switch"]["connected"]


class Gap:
    """Calls made while the policy plane is not whole: the halted tool and the call over
    the limit must be refused every time; an ordinary call is counted (allowed during the
    agent's grace window, refused after it: the kill switch fails closed)."""

    def __init__(self, agent: Agent, *, halted: str, over: int) -> None:
        self.agent, self.halted, self.over = agent, halted, over
        self.allowed = self.refused = self.held = 0
        self.reasons: set[str] = set()  # why ordinary calls were refused

    def round(self) -> None:
        halted = self.agent.send("call", tool=self.halted, amount=1)
        assert not halted["ok"], f"{self.halted} ran during the gap: a halt was lifted by the loss"
        over = self.agent.send("call", tool="ledger.post", amount=self.over)
        assert not over["ok"], "a call over the BudgetLimit ran during the gap: a limit was lifted by the loss"
        self.held += 2
        ordinary = self.agent.send("call", tool=ORDINARY, amount=1)
        if ordinary["ok"]:
            self.allowed += 1
        else:
            self.refused += 1
            self.reasons.add(ordinary["error"])

    def until(self, done: Callable[[], bool], what: str) -> float:
        """Call rounds until ``done()`` (at least one; a round's failure is the test's); the seconds it took."""
        began = time.monotonic()
        while True:
            self.round()
            if done():
                return time.monotonic() - began
            if time.monotonic() - began >= DEADLINE:
                raise AssertionError(f"{what}: not within {DEADLINE:.0f}s")
            time.sleep(0.05)  # the polling interval between rounds

    def failed_closed_as_documented(self) -> None:
        """Every ordinary refusal is the kill switch failing closed once its grace passed."""
        for why in self.reasons:
            assert f"grace window of {GRACE:g}s has passed" in why and "fails closed" in why, why

    def numbers(self) -> dict[str, int]:
        return {"rounds": self.allowed + self.refused, "halted_or_over_refused": self.held,
                "ordinary_allowed": self.allowed, "ordinary_refused": self.refused}


def report(name: str, **numbers: Any) -> None:
    print(f"\nDRILL {name}: " + ", ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in numbers.items()))


# ---------------------------------------------------------------------- the operator down
READS = 8  # kill-switch reads 0.2 s apart: longer than the agent's grace window


def test_drill_operator_down(fleet: Fleet) -> None:
    """docs/runbooks/drill-operator-down.md: the operator is killed. The agent keeps
    enforcing the last state past every window it keeps (none depends on the operator);
    an approval decided with the CLI meanwhile takes effect at once and shows on its
    Approval when the operator is back; a request made meanwhile becomes an Approval;
    nothing is lost, rewritten or duplicated."""
    fleet.enforcing()
    by_cli, a_cli = fleet.ask("by-cli", 1)
    by_kubectl, a_kubectl = fleet.ask("by-kubectl", 2)
    docs, revs = fleet.docs(), fleet.revs()
    fleet.op.kill()
    stopped = time.monotonic()

    start = fleet.agent.send("status")["switch"]["reloads"]
    gap = Gap(fleet.agent, halted="wire.send", over=1000)
    gap.until(lambda: fleet.agent.send("status")["switch"]["reloads"] >= start + READS,
              f"{READS} kill-switch reads without an operator")
    assert gap.refused == 0, f"an ordinary call was refused while only the operator was down: {gap.reasons}"

    env = {**os.environ, "AGENT_SAGA_APPROVAL_STORE": fleet.server.url}
    cli = subprocess.run([sys.executable, "-m", "agent_saga.cli", "approvals", "approve", a_cli, "--approver",
                          APPROVER, "--signing-key", fleet.approver_key], capture_output=True, text=True, env=env,
                         timeout=60)
    assert cli.returncode == 0, cli.stderr
    done = fleet.agent.wait(by_cli, timeout=ANSWERED)
    assert done["ok"], f"a CLI decision needs no operator: {done}"
    meanwhile = fleet.agent.submit("call", name="meanwhile", tool="wire.final", semantics="IRREVERSIBLE", amount=3,
                                   approval_timeout=ANSWERED)
    poll(lambda: fleet.r.zcard(f"{P}:approval:pending") == 2, timeout=DEADLINE, what="the new request pending")
    down = time.monotonic() - stopped

    fleet.op = fleet.start_operator()
    back = time.monotonic()
    a_meanwhile = fleet.new_approval()
    mirrored = time.monotonic() - back

    def shown() -> dict[str, Any] | None:
        st = get(fleet.kube, fleet.ns, "approvals", a_cli).get("status") or {}
        return st if st.get("phase") == "Approved" and st.get("approver") == APPROVER else None
    poll(shown, timeout=DEADLINE, what="the CLI's decision shown on its Approval")
    fleet.decide(a_kubectl, "Approved")
    assert fleet.agent.wait(by_kubectl, timeout=ANSWERED)["ok"]
    fleet.decide(a_meanwhile, "Denied")
    denied = fleet.agent.wait(meanwhile, timeout=ANSWERED)
    assert not denied["ok"] and APPROVER in denied["error"], denied
    fleet.no_duplicate_approvals()
    assert fleet.docs() == docs and fleet.revs() == revs, "the returning operator rewrote nothing"
    fleet.enforcing()
    report("operator-down", down_s=down, kill_switch_reads=READS, request_mirrored_s=mirrored, **gap.numbers())


# ---------------------------------------------------------------------- FLUSHALL
def test_drill_redis_loses_everything(fleet: Fleet) -> None:
    """docs/runbooks/drill-redis-flushed.md: FLUSHALL. Every resource is projected again
    and the approver keys published again; the pending approval is restored (the agent
    waiting on it stores it again; the Approval is the same object); the halt and the
    limit hold throughout, other calls fail closed once the grace window has passed;
    nothing is approved by the loss."""
    fleet.whole()
    waiting, name = fleet.ask("wire-final", 900)
    r = fleet.r
    before, keys = fleet.docs(), r.hgetall(f"{P}:approval:keys")
    assert len(before) == 4 and len(keys) == 2, (before, keys)

    r.flushall()
    gap = Gap(fleet.agent, halted="wire.send", over=1000)
    marker_back = gap.until(lambda: bool(r.hexists(MARKER, "operator")), "the operator's marker back after FLUSHALL")
    trust_back = marker_back + gap.until(lambda: trusted(fleet.agent), "the agent trusting the plane again")

    assert fleet.docs() == before, "every resource projected again, as it was"
    gap.failed_closed_as_documented()
    poll(lambda: r.hgetall(f"{P}:approval:keys") == keys, timeout=DEADLINE, what="the approver keys published")
    # The request is back, still pending, with no decision: nothing was approved by the
    # loss, and the Approval is the one made before it.
    poll(lambda: r.zscore(f"{P}:approval:pending", name) is not None, timeout=DEADLINE,
         what="the pending request restored")
    assert not r.exists(f"{P}:approval:decision:{name}") and waiting not in fleet.agent.answers
    assert (get(fleet.kube, fleet.ns, "approvals", name).get("status") or {}).get("phase") == "Pending"
    fleet.no_duplicate_approvals()
    fleet.enforcing()

    fleet.decide(name, "Approved")
    answer = fleet.agent.wait(waiting, timeout=ANSWERED)
    assert answer["ok"], answer
    assert json.loads(r.get(f"{P}:approval:decision:{name}") or "{}").get("signature", {}).get("keyId")
    report("redis-flushed", marker_back_s=marker_back, agent_trusts_s=trust_back, **gap.numbers())


# ---------------------------------------------------------------------- an older snapshot
def test_drill_redis_restored_from_an_older_snapshot(fleet: Fleet) -> None:
    """docs/runbooks/drill-redis-old-snapshot.md: Redis restarts from an RDB saved before
    a second halt was engaged and the limit tightened. The agent lifts neither (it sees
    the plane went back in time); the operator notices, projects every resource again
    and sets a new marker; the agent then trusts the plane."""
    fleet.whole()
    r, server = fleet.r, fleet.server
    assert r.execute_command("SAVE") in (True, "OK")
    snapshot = fleet.tmp / "snapshot.rdb"
    shutil.copy(server.workdir / "dump.rdb", snapshot)
    stale = r.hget(MARKER, "operator")

    apply(fleet.kube, fleet.ns, switch("halt-payouts", "Halt", {"tool": "payout.send"}))
    fleet.kube.kubectl("patch", "-n", fleet.ns, "budgetlimit", "ledger", "--type=merge", "-p",
                       json.dumps({"spec": {"maxTotal": 50}}))
    fleet.enforcing(halted="payout.send", over=60)
    after = fleet.docs()
    rev = int(r.get(f"{P}:rev") or 0)
    poll(lambda: f"agentsaga_operator_plane_rev {float(rev)}" in fleet.op.metrics(), timeout=DEADLINE,
         what="the operator's marker check has seen the latest change")

    server.stop()
    shutil.copy(snapshot, server.workdir / "dump.rdb")
    server.start()
    assert int(r.get(f"{P}:rev") or 0) < rev and r.hget(MARKER, "operator") == stale

    gap = Gap(fleet.agent, halted="payout.send", over=60)
    marker_back = gap.until(lambda: (m := r.hget(MARKER, "operator")) is not None and m != stale,
                            "a new marker from the operator")
    trust_back = marker_back + gap.until(lambda: trusted(fleet.agent), "the agent trusting the plane again")

    assert fleet.docs() == after, "what changed since the snapshot is projected again"
    gap.failed_closed_as_documented()
    fleet.enforcing(halted="payout.send", over=60)
    assert "went back in time" in fleet.op.log(200_000)
    assert 'agentsaga_operator_plane_reprojections_total{cause="went_back"} 1.0' in fleet.op.metrics()
    # Whether the agent itself saw the old plane depends on whether it read Redis before the
    # operator projected again (it may never hold the stale state at all); either way the gap
    # above proved it lifted nothing. Its own detection is proven deterministically by
    # tests/integration/test_killswitch_marker.py.
    report("redis-old-snapshot", marker_back_s=marker_back, agent_trusts_s=trust_back, **gap.numbers())


# ---------------------------------------------------------------------- helm upgrade
RELEASE = "agent-saga-prev"
KINDS = "killswitches,budgetlimits,sagapolicies,modelroutes,approvals"


def test_drill_helm_upgrade_from_the_previous_release(fleet: Fleet) -> None:
    """docs/runbooks/drill-helm-upgrade.md: the previous release of the chart is installed
    with its CRDs, and its operator runs from the old sources. There are no release tags:
    the previous release is commit a07a9ff (``previous_release.PREVIOUS``), the last
    change to charts/ on main's first-parent history before the current chart, rendered
    with ``git archive``; the upgrade from it changes the SagaPolicy CRD (compensate.callArgs
    and values, which Helm would not apply) and the operator. With a halt engaged, a request pending and a saga in flight, the
    upgrade is done as docs/install.md says (the new CRDs applied, then ``helm upgrade``)
    and the old operator is replaced by the current one while the agent keeps calling.
    The halt and the limit hold at every call; the request stays pending, is decided once
    (as the approver the chart binds: its admission policy is in force) and runs once; the
    saga finishes once, nothing compensated; no resource, projected document or Approval
    is duplicated or lost; every resource's conditions are as they were, for its generation."""
    kube, ns, r = fleet.kube, fleet.ns, fleet.r
    fleet.whole()
    old = previous_release.unpack(fleet.tmp / "previous")
    helm = Helm(fleet.tmp / "helm", kube.kubeconfig)
    binding = json.dumps([{"namespace": ns, "role": "approver", "users": [APPROVER]}])
    fleet.op.kill()  # the fleet's operator makes way for the previous release's
    current = drilled = False
    try:
        # The cluster as the previous release left it: its CRDs, its chart, its operator
        # (started while helm installs: it runs with the admin's kubeconfig, not the chart's).
        kube.kubectl("apply", "--server-side", "--force-conflicts", "-f", str(old / "charts/agent-saga/crds"))
        assert not new_crds(kube), "the previous release's CRDs"
        fleet.op = old_operator(fleet, old)
        helm.run("install", RELEASE, str(old / "charts/agent-saga"), "--namespace", ns,
                 "--set-json", f"approvals.roles.bindings={binding}")
        fleet.op.wait_ready()
        fleet.whole()
        fleet.enforcing()
        saga = fleet.agent.send("open", saga="across-upgrade")
        assert saga["ok"], saga
        assert fleet.agent.send("step", saga="across-upgrade", tool=ORDINARY, amount=1)["ok"]
        waiting, name = fleet.ask("across-upgrade", 7)
        objects, docs, revs, before = resources(kube, ns), fleet.docs(), fleet.revs(), conditions(kube, ns)

        # The upgrade, as docs/install.md says, while the agent keeps calling.
        gap = Gap(fleet.agent, halted="wire.send", over=1000)
        with calling(gap):
            kube.kubectl("apply", "--server-side", "-f", str(CHART_CRDS))
            helm.run("upgrade", RELEASE, str(CHART), "--namespace", ns,
                     "--set-json", f"approvals.roles.bindings={binding}")
            fleet.op.stop()
            began = time.monotonic()
            fleet.op, current = fleet.start_operator(), True
            rev = float(r.get(f"{P}:rev") or 0)
            poll(lambda: f"agentsaga_operator_plane_rev {rev}" in fleet.op.metrics(), timeout=DEADLINE,
                 what="the new operator has checked the plane")
        fleet.whole()
        ready = time.monotonic() - began
        assert gap.refused == 0, f"an ordinary call was refused during the upgrade: {gap.reasons}"
        assert new_crds(kube), "the new CRDs are applied"
        assert "STATUS: deployed" in helm.run("status", RELEASE, "--namespace", ns).stdout

        fleet.enforcing()  # the halt and the limit still hold
        assert (get(kube, ns, "approvals", name).get("status") or {}).get("phase") == "Pending"
        assert r.zscore(f"{P}:approval:pending", name) is not None and waiting not in fleet.agent.answers
        as_approver = client.CustomObjectsApi(kube.api_client(user=APPROVER, group="system:authenticated"))
        approve = {"spec": {"decision": "Approved", "approver": APPROVER}}
        poll(lambda: refusal(as_approver, ns, name, approve, dry_run=True) is None, timeout=DEADLINE,
             what=f"{APPROVER} may decide (the chart's approver binding)")
        assert refusal(as_approver, ns, name, approve) is None
        answer = fleet.agent.wait(waiting, timeout=ANSWERED)
        assert answer["ok"], answer
        again = refusal(as_approver, ns, name, {"spec": {"decision": "Denied", "approver": APPROVER}})
        assert again is not None and again.status == 422, f"a decided Approval was decided again: {again}"

        assert fleet.agent.send("step", saga="across-upgrade", tool=ORDINARY, amount=1)["ok"]
        assert fleet.agent.send("close", saga="across-upgrade")["ok"]
        records = wal_records(fleet)
        states = saga_states(records)
        across, approved = states[saga["saga"]], states[answer["saga"]]
        assert across.status == COMPLETED and len(across.steps) == 2, across
        assert approved.status == COMPLETED and len(approved.steps) == 1, approved
        kinds = [rec.type for rec in records if rec.saga in (saga["saga"], answer["saga"])]
        assert kinds.count("STEP_COMMITTED") == 3 and kinds.count("SAGA_COMPLETED") == 2, kinds
        assert not [k for k in kinds if k.startswith("COMPENSATION")], kinds
        fleet.no_duplicate_approvals()
        assert resources(kube, ns) == objects, "no resource duplicated or lost by the upgrade"
        assert fleet.docs() == docs and fleet.revs() == revs, "every projected document as it was, not rewritten"
        assert conditions(kube, ns) == before, "every resource's conditions as they were"
        # Gap.round fails the test at the first halted call that runs: reaching here, none did.
        report("helm-upgrade", halted_ran=0, to_ready_s=ready, **gap.numbers())
        drilled = True
    finally:
        uninstall(helm, kube, RELEASE, ns, check=False)
        if not drilled:  # the drill failed: leave the current CRDs to the later modules
            install_crds(kube.kubectl, kube.api_client())
        if not current:  # ... and a current operator to the fleet
            fleet.op.stop()
            fleet.op = fleet.start_operator()


def old_operator(fleet: Fleet, old: Path) -> OperatorProcess:
    """The previous release's operator (its sources only), on the fleet's Redis and
    arguments, started (not yet ready)."""
    op = OperatorProcess(fleet.kube.kubeconfig, fleet.server.url, fleet.tmp / "operator-previous.log",
                         namespaces=[fleet.ns], extra_args=fleet.args)
    op.env["PYTHONPATH"] = previous_release.pythonpath(old)
    return op.start()


@contextlib.contextmanager
def calling(gap: Gap) -> Iterator[None]:
    """Call rounds in a thread for as long as the block runs (at least one); a round's
    failure is the test's."""
    stop, failed = threading.Event(), []

    def rounds() -> None:
        try:
            while True:
                gap.round()
                if stop.wait(0.05):  # the polling interval between rounds
                    return
        except BaseException as e:  # noqa: BLE001 - re-raised in the test's thread
            failed.append(e)

    thread = threading.Thread(target=rounds, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(DEADLINE)
    if failed:
        raise failed[0]


def new_crds(kube: KubeCluster) -> bool:
    """The SagaPolicy CRD has compensate.callArgs (new since the previous release)."""
    return "callArgs" in kube.kubectl("get", "crd", "sagapolicies.agentsaga.dev", "-o", "json").stdout


def resources(kube: KubeCluster, ns: str) -> list[str]:
    return sorted(kube.kubectl("get", KINDS, "-n", ns, "-o", "name").stdout.split())


def refusal(api: Any, ns: str, name: str, body: dict[str, Any], *, dry_run: bool = False) -> ApiException | None:
    """The API server's refusal of a patch of Approval ``name``, or None when admitted."""
    try:
        api.patch_namespaced_custom_object(GROUP, VERSION, ns, "approvals", name, body,
                                           **({"dry_run": "All"} if dry_run else {}))
    except ApiException as e:
        return e
    return None


def wal_records(fleet: Fleet) -> list[Any]:
    items = list(read_log(fleet.tmp / "agent" / "agent.wal"))
    damaged = [rec for _, rec in items if isinstance(rec, WALCorrupt)]
    assert not damaged, damaged
    return [rec for _, rec in items]


def conditions(kube: KubeCluster, ns: str) -> dict[str, dict[str, tuple[str, str]]]:
    """Every resource but the Approvals: its conditions (type -> status, reason), each for
    the generation it holds; Synced (projected into the plane) is true."""
    out = {}
    for obj in json.loads(kube.kubectl("get", KINDS.rsplit(",", 1)[0], "-n", ns, "-o", "json").stdout)["items"]:
        st, what = obj.get("status") or {}, f"{obj['kind']}/{obj['metadata']['name']}"
        assert st.get("observedGeneration") == obj["metadata"]["generation"], (what, st)
        out[what] = {c["type"]: (c["status"], c["reason"]) for c in st.get("conditions") or ()}
        assert out[what].get("Synced", ("",))[0] == "True", (what, st)
    return out
