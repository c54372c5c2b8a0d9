#!/usr/bin/env python3
"""A local control plane (etcd + kube-apiserver) and Redis for a person, not a test.

    hack/dev-cluster.py up      start (or find running) and print the export lines
    hack/dev-cluster.py env     print the export lines of the running one
    hack/dev-cluster.py status  say what runs
    hack/dev-cluster.py down    stop everything and remove its state

`make dev-cluster` / `make dev-cluster-down` call this. It starts the servers exactly like
the test fixtures do (tests/fixtures/), but detached: they outlive this script. State
(kubeconfig, PKI, etcd data, logs, pids) lives in ${AGENT_SAGA_CACHE:-~/.cache/agent-saga}/dev-cluster/.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

from fixtures.binaries import cache_dir, find_asset, read_versions
from fixtures.procs import MissingPart, pid_alive, port_open

REPO = Path(__file__).resolve().parents[1]

STATE_DIR = cache_dir() / "dev-cluster"
STATE_FILE = STATE_DIR / "state.json"


def _load() -> dict[str, Any] | None:
    try:
        return dict(json.loads(STATE_FILE.read_text()))
    except (OSError, ValueError):
        return None


def _ours(pid: int) -> bool:
    """Alive, and started by us (its command line names our state directory)."""
    if not pid_alive(pid):
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        cwd = os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return False
    # redis-server rewrites its command line, but runs in its --dir.
    return str(STATE_DIR) in cmdline or cwd.startswith(str(STATE_DIR))


def _healthy(state: dict[str, Any]) -> bool:
    pids: dict[str, int] = state.get("pids", {})
    ports: dict[str, int] = state.get("ports", {})
    return (
        bool(pids)
        and all(_ours(int(p)) for p in pids.values())
        and all(port_open(int(p)) for p in ports.values())
    )


def _exports(state: dict[str, Any]) -> str:
    kubectl = find_asset("kubectl")
    lines = [
        f"# agent-saga dev cluster: kube-apiserver {state['kube_version']} at {state['server']}, "
        f"Redis at {state['redis_url']}",
        f"export KUBECONFIG={state['kubeconfig']}",
        f"export AGENT_SAGA_REDIS_URL={state['redis_url']}",
        "# an agent also needs its namespace and name (AgentKit() then wires every control):",
        "export AGENT_SAGA_NAMESPACE=default AGENT_SAGA_AGENT=my-agent",
    ]
    if kubectl is not None:
        lines.append(f"export PATH={kubectl.parent}:$PATH")
    lines.append("# stop it with: make dev-cluster-down")
    return "\n".join(lines)


def up() -> int:
    from fixtures.controlplane import ControlPlane, write_kubeconfig
    from fixtures.redis_server import RedisServer

    state = _load()
    if state is not None and _healthy(state):
        print(_exports(state))
        return 0
    if state is not None:
        print("# a previous dev cluster is (partly) gone: cleaning up", file=sys.stderr)
        down(quiet=True)
    STATE_DIR.mkdir(parents=True, exist_ok=True)
    cp = ControlPlane(STATE_DIR / "kube", detached=True)
    redis = None
    try:
        t0 = time.monotonic()
        cp.start()
        redis = RedisServer(STATE_DIR / "redis", detached=True).start()
    except MissingPart as e:
        cp.stop(remove_workdir=True)
        print(f"dev-cluster: {e}", file=sys.stderr)
        return 1
    except BaseException:
        cp.stop(remove_workdir=True)
        if redis is not None:
            redis.close()
        raise
    assert cp.pki is not None
    kubeconfig = write_kubeconfig(
        STATE_DIR / "kubeconfig", cp.server, cp.pki.ca_cert, cp.pki.admin_cert, cp.pki.admin_key
    )
    state = {
        "kube_version": read_versions()["KUBE_VERSION"],
        "server": cp.server,
        "kubeconfig": str(kubeconfig),
        "redis_url": redis.url,
        "pids": dict(zip(("etcd", "kube-apiserver", "redis-server"), [*cp.pids, redis.pid], strict=True)),
        "ports": {"etcd": cp.etcd_port, "kube-apiserver": cp.secure_port, "redis-server": redis.port},
        "logs": str(STATE_DIR / "kube" / "logs"),
    }
    STATE_FILE.write_text(json.dumps(state, indent=2) + "\n")
    print(f"# started in {time.monotonic() - t0:.1f}s; logs in {state['logs']} and {STATE_DIR / 'redis'}",
          file=sys.stderr)
    print(_exports(state))
    return 0


def down(quiet: bool = False) -> int:
    state = _load()
    pids: dict[str, int] = dict(state.get("pids", {})) if state else {}
    # Stop in reverse start order: Redis, kube-apiserver, then etcd.
    for name in ("redis-server", "kube-apiserver", "etcd"):
        pid = pids.get(name)
        if pid is None or not _ours(int(pid)):
            continue
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGTERM)
        deadline = time.monotonic() + 15
        while pid_alive(int(pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(int(pid), signal.SIGKILL)
        if not quiet:
            print(f"stopped {name} (pid {pid})")
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    if not quiet:
        print(f"removed {STATE_DIR}")
    return 0


def status() -> int:
    state = _load()
    if state is None:
        print("dev cluster: not running")
        return 1
    pids: dict[str, int] = state.get("pids", {})
    for name, pid in pids.items():
        print(f"{name:15} pid {pid:<8} {'running' if _ours(int(pid)) else 'GONE'}")
    return 0 if _healthy(state) else 1


def env() -> int:
    state = _load()
    if state is None or not _healthy(state):
        print("dev cluster: not running (make dev-cluster)", file=sys.stderr)
        return 1
    print(_exports(state))
    return 0


def main(argv: list[str]) -> int:
    cmds = {"up": up, "down": down, "status": status, "env": env}
    if len(argv) != 2 or argv[1] not in cmds:
        print(__doc__, file=sys.stderr)
        return 2
    return cmds[argv[1]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
