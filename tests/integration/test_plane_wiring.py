"""One setting wires an agent: real agent processes configured by the environment alone,
against a real Redis. A half-configured agent fails at start naming the fix; a saga with
no gate obeys the kill switch; AgentKit() picks every control up and keeps a heartbeat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from agent_saga.heartbeat import Heartbeat, read_heartbeats
from agent_saga_operator.testing import poll
from fixtures.cli import cli_module
from fixtures.redis_server import PLANE_ENV, WAL_KEY, RedisServer, index_entries
from fixtures.redis_server import PLANE_PREFIX as P

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def run(code: str, env: dict[str, str], cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    full.update(env)
    full["PYTHONPATH"] = str(ROOT / "runtime")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          env=full, cwd=cwd, timeout=timeout)


def cli(url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli_module(*args, cwd=cwd, env={**{k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")},
                                           "AGENT_SAGA_REDIS_URL": url, "PYTHONPATH": str(ROOT / "runtime"), **PLANE_ENV})


KIT = """
    import asyncio, json
    from agent_saga import AgentKit
    kit = AgentKit(name="payments-agent")
    send = kit.safe_tool(lambda amount=0: {"id": "tx"}, semantics="REVERSIBLE", name="wire.send")
    async def main():
        try:
            async with kit.transaction():
                await send(amount=5)
            print(json.dumps({"ok": True}))
        except Exception as e:
            print(json.dumps({"ok": False, "kind": type(e).__name__, "error": str(e)}))
    asyncio.run(main())
