"""What the node tests share: the chart installed with this tree's images, the example
agents, pods reached through the API server, the in-chart Redis through a port-forward.

Everything goes through the Kubernetes API (the pods' proxy, `kubectl port-forward`,
`kubectl exec`), never to a pod address directly, so the suite runs unchanged against
any cluster given with --kubeconfig that has the images loaded.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import redis
import yaml
from e2e.chart_helpers import CHART, Helm
from fixtures.binaries import REPO_ROOT, Image, require_asset
from fixtures.controlplane import KubeCluster
from fixtures.local_chart import chart_values, example_agent
from fixtures.node import Node
from fixtures.procs import ManagedProcess, StartupError, wait_until
from kubernetes.client.rest import ApiException

# The example's compensators name the bank's books (payments:bank:*): the tests read them.
sys.path.insert(0, str(REPO_ROOT / "examples" / "payments"))
import payments_compensators as bank  # noqa: E402, F401  (re-exported for the tests)

T = TypeVar("T")
# A rollout or a recovery on a loaded 2-core machine: generous, and only ever a deadline.
DEADLINE = 180.0
AGENT_PORT = 8080


def poll(fn: Callable[[], T | None], *, timeout: float = DEADLINE, what: str, interval: float = 0.2) -> T:
    """Call `fn` until it returns something truthy; return it. Fails after `timeout`."""
    result: list[T] = []

    def ok() -> bool:
        value = fn()
        if value:
            result.append(value)
            return True
        return False

    wait_until(ok, timeout=timeout, what=what, interval=interval)
    return result[0]


class NodeSession:
    """The session's cluster: the local node (started on first use, restartable) or the
    one --kubeconfig names."""

    def __init__(self, workdir: Path, external: Path | None) -> None:
        self.workdir = workdir
        self.external = external
        self.node: Node | None = None
        self.cluster: KubeCluster | None = None
        self.starts = 0

    def up(self) -> KubeCluster:
        if self.cluster is not None:
            return self.cluster
        if self.external is not None:
            self.cluster = KubeCluster(kubeconfig=self.external, local=False)
            return self.cluster
        self.starts += 1
        node = Node(self.workdir / f"node-{self.starts}")
        node.start()
        self.node, self.cluster = node, node.cluster()
        return self.cluster

    def down(self) -> list[str]:
        """Stop the local node; return what it left on the host (should be nothing)."""
        left: list[str] = []
        if self.cluster is not None:
            self.cluster.close()
        if self.node is not None:
            left = self.node.stop()
        self.node = self.cluster = None
        return left


class Release:
    """One `helm install` of the chart with the in-chart Redis and the payments example's
    recoveryd image (its compensators imported), watching its own namespace."""

    def __init__(self, cluster: KubeCluster, images: dict[str, Image], home: Path, name: str = "agent-saga",
                 namespace: str = "agent-saga", sets: tuple[str, ...] = ()) -> None:
        self.cluster, self.images, self.name, self.namespace = cluster, images, name, namespace
        self.helm = Helm(home, cluster.kubeconfig)
        self.notes = ""
        # The values file `make cluster` writes for a person, and the suite's own settings.
        self.values = home / f"{name}-local-values.yaml"
        home.mkdir(parents=True, exist_ok=True)
        self.values.write_text(yaml.safe_dump(chart_values(images)))
        self.sets = [f"operator.watchNamespaces={{{namespace}}}", "recoveryd.interval=1", "recoveryd.claimTtl=5",
                     *sets]

    def _args(self, sets: tuple[str, ...]) -> list[str]:
        out = ["--namespace", self.namespace, "-f", str(self.values)]
        for s in (*self.sets, *sets):
            out += ["--set", s]
        return out

    def install(self) -> str:
        """`helm install`; returns its output (NOTES included)."""
        return self.helm.run("install", self.name, str(CHART), "--create-namespace", *self._args(()),
                             timeout=DEADLINE).stdout

    def upgrade(self, *sets: str, wait: bool = False) -> str:
        extra = ["--wait", "--timeout", f"{int(DEADLINE)}s"] if wait else []
        return self.helm.run("upgrade", self.name, str(CHART), *self._args(sets), *extra,
                             timeout=DEADLINE + 30).stdout

    def start_upgrade(self, *sets: str) -> subprocess.Popen[str]:
        """`helm upgrade` in the background (the caller acts during the roll, then waits)."""
        return subprocess.Popen([str(self.helm.binary), "upgrade", self.name, str(CHART), *self._args(sets)],
                                env=self.helm.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def uninstall(self) -> None:
        self.helm.run("uninstall", self.name, "--namespace", self.namespace, "--wait", "--timeout",
                      f"{int(DEADLINE)}s", timeout=DEADLINE + 30)

    # ------------------------------------------------------------------ objects
    def kubectl(self, *args: str, **kw: Any) -> Any:
        return self.cluster.kubectl("-n", self.namespace, *args, **kw)

    def component(self, component: str) -> str:
        return f"{self.name}-{component}"

    def wait_ready(self, timeout: float = DEADLINE) -> None:
        for c in ("redis", "recoveryd", "operator"):
            self.kubectl("rollout", "status", f"deployment/{self.component(c)}", f"--timeout={int(timeout)}s",
                         timeout=timeout + 10)

    def pods(self, selector: str) -> list[dict[str, Any]]:
        """Running pods matching a label selector (not those being deleted)."""
        out = json.loads(self.kubectl("get", "pods", "-l", selector, "-o", "json").stdout)["items"]
        return [p for p in out if not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") == "Running"]

    def component_pods(self, component: str) -> list[dict[str, Any]]:
        return self.pods(f"app.kubernetes.io/instance={self.name},app.kubernetes.io/component={component}")

    def redis_password(self) -> str:
        secret = json.loads(self.kubectl("get", "secret", self.component("redis"), "-o", "json").stdout)
        return base64.b64decode(secret["data"]["redis-password"]).decode()

    def signing_key(self, path: Path) -> Path:
        """The operator's approval signing key, written to ``path`` (mode 0600): a key the
        agents trust, for CLI approvals (``agent-saga approvals approve --signing-key``)."""
        secret = json.loads(self.kubectl("get", "secret", self.component("approval-signing"), "-o", "json").stdout)
        path.write_bytes(base64.b64decode(secret["data"]["signing-key.pem"]))
        path.chmod(0o600)
        return path

    def whoami(self) -> str:
        """The user the API server authenticates this kubeconfig as (the approver admission
        policy admits a decision only in that name)."""
        out = self.cluster.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout
        return str(out).strip()

    @contextlib.contextmanager
    def redis(self) -> Iterator[tuple[redis.Redis, str]]:
        """A client for the in-chart Redis (through `kubectl port-forward`), and its URL."""
        with port_forward(self.cluster, self.namespace, f"service/{self.component('redis')}", 6379,
                          Path(self.helm.env["HOME"])) as port:
            url = f"redis://:{self.redis_password()}@127.0.0.1:{port}/0"
            client = redis.Redis.from_url(url, decode_responses=True, socket_timeout=10)
            try:
                yield client, url
            finally:
                client.close()


@contextlib.contextmanager
def port_forward(cluster: KubeCluster, namespace: str, target: str, remote: int, workdir: Path) -> Iterator[int]:
    """`kubectl port-forward` to `target`; yields the local port."""
    log = workdir / f"port-forward-{secrets.token_hex(3)}.log"
    proc = ManagedProcess("kubectl port-forward", [
        require_asset("kubectl"), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "port-forward",
        "--address", "127.0.0.1", target, f":{remote}"], log).start()
    try:
        found: list[int] = []

        def forwarding() -> bool:
            m = re.search(r"Forwarding from 127\.0\.0\.1:(\d+)", log.read_text(errors="replace"))
            if m:
                found.append(int(m.group(1)))
            if proc.exited_message():
                raise StartupError(f"kubectl port-forward {target}: {proc.exited_message()}")
            return bool(found)

        wait_until(forwarding, timeout=60, what=f"kubectl port-forward {target}")
        yield found[0]
    finally:
        proc.stop(timeout=5)


def pod_http(cluster: KubeCluster, namespace: str, pod: str, path: str, body: dict[str, Any] | None = None,
             port: int = AGENT_PORT, timeout: float = 60) -> tuple[int, Any]:
    """An HTTP request to a pod, through the API server's pod proxy: (status, JSON)."""
    api = cluster.api_client()
    request = api.param_serialize(
        "GET" if body is None else "POST", f"/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy{path}",
        header_params={"Content-Type": "application/json", "Accept": "application/json"}, body=body,
        auth_settings=["BearerToken"])
    try:
        resp = api.call_api(*request, _request_timeout=timeout)
        status, data = resp.status, resp.read()
    except ApiException as e:
        status, data = e.status, e.body
    try:
        return status, json.loads(data or b"null")
    except ValueError:
        return status, (data or b"").decode(errors="replace")


