"""A new platform engineer's first hour: README.md and docs/install.md, run as written.

The commands are read from the two documents when the test runs (so the docs cannot
drift from what works) and run with bash, in order, against a control plane of their own
(kube-apiserver + etcd: the journey creates namespaces, installs and uninstalls the
release and finally deletes the CRDs, which a shared cluster must not see), with the
cluster's kubectl and helm (and the `kubectl saga` plugin) on PATH, `KUBECONFIG` set, and `AGENT_SAGA_REDIS_URL` pointing
at a real Redis. The working directory holds what the docs assume: the repository's
`charts/`, `crds/` and `examples/`, and an `agent-saga.wal` written by a real saga.

What is read:
- docs/install.md: every indented or fenced code block. A fenced `yaml` block whose first
  line is `# FILE` is written to FILE (the values file); a fenced block in another
  non-shell language (a `dockerfile`) is shown, not run; every other line is a command, a
  comment, or the continuation of a command ending in `\\`. A line the journey does not
  recognise as one of the programs a reader runs fails the test (nothing is dropped silently).
- README.md: the quick start's `make` lines and the `$ ` lines of its console blocks.

A command the local control plane cannot run carries a trailing
`# (not run in the docs test: WHY)` in the docs themselves (a container build, commands
that run the test suites, one that runs until stopped, placeholders such as
`myapp.handlers`); the test lists them and checks the reason is given. There is no
kubelet or scheduler: pods are never started, so nothing here waits for one.

Order: install.md up to "## Upgrade" (namespaces, Secret, values file, helm install,
the example KillSwitch), then the README's commands (which apply the same example), then
the rest of install.md (upgrade, uninstall, CRDs deleted; before the CRDs are deleted
every kind is read once, as the operator would have: see `_read_every_kind_once`). Between the phases the test
checks what a reader would look at: the release is deployed, no ServiceMonitor was
created on a cluster without the Prometheus Operator, the KillSwitch is in the example
agents' namespace (agent-saga) and not in `default`, the approver RoleBindings come from
the chart's values, and after the uninstall nothing is left (those bindings included).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.binaries import REPO_ROOT, require_asset
from fixtures.controlplane import ControlPlane, KubeCluster
from fixtures.polling import until
from fixtures.redis_server import RedisServer

INSTALL = REPO_ROOT / "docs" / "install.md"
README = REPO_ROOT / "README.md"
SKIP = re.compile(r"#.*\(not run in the docs test: (?P<why>.+)\)\s*$")
PROGRAMS = ("kubectl", "helm", "make", "docker", "kind", "bash", "agent-saga", "agent-saga-operator", "pip",
            ".venv/bin/python", "eval", "echo", "export")
#: Fenced blocks in these languages are commands; another language (dockerfile) is shown,
#: not run; yaml with a "# FILE" first line is written to FILE, unless that line is marked
#: "(not run in the docs test: WHY)" (a file of the reader's own chart, shown).
SHELL_LANGS = ("", "console", "bash", "sh", "shell")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")


@dataclass(frozen=True)
class Step:
    source: str  # "docs/install.md:64"
    command: str | None = None  # a shell command
    file: tuple[str, str] | None = None  # (name, content) to write
    skipped: str | None = None  # why it is not run
    section: str = ""


def _is_command(text: str) -> bool:
    return text.split(" ", 1)[0] in PROGRAMS


def _commands(lines: list[tuple[int, str]], where: str, section: str) -> Iterator[Step]:
    """Commands (joined over trailing backslashes) from the lines of one code block."""
    pending: list[str] = []
    start = 0
    for n, raw in lines:
        text = raw.strip()
        if not pending and (not text or text.startswith("#")):
            continue
        if not pending:
            assert _is_command(text), (
                f"{where}:{n}: {text!r} is in a code block but is not a command the docs journey knows "
                f"({', '.join(PROGRAMS)}): add the program to PROGRAMS, or mark it '# (not run in the docs test: WHY)'")
            start = n
        pending.append(text)
        if text.endswith("\\") and not SKIP.search(text):
            continue
        joined = " ".join(p.rstrip("\\").strip() for p in pending)
        pending = []
        skip = SKIP.search(joined)
        yield Step(f"{where}:{start}", command=joined, skipped=skip.group("why") if skip else None, section=section)
    assert not pending, f"{where}: a command ends with a backslash"


def install_steps() -> list[Step]:
    """Every code block of docs/install.md, in order."""
    lines = INSTALL.read_text().splitlines()
    steps: list[Step] = []
    section = ""
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
        fence = FENCE.match(line)
        if fence:
            body: list[tuple[int, str]] = []
            i += 1
            while not FENCE.match(lines[i]):
                body.append((i + 1, lines[i]))
                i += 1
            text = textwrap.dedent("\n".join(t for _, t in body)) + "\n"
            first = text.splitlines()[0].strip()
            skip = SKIP.search(first)
            if fence.group("lang") == "yaml" and skip:  # a file of the user's own, shown not written
                steps.append(Step(f"docs/install.md:{body[0][0]}", skipped=skip.group("why"), section=section))
            elif fence.group("lang") == "yaml":
                assert first.startswith("# "), f"docs/install.md:{body[0][0]}: a yaml block without '# FILE' first"
                steps.append(Step(f"docs/install.md:{body[0][0]}", file=(first[2:].strip(), text), section=section))
            elif fence.group("lang") in SHELL_LANGS:
                steps += _commands(body, "docs/install.md", section)
        elif line.startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            block: list[tuple[int, str]] = []
            while i < len(lines) and (lines[i].startswith("    ") or not lines[i].strip()):
                if lines[i].strip() and FENCE.match(lines[i]):
                    break
                block.append((i + 1, lines[i]))
                i += 1
            steps += _commands(block, "docs/install.md", section)
            continue
        i += 1
    return steps


def readme_steps() -> list[Step]:
    """The quick start's `make` lines and every `$ ` line of the README's console blocks."""
    lines = README.read_text().splitlines()
    picked: list[tuple[int, str]] = []
    in_console = False
    for n, line in enumerate(lines, 1):
        fence = FENCE.match(line)
        if fence:
            in_console = not in_console and fence.group("lang") == "console"
            continue
        if in_console and line.startswith("$ "):
            picked.append((n, line[2:]))
        elif not in_console and line.startswith("    make "):
            picked.append((n, line))
    return list(_commands(picked, "README.md", "README"))


# --------------------------------------------------------------------------- parsing
def test_the_docs_are_read_whole() -> None:
    """The journey sees every command of both documents (this fails if parsing breaks)."""
    steps = install_steps()
    commands = [s.command for s in steps if s.command]
    assert any(c.startswith("helm install agent-saga charts/agent-saga -n agent-saga -f values.yaml")
               for c in commands)
    assert "helm uninstall agent-saga -n agent-saga --wait" in commands
    assert [s.file[0] for s in steps if s.file] == ["values.yaml", "approvers.yaml"]
    assert len([s for s in steps if s.command and not s.skipped]) >= 12
    readme = readme_steps()
    assert any(s.command and s.command.startswith("agent-saga status ") for s in readme)
    assert any(s.command and s.command.startswith("kubectl apply -f examples/k8s/killswitch.yaml ") for s in readme)
    assert any(s.command and s.command.startswith("kubectl saga halt ") and not s.skipped for s in readme)
    assert any(c.startswith("kubectl saga status -n agent-saga") for c in commands)
    assert "kubectl delete approvals,killswitches,budgetlimits,sagapolicies,modelroutes --all -A" in commands
    # The "make cluster" path runs on a node (tests/node/test_docs_journey_on_node.py), not here.
    assert any(s.skipped and s.command and '-f "$AGENT_SAGA_CLUSTER_VALUES"' in s.command for s in steps)
    assert len([s for s in readme if s.skipped]) == 8  # make demo, make test, recover x2, reconcile, approve, mcp, ui
    for step in steps + readme:
        if step.skipped:
            assert len(step.skipped) > 10, step  # a reason a reader understands


# --------------------------------------------------------------------------- the journey
@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KubeCluster]:
    cp = ControlPlane(tmp_path_factory.mktemp("journey-kube"))
    try:
        cp.start()
        yield cp.cluster()
    finally:
        cp.stop()


def _workdir(tmp: Path) -> Path:
    work = tmp / "work"
    work.mkdir()
    for name in ("charts", "crds", "examples"):
        (work / name).symlink_to(REPO_ROOT / name)
    # The log the README's verify / inspect / certify read: one real saga, committed.
    script = textwrap.dedent("""
        import asyncio
        from agent_saga import ActionSemantics, FileWAL, saga_scope

        async def main():
            async with saga_scope(FileWAL("agent-saga.wal"), name="onboard") as saga:
                await saga.execute("docs.lookup", ActionSemantics.REVERSIBLE, forward=lambda: {"ok": True})

        asyncio.run(main())
    """)
    subprocess.run([str(REPO_ROOT / ".venv" / "bin" / "python"), "-c", script], cwd=work, check=True, timeout=60)
    return work


def _plugin_fallback(home: Path) -> Path:
    """A directory holding a `kubectl-saga` that runs this tree's plugin: on PATH after
    `.venv/bin`, so the installed console script is used when the virtualenv has it (it
    is created by `make install` from pyproject.toml) and this tree's module otherwise."""
    bindir = home / "plugin-bin"
    bindir.mkdir(parents=True, exist_ok=True)
    plugin = bindir / "kubectl-saga"
    plugin.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO_ROOT / "runtime"}" exec "{REPO_ROOT / ".venv" / "bin" / "python"}" '
                      f'-m agent_saga.kubectl "$@"\n')
    plugin.chmod(0o755)
    return bindir


