#!/usr/bin/env python3
"""`make demo-cluster`: the whole system, offline, in one command, narrated.

A local control plane (etcd + kube-apiserver, as the e2e tests start it), Redis, the
operator, two recovery daemons and three agents charging a local SQLite ledger. It
applies a BudgetLimit and a KillSwitch with kubectl, shows the agents refuse, lifts it,
kills an agent with SIGKILL mid-saga, shows the recovery fleet compensate it, and ends
with `agent-saga verify` and `certify` on every agent's log. Everything it started is
stopped at the end (or on Ctrl-C).
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "bench"), str(REPO / "operator"), str(REPO / "runtime")]

from bench_killswitch import start_redis  # noqa: E402

NS = "demo"
N_AGENTS = 3
T0 = time.monotonic()


def say(text: str = "", who: str = "demo") -> None:
    print(f"[{time.monotonic() - T0:6.1f}s] {who:>9} | {text}" if text else "", flush=True)


def shell(cmd: str, out: str) -> None:
    say(f"$ {cmd}", "you")
    for line in out.rstrip().splitlines():
        print(f"{'':20}{line}", flush=True)


def wait(cond: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: {what} did not happen within {timeout:.0f}s")
        time.sleep(0.1)


class Agent:
    def __init__(self, name: str, url: str, work: Path, ledger: Path, env: dict[str, str]) -> None:
        self.name = name
        self.wal = work / f"{name}.wal"
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.err = open(work / f"{name}.stderr", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, str(REPO / "hack" / "demo_fleet.py"), url, NS, str(self.wal),
                                      str(ledger), name], stdout=subprocess.PIPE, stderr=self.err, text=True,
                                     env=env)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                pass

    def drain(self) -> list[dict[str, Any]]:
        out = []
        while True:
            try:
                out.append(self.events.get_nowait())
            except queue.Empty:
                return out

    def next_event(self, pred: Callable[[dict[str, Any]], bool], timeout: float = 30) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                e = self.events.get(timeout=0.2)
            except queue.Empty:
                continue
            if pred(e):
                return e
        raise SystemExit(f"demo: {self.name} did not report the expected event")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.err.close()


def ledger_rows(ledger: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    db = sqlite3.connect(ledger, timeout=10)
    try:
        return db.execute(sql, args).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        db.close()


def main() -> int:
    from agent_saga_operator.testing import OperatorProcess, install_crds
    from fixtures.controlplane import ControlPlane
    from kubernetes import client

    work = Path(tempfile.mkdtemp(prefix="agent-saga-demo-"))
    ledger = work / "ledger.sqlite"
    procs: list[Any] = []
    cp = redis_proc = None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "hack"), str(REPO / "runtime"), str(REPO / "recoveryd"),
                                         env.get("PYTHONPATH", "")])
    try:
        say("Three planes (docs/policy-plane.md): Kubernetes holds policy as custom resources, the operator")
        say("projects them into Redis, agents read Redis and never talk to the Kubernetes API.")
        say()
        say("starting Redis (the policy plane, limit windows, recovery claims) ...")
        url, redis_proc, redis_dir = start_redis()
        say("starting a local control plane (etcd + kube-apiserver) ...")
        cp = ControlPlane(work / "kube")
        cp.start()
        kube = cp.cluster()
        install_crds(kube.kubectl, kube.api_client())
        client.CoreV1Api(kube.api_client()).create_namespace(
            client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        say(f"CRDs installed (agentsaga.dev/v1alpha1), namespace {NS!r} created")
        op = OperatorProcess(kube.kubeconfig, url, work / "operator.log", namespaces=[NS],
                             extra_args=["--standalone", "--health-host", "127.0.0.1", "--usage-interval", "1",
                                         "--log-level", "WARNING"])
        op.start()
        procs.append(op)
        op.wait_ready()
        say("operator running: it is the only writer of policy documents in Redis")
        agents = [Agent(f"agent-{i}", url, work, ledger, env) for i in range(N_AGENTS)]
        procs.extend(agents)
        for i in range(2):
            r = subprocess.Popen(
                [sys.executable, "-m", "agent_saga_recoveryd", *(a for ag in agents for a in ("--wal-path", str(ag.wal))),
                 "--imports", "demo_fleet", "--redis-url", url, "--interval", "0.5", "--lease-grace", "0",
                 "--metrics-port", "-1", "--daemon-id", f"recoveryd-{i}", "--log-level", "WARNING"],
                env=env, stdout=subprocess.DEVNULL, stderr=open(work / f"recoveryd-{i}.log", "wb"))  # noqa: SIM115
            procs.append(r)
        say(f"{N_AGENTS} agents started (3-step sagas charging 10 each to a local ledger);")
        say("2 recovery daemons watch their logs and share claims through Redis")
        for ag in agents:
            ag.next_event(lambda e: e["event"] == "committed")
        say("every agent has committed a saga")
        say()

        # ---------------------------------------------------------------- BudgetLimit
        limit = {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "BudgetLimit", "metadata": {"name": "ledger-spend"},
                 "spec": {"kind": "Budget", "arg": "amount", "maxTotal": 100000, "window": "1h",
                          "tools": ["ledger.*"]}}
        (work / "budget.yaml").write_text(yaml.safe_dump(limit, sort_keys=False))
        out = kube.kubectl("apply", "-n", NS, "-f", str(work / "budget.yaml")).stdout
        shell(f"kubectl apply -n {NS} -f budget.yaml   # at most 100,000 per hour on ledger.*, for the whole fleet",
              out)
        api = client.CustomObjectsApi(kube.api_client())
        def spent() -> bool:
            o = cast(dict[str, Any], api.get_namespaced_custom_object("agentsaga.dev", "v1alpha1", NS,
                                                                       "budgetlimits", "ledger-spend"))
            return bool((o.get("status") or {}).get("used", 0) > 0)
        wait(spent, "BudgetLimit status showing spend")
        time.sleep(1.5)  # let a little spend accumulate, for the table
        shell(f"kubectl get budgetlimits -n {NS} -o wide",
              kube.kubectl("get", "budgetlimits", "-n", NS, "-o", "wide").stdout)
        say("every agent debits the same Redis windows atomically; the operator reads the spend back")
        say()

        # ---------------------------------------------------------------- KillSwitch
        halt = {"apiVersion": "agentsaga.dev/v1alpha1", "kind": "KillSwitch", "metadata": {"name": "halt-ledger"},
                "spec": {"action": "Halt", "scope": {"tool": "ledger.*"}, "reason": "suspicious ledger activity",
                         "requestedBy": "soc@corp"}}
        for ag in agents:
            ag.drain()
        (work / "killswitch.yaml").write_text(yaml.safe_dump(halt, sort_keys=False))
        out = kube.kubectl("apply", "-n", NS, "-f", str(work / "killswitch.yaml")).stdout
        t = time.monotonic()  # kubectl has returned: the object is stored
        shell(f"kubectl apply -n {NS} -f killswitch.yaml   # Halt ledger.* for every agent", out)
        refusals = [ag.next_event(lambda e: e["event"] == "refused") for ag in agents]
        say(f"all {N_AGENTS} agents refuse within {(time.monotonic() - t) * 1000:.0f} ms of kubectl returning; "
            f"for example:")
        say(refusals[0]["reason"], agents[0].name)
        shell(f"kubectl get killswitches -n {NS}", kube.kubectl("get", "killswitches", "-n", NS).stdout)
        say("a refused step spends nothing: the kill switch is checked before the limits")
        time.sleep(1.0)
        out = kube.kubectl("delete", "-n", NS, "killswitch", "halt-ledger").stdout
        shell(f"kubectl delete killswitch halt-ledger -n {NS}", out)
        for ag in agents:
            ag.drain()
            ag.next_event(lambda e: e["event"] == "committed")
        say("the switch is lifted: every agent commits sagas again")
        say()

        # ---------------------------------------------------------------- SIGKILL mid-saga
        victim = agents[0]
        victim.drain()
        mid = victim.next_event(lambda e: e["event"] == "step" and e["step"] == 1)
        saga_id = mid["saga"]
        os.kill(victim.proc.pid, signal.SIGKILL)
        victim.proc.wait(5)
        charged = ledger_rows(ledger, "SELECT COUNT(*) FROM ledger WHERE saga = ? AND kind = 'charge'", saga_id)[0][0]
        say(f"SIGKILL {victim.name} in the middle of saga {saga_id}: {charged} charges posted, "
            f"the rest never will be", "chaos")
        say("its lease runs out after 2 s; a recovery daemon claims the saga and compensates it")
        t = time.monotonic()
        wait(lambda: ledger_rows(ledger, "SELECT COUNT(*) FROM ledger WHERE saga = ? AND kind = 'refund'",
                                 saga_id)[0][0] >= charged, "compensation of the orphaned saga", timeout=60)
        net = ledger_rows(ledger, "SELECT SUM(amount) FROM ledger WHERE saga = ?", saga_id)[0][0]
        say(f"refunded {charged} charges {time.monotonic() - t:.1f} s after the kill; the saga nets {net} "
            f"on the ledger", "recoveryd")
        say()

        # ---------------------------------------------------------------- verify + certify
        for p in procs:
            if isinstance(p, Agent):
                p.stop()
        time.sleep(3)  # the daemons finish what they started
        for p in procs:
            if isinstance(p, subprocess.Popen):
                p.terminate()
                p.wait(10)
        say("the fleet is stopped; now the evidence, from each agent's own log:")
        cli = [sys.executable, "-m", "agent_saga.cli"]
        ok = True
        for ag in agents:
            for verb in ("verify", "certify"):
                res = subprocess.run([*cli, verb, "--wal-path", str(ag.wal)], capture_output=True, text=True, env=env)
                ok &= res.returncode == 0
                lines = (res.stdout + res.stderr).rstrip().splitlines()
                shown = lines if len(lines) <= 4 else [*lines[:3], f"... ({len(lines) - 3} more lines)"]
                shell(f"agent-saga {verb} --wal-path {ag.wal.name}   # exit {res.returncode}", "\n".join(shown))
        total = ledger_rows(ledger, "SELECT COUNT(*), SUM(amount) FROM ledger")[0]
        say(f"ledger: {total[0]} rows; every saga either finished or was compensated")
        say("done: " + ("every log verifies and certifies" if ok else "SOMETHING FAILED (see above)"))
        return 0 if ok else 1
    finally:
        for p in reversed(procs):
            if isinstance(p, Agent):
                p.stop()
            elif isinstance(p, subprocess.Popen):
                if p.poll() is None:
                    p.kill()
                p.wait(10)
            else:
                p.stop()
        if cp is not None:
            cp.stop()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait(10)
        if os.environ.get("AGENT_SAGA_DEMO_KEEP"):
            print(f"(kept {work})")
        else:
            shutil.rmtree(work, ignore_errors=True)



if __name__ == "__main__":
    sys.exit(main())