class Agents:
    """The payments agent Deployment of examples/payments/deployment.yaml, on `release`."""

    def __init__(self, release: Release, replicas: int = 3, interval: float = 0.5, name: str = "payments-agent"
                 ) -> None:
        self.release, self.name, self.replicas = release, name, replicas
        deploy = example_agent(release.images)
        deploy["metadata"]["name"] = name
        deploy["spec"]["replicas"] = replicas
        container = deploy["spec"]["template"]["spec"]["containers"][0]
        env = {e["name"]: e for e in container["env"]}
        env.setdefault("PAYMENTS_INTERVAL", {"name": "PAYMENTS_INTERVAL"})["value"] = str(interval)
        env.setdefault("PAYMENTS_LEASE_SECONDS", {"name": "PAYMENTS_LEASE_SECONDS"})["value"] = "3"
        container["env"] = list(env.values())
        self.manifest = yaml.safe_dump(deploy)
        self.selector = ",".join(f"{k}={v}" for k, v in deploy["spec"]["selector"]["matchLabels"].items())

    def apply(self) -> None:
        self.release.kubectl("apply", "-f", "-", input=self.manifest)
        self.wait_ready()

    def wait_ready(self) -> None:
        self.release.kubectl("rollout", "status", f"deployment/{self.name}", f"--timeout={int(DEADLINE)}s",
                             timeout=DEADLINE + 10)
        poll(lambda: len(self.pods()) == self.replicas, what=f"{self.replicas} agent pods running")

    def pods(self) -> list[str]:
        return sorted(p["metadata"]["name"] for p in self.release.pods(self.selector)
                      if all(c.get("ready") for c in p["status"].get("containerStatuses") or [{}]))

    def http(self, pod: str, path: str, body: dict[str, Any] | None = None) -> Any:
        status, out = pod_http(self.release.cluster, self.release.namespace, pod, path, body)
        assert status == 200, f"{pod} {path}: HTTP {status}: {out}"
        return out

    def stats(self, pod: str) -> dict[str, Any]:
        return dict(self.http(pod, "/stats"))


