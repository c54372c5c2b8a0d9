"""What a new user copies from the README and the reference, run against the built wheel.

The package is built as ``pip install agent-saga`` gets it (a wheel of this checkout) and
unpacked into a directory that is the only agent-saga on the path; every usage runs in a
scratch project directory, away from the repository. Each snippet and command either works
or fails with a message naming the fix. The snippets are this suite's own copies
(tests/integration/usages/snippets.py), run by tests/integration/usages/runner.py.

The wheel's metadata carries the license files (``License-File``), and the extras and
console scripts the documentation names exist.
"""

from __future__ import annotations

import email.parser
import json
import os
import shutil
import subprocess
import sys
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.polling import until

ROOT = Path(__file__).resolve().parents[2]
USAGES_DIR = Path(__file__).resolve().parent / "usages"
sys.path.insert(0, str(USAGES_DIR))

from snippets import USAGES  # noqa: E402

CONSOLE = """#!{python}
import sys
from {module} import {func}
sys.exit({func}())
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A wheel of this checkout, built from a copy of it (the build writes beside its sources)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE", "NOTICE"):
        shutil.copy(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("runtime", "operator", "recoveryd"):
        shutil.copytree(ROOT / name, src / name, ignore=skip)
    out = tmp_path_factory.mktemp("dist")
    r = subprocess.run([sys.executable, "-c", f"import setuptools.build_meta as b; print(b.build_wheel({str(out)!r}))"],
                       cwd=src, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return out / r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel installed into a directory of its own (a pure wheel: unpacked, with its
    console scripts written as pip writes them, from its entry_points.txt)."""
    target = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as z:
        z.extractall(target)
    bin_dir = target / "bin"
    bin_dir.mkdir()
    entry_points = next(target.glob("*.dist-info")) / "entry_points.txt"
    section = ""
    for line in entry_points.read_text().splitlines():
        if line.startswith("["):
            section = line.strip("[]")
        elif section == "console_scripts" and "=" in line:
            name, _, ref = (part.strip() for part in line.partition("="))
            module, _, func = ref.partition(":")
            script = bin_dir / name
            script.write_text(CONSOLE.format(python=sys.executable, module=module, func=func))
            script.chmod(0o755)
    return target


def user_env(installed: Path) -> dict[str, str]:
    """A user's shell: the installed package only (no checkout on the path), no agent-saga settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_") and k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(installed)
    env["PATH"] = f"{installed / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


@pytest.fixture(scope="module")
def project(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch project: the user's own reconcilers module and MCP server."""
    d = tmp_path_factory.mktemp("project")
    (d / "myapp").mkdir()
    (d / "myapp" / "__init__.py").write_text("")
    reconciler = USAGES["reconciler"]
    (d / "myapp" / "reconcilers.py").write_text(reconciler.prelude + reconciler.code)
    (d / "my_mcp_server.py").write_text(MCP_SERVER)
    return d


def runner(installed: Path, project: Path, *argv: str) -> list[dict[str, Any]]:
    r = subprocess.run([sys.executable, str(USAGES_DIR / "runner.py"), *argv], cwd=project, env=user_env(installed),
                       capture_output=True, text=True, timeout=280)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


@pytest.fixture(scope="module")
def code_results(installed: Path, project: Path) -> dict[str, dict[str, Any]]:
    """Every snippet, in one process (as one notebook kernel), in the scratch project."""
    results = runner(installed, project, "code", *USAGES)
    return {r["name"]: r for r in results}


# ------------------------------------------------------------------------- the wheel
def test_the_wheel_carries_the_license_the_extras_and_the_console_scripts(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(f"{info}/METADATA").decode())
        scripts = z.read(f"{info}/entry_points.txt").decode()
        assert z.read(f"{info}/licenses/LICENSE") == (ROOT / "LICENSE").read_bytes()
        assert z.read(f"{info}/licenses/NOTICE") == (ROOT / "NOTICE").read_bytes()
    assert meta["Name"] == "agent-saga" and meta["License-Expression"] == "Apache-2.0"
    assert meta.get_all("License-File") == ["LICENSE", "NOTICE"]
    assert {"encryption", "redis", "postgres", "opentelemetry", "connectors", "fastapi", "langgraph"} <= set(meta.get_all("Provides-Extra"))
    for script in ("agent-saga =", "saga-recoveryd =", "agent-saga-recoveryd ="):
        assert script in scripts, scripts
    assert "agent_saga/ui/static/index.html" in names or any(n.startswith("agent_saga/ui/static/") for n in names)


