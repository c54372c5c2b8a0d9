#!/usr/bin/env python3
"""A real single-node Kubernetes cluster on this machine, for a person.

    hack/cluster.py up      start it (or find it running) and print the export lines
    hack/cluster.py env     print the export lines of the running one (eval "$(...)")
    hack/cluster.py status  say whether it runs
    hack/cluster.py down    stop it and undo every change it made to the host

`make cluster` / `make cluster-down` call this. The cluster is the one the node tests
use (tests/fixtures/node.py): containerd, etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, the kubelet, kube-proxy and CoreDNS, with this tree's images imported
(hack/build-images.sh). It runs detached: its keeper holds the machine's node lock until
`down`. State lives in ${AGENT_SAGA_CACHE:-~/.cache/agent-saga}/cluster/.

It also writes, for this tree's images (``fixtures.local_chart``, what the node tests
install): ``values.yaml``, the chart values that run the chart on them with nothing
pulled, ``payments-agent.yaml``, the example agents (examples/payments/deployment.yaml)
on the local agent image, and ``effector/``, two patches that put examples/k8s/effector/
on the local images (its app: python, idle, to exec into). The export lines name them
(``AGENT_SAGA_CLUSTER_VALUES``, ``AGENT_SAGA_CLUSTER_AGENT``, ``AGENT_SAGA_CLUSTER_EFFECTOR``)
and the commands that use them (docs/install.md, "On this machine: make cluster").
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import yaml
from fixtures.binaries import Image, cache_dir, find_asset, node_images
from fixtures.local_chart import chart_values, effector_patches, example_agent
from fixtures.node import HOST_STATE_FILE, LOCK_FILE, Node
from fixtures.procs import MissingPart, StartupError, pid_alive

REPO = Path(__file__).resolve().parents[1]

STATE_DIR = cache_dir() / "cluster"
VALUES = STATE_DIR / "values.yaml"
AGENT = STATE_DIR / "payments-agent.yaml"
EFFECTOR = STATE_DIR / "effector"
NEXT = "\n".join((
    '# install the chart and the example agents on it (docs/install.md, "On this machine: make cluster"):',
    '#   helm install agent-saga charts/agent-saga -n agent-saga --create-namespace -f "$AGENT_SAGA_CLUSTER_VALUES"',
    '#   kubectl -n agent-saga apply -f "$AGENT_SAGA_CLUSTER_AGENT"'))


def _holder() -> dict[str, object]:
    try:
        return dict(json.loads(LOCK_FILE.read_text() or "{}"))
    except (OSError, ValueError):
        return {}


def _running() -> bool:
    h = _holder()
    keeper = h.get("keeper")
    return bool(h.get("detached")) and isinstance(keeper, int) and pid_alive(keeper) \
        and h.get("kubeconfig") == str(STATE_DIR / "kubeconfig")


def _exports() -> str:
    lines = ["# agent-saga single-node cluster (containerd, kubelet, kube-proxy, CoreDNS; images imported)",
             f"export KUBECONFIG={STATE_DIR / 'kubeconfig'}"]
    paths = {str(p.parent) for p in (find_asset("kubectl"), find_asset("helm")) if p is not None}
    if paths:
        lines.append(f"export PATH={':'.join(sorted(paths))}:$PATH")
    try:
        for image in node_images().values():
            lines.append(f"#   image {image.ref}")
    except MissingPart:
        pass
    if VALUES.is_file() and AGENT.is_file():
        lines += [f"export AGENT_SAGA_CLUSTER_VALUES={VALUES}", f"export AGENT_SAGA_CLUSTER_AGENT={AGENT}"]
        if EFFECTOR.is_dir():
            lines.append(f"export AGENT_SAGA_CLUSTER_EFFECTOR={EFFECTOR}")
        lines.append(NEXT)
    lines.append("# stop it with: make cluster-down")
    return "\n".join(lines)


def write_values(images: dict[str, Image]) -> None:
    """The values file and the example agents' manifest for ``images`` (see the module doc)."""
    VALUES.write_text("# The chart on this tree's images (hack/build-images.sh), nothing pulled; written by\n"
                      "# `make cluster` (hack/cluster.py). Use: helm install ... -f THIS_FILE\n"
                      + yaml.safe_dump(chart_values(images), sort_keys=False))
    AGENT.write_text("# examples/payments/deployment.yaml on this tree's agent image; written by `make cluster`.\n"
                     + yaml.safe_dump(example_agent(images), sort_keys=False))
    EFFECTOR.mkdir(exist_ok=True)
    for name, patch in effector_patches(images).items():
        (EFFECTOR / f"{name}.yaml").write_text(
            f"# kubectl patch deployment {name} --patch-file THIS_FILE: examples/k8s/effector/ on this tree's\n"
            "# images; written by `make cluster`.\n" + yaml.safe_dump(patch, sort_keys=False))


def up() -> int:
    if _running():
        if not VALUES.is_file():
            write_values(node_images())
        print(_exports())
        return 0
    if STATE_DIR.exists():
        shutil.rmtree(STATE_DIR, ignore_errors=True)
    t0 = time.monotonic()
    try:
        Node(STATE_DIR, detached=True, lock_timeout=0).start()
        write_values(node_images())
    except (MissingPart, StartupError) as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1
    print(f"# started in {time.monotonic() - t0:.0f}s; logs in {STATE_DIR / 'logs'} and {STATE_DIR / 'kube' / 'logs'}",
          file=sys.stderr)
    print(_exports())
    return 0


def down() -> int:
    h = _holder()
    keeper = h.get("keeper")
    if _running() and isinstance(keeper, int):
        os.kill(keeper, signal.SIGTERM)
        deadline = time.monotonic() + 120
        while pid_alive(keeper) and time.monotonic() < deadline:
            time.sleep(0.2)
        if pid_alive(keeper):
            print(f"cluster: the keeper (pid {keeper}) did not finish cleaning up in 120 s", file=sys.stderr)
            return 1
        print(f"stopped the cluster (keeper pid {keeper})")
    elif HOST_STATE_FILE.exists() and not h:
        print(f"cluster: not running, but {HOST_STATE_FILE} is left: the next start cleans it up", file=sys.stderr)
    shutil.rmtree(STATE_DIR, ignore_errors=True)
    print(f"removed {STATE_DIR}")
    return 0


def status() -> int:
    running = _running()
    print("cluster: running" if running else "cluster: not running")
    return 0 if running else 1


def env() -> int:
    if not _running():
        print("cluster: not running (make cluster)", file=sys.stderr)
        return 1
    print(_exports())
    return 0


def main(argv: list[str]) -> int:
    cmds = {"up": up, "down": down, "status": status, "env": env}
    if len(argv) != 2 or argv[1] not in cmds:
        print(__doc__, file=sys.stderr)
        return 2
    return cmds[argv[1]]()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