def wait_gone(cluster: KubeCluster, namespace: str, pod: str, timeout: float = DEADLINE) -> None:
    def gone() -> bool:
        out = cluster.kubectl("-n", namespace, "get", "pod", pod, "--ignore-not-found", "-o", "name").stdout
        return out.strip() == ""

    wait_until(gone, timeout=timeout, what=f"pod {pod} gone")


def elapsed(t0: float) -> float:
    return time.monotonic() - t0


def notes_commands(output: str) -> list[str]:
    """The shell commands NOTES.txt prints, as printed: each indented `kubectl` or
    `agent-saga` line, and each heredoc block (from its `<<'EOF'` line to `EOF`)."""
    lines = output.split("NOTES:", 1)[1].splitlines()
    commands, i = [], 0
    while i < len(lines):
        line = lines[i]
        heredoc = line.rstrip().endswith("<<'EOF'")
        if line.lstrip().startswith(("kubectl ", "agent-saga ")) and (line.startswith("  ") or heredoc):
            if heredoc:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "EOF")
                commands.append("\n".join(lines[i:end + 1]) + "\n")
                i = end
            else:
                commands.append(line)
        i += 1
    return commands


def exec_python(release: Release, pod: str, script: str, stdin: str | None = None, container: str | None = None
                ) -> dict[str, Any]:
    """Run `python -c script` in a pod's container (kubectl exec); its last line, as JSON."""
    args = ["exec", *(["-i"] if stdin is not None else []), pod, *(["-c", container] if container else []),
            "--", "python", "-c", script]
    out = release.kubectl(*args, input=stdin, timeout=120).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))