# ------------------------------------------------------------------------- the snippets
@pytest.mark.parametrize("name", list(USAGES))
def test_a_copied_snippet_works_or_names_the_fix(name: str, code_results: dict[str, dict[str, Any]]) -> None:
    usage, got = USAGES[name], code_results[name]
    if usage.fails_with:
        assert usage.fails_with in got["error"], got["error"]
    else:
        assert got["error"] == "", got["error"]
    assert got["check_failed"] == "", got["check_failed"]


def test_the_snippets_ran_the_installed_wheel_not_the_checkout(installed: Path, code_results: dict[str, dict[str, Any]]) -> None:
    assert code_results["(agent_saga)"]["file"] == str(installed / "agent_saga" / "__init__.py")


# ------------------------------------------------------------------------- the commands
# (command line, exit code, what its output says). They run in order in one process, in
# the project the snippets ran in (its ./agent-saga.wal holds their sagas).
COMMANDS: list[tuple[str, int, str]] = [
    ("agent-saga verify --wal-path ./agent-saga.wal", 0, "chain intact"),
    ("agent-saga export --wal-path ./agent-saga.wal --out ./audit-2026-07", 0, "sha256sum -c SHA256SUMS"),
    # The escalated charge (no "refund" handler) is terminal, named with its fix: accounted for.
    ("agent-saga certify --wal-path ./agent-saga.wal", 0, "@compensator('refund')"),
    ("agent-saga reconcile --wal-path ./agent-saga.wal --import agent_saga.connectors.stripe "
     "--import agent_saga.connectors.postgres", 3, "no @reconciler registered for 'aws.terminate_instance'"),
    ('agent-saga halt --scope tool:wire.send --reason "fraud pattern" --by soc@corp', 0, "engaged HALT tool:wire.send"),
    ('agent-saga halt --drain --reason "deploying" --by ci@corp --ttl 600', 0, "engaged DRAIN global"),
    ('agent-saga quarantine saga-8f3c --reason "suspected duplicate charges" --by soc@corp', 0, "engaged QUARANTINE saga:saga-8f3c"),
    ("agent-saga status", 0, "HALT tool:wire.send by soc@corp"),
    ("agent-saga resume --scope tool:wire.send --by soc@corp", 0, "lifted HALT tool:wire.send"),
    # No agent here has asked for an approval: the store is named, with how to point at one.
    ("agent-saga approvals list", 2, "FileApprovalStore() writes ./agent-saga-approvals, which does not exist here"),
    ('agent-saga approvals approve af83c011... --approver risk@corp --note "verified by phone"', 2,
     "pass --store redis://HOST:PORT/DB"),
]


