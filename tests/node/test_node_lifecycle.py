"""The node leaves nothing behind: no process, mount, cgroup, iptables chain, bridge,
kernel setting or directory, whether it is stopped or its owner is SIGKILLed.

These tests stop the session's node, so they run after every other node test
(tests/node/conftest.py orders them last); the session's finalizer checks the same once
more at the very end of the suite.
"""

from __future__ import annotations

import fcntl
import os
import textwrap
from dataclasses import asdict
from pathlib import Path

import pytest
from fixtures.binaries import cache_dir
from fixtures.node import LOCK_FILE
from fixtures.node_host import HostState
from fixtures.procs import pid_alive, sigkilled_owner
from node_support import DEADLINE, NodeSession, poll

TESTS_DIR = Path(__file__).resolve().parents[1]
# Executables only a node runs (etcd and kube-apiserver also serve the other suites'
# control planes: the node's are found by HostState.processes, by their state directory).
NODE_EXES = ("containerd", "containerd-shim-runc-v2", "kubelet", "kube-proxy", "kube-controller-manager",
             "kube-scheduler", "coredns", "pause")


def node_processes() -> list[str]:
    """Every process on the machine running one of the node's executables (any owner)."""
    bin_dir = str(cache_dir() / "bin")
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not pid_alive(int(entry)):
            continue
        try:
            exe = os.readlink(f"/proc/{entry}/exe")
        except OSError:
            continue
        name = os.path.basename(exe.removesuffix(" (deleted)"))
        if name in NODE_EXES and (exe.startswith(("/usr/bin/", "/usr/sbin/", bin_dir)) or name == "pause"):
            found.append(f"{entry} {exe}")
    return found


def lock_is_free() -> bool:
    fd = os.open(LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@pytest.fixture
def local_session(node_session: NodeSession) -> NodeSession:
    if node_session.external is not None:
        pytest.skip("checks the local node's host: not with --kubeconfig")
    return node_session


def test_a_stopped_node_leaves_nothing_behind(local_session: NodeSession) -> None:
    cluster = local_session.up()
    # A pod, so there are containers, shims, mounts, a bridge port and cgroups to undo.
    cluster.kubectl("-n", "default", "run", "sleeper", f"--image={cluster.node.images['debian-python'].ref}",
                    "--image-pull-policy=Never", "--restart=Never", "--", "sleep", "infinity")
    cluster.kubectl("-n", "default", "wait", "--for=condition=Ready", "pod/sleeper", f"--timeout={int(DEADLINE)}s",
                    timeout=DEADLINE + 10)
    host = HostState(**asdict(cluster.node.host))
    assert host.processes() and host.mounts() and host.links() and host.cgroups(), "the pod left no trace to check"
    assert local_session.down() == []
    assert host.leftovers() == []
    assert node_processes() == []
    assert lock_is_free()


def test_a_killed_owner_takes_the_node_with_it(local_session: NodeSession,
                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    """SIGKILL the process that started a node (no finalizer, no atexit runs): its keeper
    kills what is left (servers, containers, shims) and undoes every host change."""
    local_session.down()
    script = textwrap.dedent(f"""
        import json, sys, time
        from dataclasses import asdict
        sys.path.insert(0, {str(TESTS_DIR)!r})
        from fixtures.node import Node
        node = Node({str(tmp_path_factory.mktemp("o"))!r}).start()  # short: unix socket paths
        c = node.cluster()
        c.kubectl("-n", "default", "run", "sleeper", "--image=" + node.images["debian-python"].ref,
                  "--image-pull-policy=Never", "--restart=Never", "--", "sleep", "infinity")
        c.kubectl("-n", "default", "wait", "--for=condition=Ready", "pod/sleeper", "--timeout=180s", timeout=190)
        print(json.dumps({{"host": asdict(node.host), "keeper": node.lock.keeper.pid}}), flush=True)
        time.sleep(600)
    """)
    with sigkilled_owner(script) as info:
        host = HostState(**info["host"])
        assert host.processes() and host.mounts(), "the node runs nothing to clean up"
    poll(lambda: not pid_alive(info["keeper"]), timeout=DEADLINE, what="the keeper to finish cleaning up")
    assert host.leftovers() == []
    assert node_processes() == []
    assert lock_is_free()
