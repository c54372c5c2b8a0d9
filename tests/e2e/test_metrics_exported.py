"""Every metric an alert rule or a dashboard panel uses is exported by a real component:
the operator (a process against the local control plane and a real Redis), recoveryd (a
process), and an agent process that called ``setup_metrics()``. Their ``/metrics`` are
scraped and compared with the names the queries use (tests/fixtures/monitoring.py); the
operator's state series are checked with a real BudgetLimit, KillSwitch and approval
request. The rules themselves: tests/unit/test_monitoring_rules.py."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga.controls import ApprovalGateway, ApprovalPolicy, RedisApprovalStore
from agent_saga.controls.approvals import decide_request
from agent_saga.controls.gate import PreFlightDecision
from agent_saga.gates import StepRequest
from agent_saga.semantics import ActionSemantics
from agent_saga.wal.file import FileWAL
from agent_saga_operator.models import API_VERSION
from agent_saga_operator.testing import OperatorProcess
from fixtures.binaries import REPO_ROOT
from fixtures.controlplane import KubeCluster
from fixtures.monitoring import exported_names, used_names
from fixtures.polling import until, until_async
from fixtures.redis_server import RedisServer

NS_PREFIX = "metrics"
PENDING = PreFlightDecision("REQUIRE_APPROVAL", "Action cannot be undone", "rule:irreversible", False, "rules")

#: An agent process: setup_metrics() on prometheus_client's registry, served on /metrics.
AGENT = textwrap.dedent("""
    import sys, threading
    import prometheus_client
    from agent_saga import setup_metrics
    setup_metrics()
    server, _ = prometheus_client.start_http_server(0, addr="127.0.0.1")
    with open(sys.argv[1] + ".tmp", "w") as f:
        f.write(str(server.server_port))
    import os; os.replace(sys.argv[1] + ".tmp", sys.argv[1])
    threading.Event().wait()
""")


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        return str(r.read().decode())


def sample(body: str, metric: str, **labels: str) -> float | None:
    """The value of the one sample ``metric`` with (at least) ``labels``, or None."""
    for line in body.splitlines():
        m = re.fullmatch(rf"{metric}\{{(.*)\}} (\S+)", line)
        if m and all(f'{k}="{v}"' in m.group(1) for k, v in labels.items()):
            return float(m.group(2))
    return None


def served(tmp_path: Path, name: str, argv: list[str]) -> Iterator[int]:
    """Run ``argv`` (which writes its port to ``<tmp_path>/<name>.port``); yield the port."""
    port_file = tmp_path / f"{name}.port"
    env = {"PYTHONPATH": ":".join(str(REPO_ROOT / d) for d in ("runtime", "recoveryd")), "PATH": "/usr/bin:/bin"}
    with open(tmp_path / f"{name}.log", "w") as out:
        proc = subprocess.Popen([*argv, str(port_file)], stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        yield until(f"{name}'s port", lambda: port_file.exists() and int(port_file.read_text()), proc=proc)
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def agent_port(tmp_path: Path) -> Iterator[int]:
    yield from served(tmp_path, "agent", [sys.executable, "-c", AGENT])


@pytest.fixture
def recoveryd_port(tmp_path: Path) -> Iterator[int]:
    FileWAL(tmp_path / "r.wal").close()
    yield from served(tmp_path, "recoveryd", [sys.executable, "-m", "agent_saga_recoveryd", "--wal-path",
                                              str(tmp_path / "r.wal"), "--metrics-port", "0", "--bind", "127.0.0.1",
                                              "--port-file"])


@pytest.fixture
def operator(crds: KubeCluster, fresh_redis: RedisServer, ns: str, tmp_path: Path) -> Iterator[OperatorProcess]:
    with OperatorProcess(crds.kubeconfig, fresh_redis.url, tmp_path / "operator.log", namespaces=[ns],
                         extra_args=["--standalone", "--usage-interval", "0.5", "--approval-poll-interval", "0.2",
                                     "--health-host", "127.0.0.1"]).running() as op:
        yield op


async def test_every_metric_a_rule_or_panel_uses_is_exported(
        crds: KubeCluster, ns: str, operator: OperatorProcess, fresh_redis: RedisServer, agent_port: int,
        recoveryd_port: int, tmp_path: Path) -> None:
    # The operator's state series, each from a real object: a BudgetLimit's use and cap,
    # an engaged KillSwitch's agents (none run here: 0 of 0), a pending approval request.
    crds.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": API_VERSION, "kind": "BudgetLimit", "metadata": {"name": "daily-spend"},
        "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 1000, "window": "24h"}}))
    crds.kubectl("apply", "-n", ns, "-f", "-", input=json.dumps({
        "apiVersion": API_VERSION, "kind": "KillSwitch", "metadata": {"name": "halt-wires"},
        "spec": {"action": "Halt", "scope": {"tool": "wire.send"}, "reason": "drill", "requestedBy": "soc@corp"}}))
    store = RedisApprovalStore(fresh_redis.url, owner=f"{ns}/agent-0")
    gw = ApprovalGateway(store, None, FileWAL(tmp_path / "a.wal"), ApprovalPolicy(timeout=600), poll=0.05,
                         namespace=ns)
    before = time.time()
    task = asyncio.create_task(gw.request_approval(
        StepRequest("s-1", "s-1/0", "wire.send", ActionSemantics.IRREVERSIBLE, {"amount": 5}, ()), PENDING))
    try:
        req = await until_async("the request", lambda: next(iter(store.list(pending_only=True)), None))
        assert req is not None
        body = await asyncio.to_thread(until, "the operator's state series", lambda: (
            (m := operator.metrics())
            and sample(m, "agentsaga_operator_budget_max", namespace=ns, name="daily-spend") == 1000
            and sample(m, "agentsaga_operator_agents", kind="KillSwitch", name="halt-wires", state="matched") == 0
            and sample(m, "agentsaga_operator_approval_deadline_timestamp_seconds", name=req.id) is not None
            and m))
        assert sample(body, "agentsaga_operator_budget_used", namespace=ns, name="daily-spend") == 0
        assert sample(body, "agentsaga_operator_agents", kind="KillSwitch", name="halt-wires", state="acknowledged") == 0
        asked = sample(body, "agentsaga_operator_approval_requested_timestamp_seconds", namespace=ns, name=req.id,
                       tool="wire.send")
        deadline = sample(body, "agentsaga_operator_approval_deadline_timestamp_seconds", name=req.id)
        assert asked is not None and deadline is not None
        assert before - 1 <= asked <= time.time() and deadline == pytest.approx(asked + 600, abs=1)
        # Decided (here by the CLI's path: the store), the request no longer waits.
        decide_request(store, req.id, approved=False, approver="risk@corp", now=time.time(), note="not today")
        await asyncio.to_thread(until, "the answered request gone from the metrics", lambda: sample(
            operator.metrics(), "agentsaga_operator_approval_deadline_timestamp_seconds", name=req.id) is None)
    except AssertionError as e:
        raise AssertionError(f"{e}\n--- operator log ---\n{operator.log()}") from None
    finally:
        task.cancel()
        store.close()

    exported = set()
    for body in (operator.metrics(), scrape(recoveryd_port), scrape(agent_port)):
        exported |= exported_names(body)
    used = used_names()
    missing = {name: sorted(where) for name, where in used.items() if name not in exported}
    assert not missing, f"used by the rules or the dashboard, exported by no component: {missing}"
    assert len(used) >= 20, sorted(used)  # the queries name what they use