@pytest.fixture(scope="module")
def command_results(installed: Path, project: Path, code_results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    results = runner(installed, project, "cli", *(line for line, _, _ in COMMANDS))
    # The user's own reconcilers, in a process of their own (as from a shell): the module is
    # found in the project directory, as `python -m` would find it.
    results += runner(installed, project, "cli", "agent-saga reconcile --wal-path ./agent-saga.wal --import myapp.reconcilers")
    return {r["line"]: r for r in results}


@pytest.mark.parametrize("line, code, says", COMMANDS, ids=[c[0].split(" --")[0] for c in COMMANDS])
def test_a_documented_command_works_or_names_the_fix(
    line: str, code: int, says: str, command_results: dict[str, dict[str, Any]]
) -> None:
    got = command_results[line]
    assert (got["code"], says in got["stdout"] + got["stderr"]) == (code, True), got


def test_reconcile_imports_the_users_module_from_the_project_directory(command_results: dict[str, dict[str, Any]]) -> None:
    got = command_results["agent-saga reconcile --wal-path ./agent-saga.wal --import myapp.reconcilers"]
    assert got["code"] == 3 and "cannot import" not in got["stderr"], got  # 3: nothing of stripe's to verify here
    assert "[UNVERIFIABLE] aws.run_instances" in got["stdout"], got


def test_the_console_scripts_run(installed: Path, project: Path) -> None:
    env = user_env(installed)
    status = subprocess.run(["agent-saga", "status"], cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert status.returncode == 0 and "KILL SWITCH" in status.stdout, status.stdout + status.stderr
    daemon = subprocess.run(["saga-recoveryd", "--help"], cwd=project, env=env, capture_output=True, text=True, timeout=60)
    assert daemon.returncode == 0 and "--wal-path" in daemon.stdout, daemon.stdout + daemon.stderr


# ------------------------------------------------------------------------- MCP proxy
MCP_SERVER = '''
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if "id" not in msg:
        continue
    if msg["method"] == "initialize":
        result = {"protocolVersion": "2025-06-18", "capabilities": {"tools": {}}, "serverInfo": {"name": "my", "version": "1"}}
    elif msg["method"] == "tools/list":
        result = {"tools": [{"name": "search_docs", "description": "search", "inputSchema": {"type": "object"}}]}
    else:
        result = {"content": [{"type": "text", "text": "found"}]}
    print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": result}), flush=True)
'''

#: The policy file as the reference shows it.
POLICY = """{
  "mode": "enforce",
  "tools": {
    "stripe__create_charge": {
      "semantics": "COMPENSABLE",
      "compensate": {"tool": "stripe__create_refund", "args": {"charge": "$.id"}},
      "policy_args": {"amount": "$.amount"}
    },
    "search_docs": {"semantics": "REVERSIBLE"}
  }
}
"""


def mcp_session(argv: list[str], cwd: Path, env: dict[str, str], calls: list[str]) -> list[dict[str, Any]]:
    """An MCP client's session with the proxy over pipes: initialize, list, call ``calls``."""
    msgs: list[dict[str, Any]] = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize",
         "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "c", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
        *({"jsonrpc": "2.0", "id": 3 + i, "method": "tools/call", "params": {"name": n, "arguments": {}}} for i, n in enumerate(calls)),
    ]
    answers = []
    with subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        try:
            for msg in msgs:
                proc.stdin.write(json.dumps(msg) + "\n")
                proc.stdin.flush()
                if "id" in msg:
                    answers.append(json.loads(proc.stdout.readline()))
            proc.stdin.close()
            err = proc.stderr.read()
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, err
    return answers


def test_the_mcp_proxy_commands_observe_then_enforce_the_reviewed_file(installed: Path, tmp_path: Path) -> None:
    project = tmp_path  # a project of its own: the kill-switch commands above drained the other one
    (project / "my_mcp_server.py").write_text(MCP_SERVER)
    env = user_env(installed)
    observed = mcp_session(["agent-saga", "mcp", "--observe", "--emit-policy", "saga-policy.json", "--",
                            "python", "-m", "my_mcp_server"], project, env, ["search_docs"])
    assert observed[-1]["result"]["content"][0]["text"] == "found"
    skeleton = json.loads((project / "saga-policy.json").read_text())
    assert skeleton["tools"] == {"search_docs": {"semantics": "IRREVERSIBLE"}}  # everything IRREVERSIBLE until reviewed
    (project / "saga-policy.json").write_text(POLICY)  # the reviewed file
    enforced = mcp_session(["agent-saga", "mcp", "--policy", "saga-policy.json", "--", "python", "-m", "my_mcp_server"],
                           project, env, ["search_docs", "undeclared_tool"])
    assert enforced[2]["result"]["content"][0]["text"] == "found"
    assert "undeclared tools are refused" in enforced[3]["error"]["message"], enforced[3]


def test_the_mcp_proxy_with_its_output_in_a_file_says_to_pipe_it(installed: Path, project: Path, tmp_path: Path) -> None:
    with open(tmp_path / "out", "w") as out, open(os.devnull) as devnull:
        r = subprocess.run(["agent-saga", "mcp", "--observe", "--emit-policy", "x.json", "--", "python", "-m", "my_mcp_server"], cwd=project,
                           env=user_env(installed), stdin=devnull, stdout=out, stderr=subprocess.PIPE, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("agent-saga mcp: stdout is a regular file here"), r.stderr
    assert not (project / "x.json").exists()  # no session: no skeleton to review
    assert "pipe it instead" in r.stderr, r.stderr


# ------------------------------------------------------------------------- the debugger
def test_the_debugger_serves_the_projects_log_both_ways(installed: Path, project: Path,
                                                        code_results: dict[str, dict[str, Any]]) -> None:
    """``agent-saga ui`` and ``python -m agent_saga.ui``, side by side (``--port 0``: the
    documented 8080 may be taken on a shared machine)."""
    argvs = [["agent-saga", "ui", "--wal-path", "./agent-saga.wal", "--port", "0"],
             ["python", "-m", "agent_saga.ui", "--wal-path", "./agent-saga.wal", "--port", "0"]]
    procs = [subprocess.Popen(argv, cwd=project, env=user_env(installed), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for argv in argvs]
    try:
        for proc in procs:
            assert proc.stdout is not None
            line = until("the debugger's address", proc.stdout.readline, proc=proc)
            url = line.split(" at ", 1)[1].split(" ", 1)[0]
            with urllib.request.urlopen(url, timeout=30) as resp:
                assert resp.status == 200
    finally:
        for proc in procs:
            proc.terminate()
            proc.communicate(timeout=30)


@pytest.fixture(autouse=True, scope="module")
def _no_stray_files() -> Iterator[None]:
    """Nothing here writes into the checkout."""
    before = set(os.listdir(ROOT))
    yield
    assert set(os.listdir(ROOT)) == before