"""


def env(url: str, **extra: str) -> dict[str, str]:
    return {"AGENT_SAGA_REDIS_URL": url, "AGENT_SAGA_NAMESPACE": "payments", "AGENT_SAGA_AGENT": "payments-agent",
            **PLANE_ENV, **extra}


def test_an_unreachable_policy_plane_fails_at_start_naming_the_fix(tmp_path: Path) -> None:
    out = run(KIT, env("redis://127.0.0.1:1/0"), tmp_path)
    assert out.returncode != 0
    assert "AGENT_SAGA_REDIS_URL=redis://127.0.0.1:1/0 does not answer" in out.stderr
    assert "start Redis or fix the URL" in out.stderr


def test_a_namespace_no_operator_serves_fails_at_start_naming_them(fresh_redis: RedisServer, tmp_path: Path) -> None:
    fresh_redis.client().sadd(f"{P}:namespaces", "billing", "shipping")
    out = run(KIT, env(fresh_redis.url), tmp_path)
    assert out.returncode != 0
    assert "namespace 'payments' (AGENT_SAGA_NAMESPACE) is not served by any operator" in out.stderr
    assert "billing, shipping" in out.stderr


def test_a_url_without_a_namespace_fails_at_start(fresh_redis: RedisServer, tmp_path: Path) -> None:
    out = run(KIT, {"AGENT_SAGA_REDIS_URL": fresh_redis.url}, tmp_path)
    assert out.returncode != 0 and "set AGENT_SAGA_NAMESPACE" in out.stderr


def test_agentkit_picks_every_control_up_from_the_environment_and_keeps_a_heartbeat(
        fresh_redis: RedisServer, tmp_path: Path) -> None:
    code = """
        import json
        from agent_saga import AgentKit
        from agent_saga.plane import get_plane
        kit = AgentKit(name="payments-agent")
        g = kit.gate.status()
        p = get_plane()
        print(json.dumps({"gate": type(kit.gate).__name__, "checks": g["checks"],
                          "limit_source": g["limit_source"], "approval": g["approval_provider"],
                          "policy": g["policy_source"]["source"], "heartbeat": p.heartbeat.id}))
    """
    out = run(code, env(fresh_redis.url), tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["gate"] == "PreFlightGate" and doc["approval"] == "ApprovalGateway"
    assert doc["checks"][0].startswith("kill_switch:") and doc["limit_source"].startswith("RedisLimitSource(")
    assert doc["policy"].startswith("RedisPolicySource(")
    assert doc["heartbeat"].startswith("payments/")
    # A clean exit removes the heartbeat: a finished process is not a lagging agent.
    assert index_entries(fresh_redis.client()) == 0


def test_a_saga_with_no_gate_obeys_a_fleet_wide_halt(fresh_redis: RedisServer, tmp_path: Path) -> None:
    code = """
        import asyncio, json
        from agent_saga import saga_scope
        async def main():
            try:
                async with saga_scope(name="nogate") as saga:
                    await saga.execute("wire.send", "REVERSIBLE", lambda: "sent")
                print(json.dumps({"ok": True}))
            except Exception as e:
                print(json.dumps({"ok": False, "kind": type(e).__name__, "error": str(e)}))
        asyncio.run(main())
    """
    before = run(code, env(fresh_redis.url), tmp_path)
    assert json.loads(before.stdout) == {"ok": True}, before.stderr
    halt = cli(fresh_redis.url, tmp_path, "halt", "--scope", "tool:wire.*", "--reason", "fraud", "--by", "soc@corp")
    assert halt.returncode == 0, halt.stderr
    after = json.loads(run(code, env(fresh_redis.url), tmp_path).stdout)
    assert after["ok"] is False and after["kind"] == "GateBlocked" and "fraud" in after["error"], after
    # With only AGENT_SAGA_SWITCH_STORE (no policy plane), the same.
    only_switch = {"AGENT_SAGA_SWITCH_STORE": fresh_redis.url, "AGENT_SAGA_SWITCH_GRACE": "5", **PLANE_ENV}
    alone = json.loads(run(code, only_switch, tmp_path).stdout)
    assert alone["ok"] is False and "fraud" in alone["error"], alone


def test_a_running_agent_reports_the_levers_it_applied_in_its_heartbeat(fresh_redis: RedisServer,
                                                                       tmp_path: Path) -> None:
    code = """
        import sys, time
        from agent_saga import AgentKit
        AgentKit(name="payments-agent")
        print("up", flush=True)
        sys.stdin.readline()
    """
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    # The default interval (ttl 6 s): the halt is reported at once anyway (an applied
    # change beats now), and a loaded machine keeps a 6 s ttl while status runs.
    full.update(env(fresh_redis.url, POD_NAME="pod-7"))
    full["PYTHONPATH"] = str(ROOT / "runtime")
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full, cwd=tmp_path)
    r = fresh_redis.client()
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
        halt = cli(fresh_redis.url, tmp_path, "halt", "--scope", "tool:wire.send", "--reason", "x", "--by", "soc")
        assert halt.returncode == 0, halt.stderr

        def beat() -> Heartbeat | None:
            hbs, _ = read_heartbeats(r, P)
            return next((h for h in hbs if h.killswitches), None)
        hb = poll(beat, timeout=10, what="a heartbeat listing the halt")
        assert (hb.agent, hb.pod, hb.namespace, hb.posture) == ("payments-agent", "pod-7", "payments", "ok")
        assert [k.id.split("/")[0] for k in hb.killswitches or ()] == ["cli"]
        assert hb.policies == () and hb.limits == ()
        # agent-saga status on the same setting shows the same agent and what it applied.
        status = cli(fresh_redis.url, tmp_path, "status")
        assert "1 live agent process(es)" in status.stdout, status.stdout + status.stderr
        assert "payments/payments-agent@pod-7" in status.stdout and "kill switches 1" in status.stdout
        assert "tool:wire.send" in status.stdout  # the kill switch section: the same lever
    finally:
        _, err = proc.communicate("\n", timeout=30)
    assert proc.returncode == 0, err


def test_an_agent_on_a_read_only_root_filesystem_connects_and_names_the_wal_settings(
        fresh_redis: RedisServer, tmp_path: Path) -> None:
    from fixtures.readonly import read_only_mount

    (tmp_path / "root").mkdir()
    code = """
        import asyncio, json
        from agent_saga import saga_scope
        from agent_saga.plane import plane_from_env
        plane_from_env()                        # connecting creates no log file
        async def main():
            try:
                async with saga_scope(name="ro") as saga:
                    await saga.execute("ledger.post", "REVERSIBLE", lambda: "posted")
                print(json.dumps({"ok": True}))
            except Exception as e:
                print(json.dumps({"ok": False, "kind": type(e).__name__, "error": str(e)}))
        asyncio.run(main())
    """
    with read_only_mount(tmp_path / "root") as ro:
        # No WAL setting: the agent starts; its first saga names the settings that fix it.
        bare = run(code, env(fresh_redis.url), ro)
        assert bare.returncode == 0, bare.stderr
        out = json.loads(bare.stdout.strip().splitlines()[-1])
        assert out["ok"] is False and out["kind"] == "ConfigurationError", out
        assert "AGENT_SAGA_WAL_PATH" in out["error"] and "AGENT_SAGA_WAL_STREAM" in out["error"], out
        # AGENT_SAGA_WAL_STREAM: the saga's records land in the policy plane's Redis.
        wired = run(code, env(fresh_redis.url, AGENT_SAGA_WAL_STREAM=WAL_KEY), ro)
        assert json.loads(wired.stdout.strip().splitlines()[-1]) == {"ok": True}, wired.stderr
        assert list(ro.iterdir()) == []
    r = fresh_redis.client()
    writers = r.smembers(f"{WAL_KEY}:writers")
    assert writers and sum(r.xlen(f"{WAL_KEY}:w:".encode() + w) for w in writers) > 0


def test_open_plane_gives_each_agent_of_a_process_its_own_controls_and_heartbeat(
        fresh_redis: RedisServer, tmp_path: Path) -> None:
    # Two agents in one process (the fleet simulator's way), each wired from an environment
    # of its own (the process's has no AGENT_SAGA_REDIS_URL): each its own kill switch
    # reader, limit part and heartbeat, named by its POD_NAME; no process-wide plane; a
    # halt engaged through one reaches both gates.
    code = """
        import asyncio, json, os
        from agent_saga import AgentKit
        from agent_saga.errors import ConfigurationError
        from agent_saga.plane import get_plane, open_plane
        from agent_saga.wal import FileWAL
        base = json.loads(os.environ["FLEET_ENV"])
        wal = FileWAL("fleet.wal", sync=False)
        conns = [open_plane({**base, "POD_NAME": pod}, wal=wal) for pod in ("pod-a", "pod-b")]
        try:
            open_plane({**base, "AGENT_SAGA_WAL_STREAM": "s"})
            refused = ""
        except ConfigurationError as e:
            refused = str(e)
        conns[0].kill_switch.halt("tool:wire.send", reason="test", by="ops@corp")
        async def call(conn):
            kit = AgentKit(name="payments-agent", wal=wal, gate=conn.gate())
            send = kit.safe_tool(lambda amount=0: {"id": "tx"}, semantics="REVERSIBLE", name="wire.send")
            for _ in range(200):
                try:
                    async with kit.transaction():
                        await send(amount=1)
                except Exception as e:
                    return type(e).__name__
                await asyncio.sleep(0.05)
            return "ran"
        async def main():
            return await asyncio.gather(*(call(c) for c in conns))
        outcomes = asyncio.run(main())
        print(json.dumps({"heartbeats": [c.heartbeat.id for c in conns],
                          "parts": [c.limit_store.part for c in conns],
                          "switches": len({id(c.switch_store) for c in conns}),
                          "no_process_plane": get_plane() is None, "refused": refused, "outcomes": outcomes}))
        for c in conns:
            c.close()
    """
    out = run(code, {"FLEET_ENV": json.dumps(env(fresh_redis.url))}, tmp_path)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [h.split(".")[0] for h in doc["heartbeats"]] == ["payments/pod-a", "payments/pod-b"]
    assert doc["parts"] == ["payments/pod-a", "payments/pod-b"] and doc["switches"] == 2
    assert doc["no_process_plane"], doc
    assert "AGENT_SAGA_WAL_STREAM" in doc["refused"] and "wal=" in doc["refused"]
    assert doc["outcomes"] == ["GateBlocked", "GateBlocked"], doc
    assert index_entries(fresh_redis.client()) == 0  # closed: both heartbeats removed