def _env(cluster: KubeCluster, home: Path, redis_url: str) -> dict[str, str]:
    paths = [str(require_asset("kubectl").parent), str(require_asset("helm").parent),
             str(REPO_ROOT / ".venv" / "bin"), str(_plugin_fallback(home)), "/usr/local/bin", "/usr/bin", "/bin"]
    return {
        "PATH": os.pathsep.join(paths),
        "HOME": str(home),
        "KUBECONFIG": str(cluster.kubeconfig),
        "HELM_CACHE_HOME": str(home / "helm-cache"),
        "HELM_CONFIG_HOME": str(home / "helm-config"),
        "HELM_DATA_HOME": str(home / "helm-data"),
        "AGENT_SAGA_REDIS_URL": redis_url,
        "AGENT_SAGA_NAMESPACE": "agent-saga",
    }


def _run(step: Step, work: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    if step.file is not None:
        (work / step.file[0]).write_text(step.file[1])
        return subprocess.CompletedProcess([], 0, "", "")
    assert step.command is not None
    proc = subprocess.run(["bash", "-c", "set -eo pipefail\n" + step.command], cwd=work, env=env,
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (
        f"{step.source}: `{step.command}` exited {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")
    return proc


def _run_all(steps: list[Step], work: Path, env: dict[str, str], ran: list[str], skipped: list[str]) -> None:
    for step in steps:
        if step.skipped:
            skipped.append(f"{step.source}: {step.skipped}")
            continue
        _run(step, work, env)
        ran.append(f"{step.source}: {step.command or step.file and step.file[0]}")


def _read_every_kind_once(cluster: KubeCluster) -> None:
    """Read each kind of the chart's CRDs until the API server serves it from its watch cache.

    No operator ever runs in this journey, so nothing has read most kinds since the API
    server started, and a kind's watch cache is created by its first read. Deleting a CRD
    whose cache is cold can leave it `Terminating` for up to five minutes: the API server's
    own cleanup fails once with "storage is (re)initializing" and waits for its next resync
    (install.md, "A CRD that stays Terminating", says how to recognise and end that). A
    cluster where the operator ran has read every kind it watches; this puts the journey's
    cluster in that state: the API server answers an unlimited list of a kind from its
    watch cache, with 429 "storage is (re)initializing" until that cache is ready.
    """
    crds = json.loads(cluster.kubectl("get", "crd", "-o", "json").stdout)["items"]
    ours = [c for c in crds if c["spec"]["group"] in ("agentsaga.dev", "kopf.dev")]
    assert len(ours) == 7, [c["metadata"]["name"] for c in ours]
    for crd in ours:
        version = next(v["name"] for v in crd["spec"]["versions"] if v["served"])
        path = f"/apis/{crd['spec']['group']}/{version}/{crd['spec']['names']['plural']}"

        def served(path: str = path) -> bool | None:
            read = cluster.kubectl("get", "--raw", path, check=False)
            assert read.returncode == 0 or "initializing" in read.stderr, (path, read.stderr)
            return read.returncode == 0 or None

        until(f"the API server to serve {path} from its watch cache", served, timeout=60, interval=0.2)


def test_readme_and_install_guide_as_written(cluster: KubeCluster, fresh_redis: RedisServer, tmp_path: Path) -> None:
    work = _workdir(tmp_path)
    env = _env(cluster, tmp_path / "home", fresh_redis.url)
    kubectl = cluster.kubectl
    steps = install_steps()
    upgrade_at = next(i for i, s in enumerate(steps) if s.section == "Upgrade")
    ran: list[str] = []
    skipped: list[str] = []

    _run_all(steps[:upgrade_at], work, env, ran, skipped)
    status = json.loads(subprocess.run(["helm", "status", "agent-saga", "-n", "agent-saga", "-o", "json"], env=env,
                                       capture_output=True, text=True, check=True).stdout)
    assert status["info"]["status"] == "deployed"
    manifest = subprocess.run(["helm", "get", "manifest", "agent-saga", "-n", "agent-saga"], env=env,
                              capture_output=True, text=True, check=True).stdout
    # The values file asks for ServiceMonitors; this cluster has no Prometheus Operator.
    assert "kind: ServiceMonitor" not in manifest and "no ServiceMonitor was created" in " ".join(
        status["info"]["notes"].split())
    # The example lands where the example agents run (next to the chart), not in `default`.
    assert kubectl("get", "killswitch", "halt-wire-send", "-n", "agent-saga", "-o", "name").stdout.strip()
    assert kubectl("get", "killswitches", "-n", "default", "-o", "name").stdout.strip() == ""
    assert kubectl("get", "secret", "agent-saga-redis", "-n", "agent-saga", "-o", "name").stdout.strip()

    _run_all(readme_steps(), work, env, ran, skipped)

    # The approver RoleBindings come from the chart's values (install.md step 5).
    bindings = kubectl("get", "rolebindings", "-n", "agent-saga", "-l", "app.kubernetes.io/component=approver",
                       "-o", "name").stdout.split()
    assert sorted(bindings) == ["rolebinding.rbac.authorization.k8s.io/agent-saga-approver",
                                "rolebinding.rbac.authorization.k8s.io/agent-saga-break-glass"]

    crds_deleted_at = next(i for i, s in enumerate(steps) if s.command == "kubectl delete -f charts/agent-saga/crds/")
    _run_all(steps[upgrade_at:crds_deleted_at], work, env, ran, skipped)
    _read_every_kind_once(cluster)
    _run_all(steps[crds_deleted_at:], work, env, ran, skipped)
    assert subprocess.run(["helm", "list", "-A", "-q"], env=env, capture_output=True, text=True,
                          check=True).stdout.split() == []
    assert kubectl("get", "rolebindings", "-A", "-l", "app.kubernetes.io/component=approver",
                   "-o", "name").stdout.strip() == ""  # removed with the release, not left dangling
    left = kubectl("get", "crd", "-o", "name").stdout.split()
    assert [c for c in left if "agentsaga.dev" in c or "kopf.dev" in c] == []

    # What ran and what, by design, did not (printed with -rA / on failure).
    print("ran:\n  " + "\n  ".join(ran))
    print("not run (reason in the docs):\n  " + "\n  ".join(skipped))
    assert len(ran) >= 20 and len(skipped) >= 6
