"""The local control plane stops cleanly: no process, port or group member is left behind.

Each test starts its own, separate instance (not the session's `kube`), so it can stop it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fixtures.controlplane import ControlPlane, KubeCluster, have_local_binaries, wait_gone
from fixtures.polling import until
from fixtures.procs import pid_alive, port_open, sigkilled_owner

TESTS_DIR = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _needs_local_binaries(kube: KubeCluster) -> None:
    if not kube.local and not have_local_binaries():
        # Only when the user chose an external cluster on purpose; without --kubeconfig a
        # missing binary fails (the `kube` fixture says how to get it).
        pytest.skip("external --kubeconfig in use and no local etcd/kube-apiserver binaries")


def _pids_in_groups(pgids: list[int]) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, pgid = fields[0], int(fields[2])
        if pgid in pgids and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def test_stop_leaves_no_processes(kube: KubeCluster, tmp_path: Path) -> None:
    cp = ControlPlane(tmp_path / "second")
    try:
        cp.start()
        pids = cp.pids
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        ports = [cp.etcd_port, cp.secure_port]
        assert all(port_open(p) for p in ports)
        if kube.control_plane is not None:
            assert cp.secure_port != kube.control_plane.secure_port
        # It is a working, separate cluster.
        out = cp.cluster().kubectl("get", "ns", "-o", "name").stdout.split()
        assert "namespace/default" in out
    finally:
        cp.stop()
    assert wait_gone(pids) == []
    assert _pids_in_groups(pids) == [], "a child of etcd/kube-apiserver survived"
    assert not any(port_open(p) for p in ports)
    cp.stop()  # idempotent


def test_killed_owner_takes_the_control_plane_with_it(tmp_path: Path) -> None:
    """Even when the process that started it is SIGKILLed (no finalizer, no atexit runs),
    etcd and kube-apiserver die with it (PR_SET_PDEATHSIG)."""
    script = textwrap.dedent(
        f"""
        import json, sys, time
        sys.path.insert(0, {str(TESTS_DIR)!r})
        from fixtures.controlplane import ControlPlane
        cp = ControlPlane({str(tmp_path / "orphan")!r}).start()
        print(json.dumps({{"pids": cp.pids, "ports": [cp.etcd_port, cp.secure_port]}}), flush=True)
        time.sleep(600)
        """
    )
    with sigkilled_owner(script) as info:
        assert all(pid_alive(p) for p in info["pids"])
    assert wait_gone(info["pids"], timeout=15) == []
    until("the ports closed after the owner died", lambda: not any(port_open(p) for p in info["ports"]), timeout=10,
          interval=0.1)


def test_pytest_session_leaves_nothing_behind(tmp_path: Path) -> None:
    """A whole pytest session using the `kube` fixture stops everything it started."""
    inner = tmp_path / "inner"
    inner.mkdir()
    (inner / "test_inner.py").write_text(
        "def test_uses_cluster(kube):\n"
        "    assert 'namespace/default' in kube.kubectl('get', 'ns', '-o', 'name').stdout\n"
    )
    basetemp = tmp_path / "basetemp"
    env = dict(os.environ, PYTHONPATH=str(TESTS_DIR))
    env.pop("AGENT_SAGA_E2E_KUBECONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "fixtures.plugin", "-p", "no:cacheprovider",
         f"--basetemp={basetemp}", "--rootdir", str(inner), str(inner)],
        capture_output=True, text=True, timeout=240, env=env, cwd=inner,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Any process still running from that session would name its basetemp on its command line.
    leftovers = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(basetemp) in cmdline and pid_alive(int(entry)):
                leftovers.append(cmdline)
    assert leftovers == []
