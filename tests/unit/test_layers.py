"""The layer contracts (``[tool.importlinter]`` in pyproject.toml) hold, and they bite:
a copy of the tree with one import that breaks a contract fails ``lint-imports``."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
PACKAGES = {"runtime": "agent_saga", "operator": "agent_saga_operator", "recoveryd": "agent_saga_recoveryd"}
SCRIPTS = ("bench", "hack")  # read as namespace packages: lint-imports runs from the checkout


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages under ``root`` (its pyproject.toml's contracts)."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: run `make install` (import-linter is in the dev extra)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(root / d) for d in PACKAGES), COLUMNS="1000")
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def copy_tree(dest: Path) -> Path:
    for folder, package in PACKAGES.items():
        shutil.copytree(REPO / folder / package, dest / folder / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    for scripts in SCRIPTS:
        shutil.copytree(REPO / scripts, dest / scripts, ignore=shutil.ignore_patterns("__pycache__", "results"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def broken_contracts(stdout: str) -> dict[str, str]:
    """Each broken contract's name -> what lint-imports says about it (run unwrapped)."""
    lines = stdout.split("Broken contracts", 1)[-1].splitlines()
    heads = [n - 1 for n, line in enumerate(lines) if n > 1 and set(line) == {"-"}]
    ends = [*heads[1:], len(lines)]
    return {lines[h].strip(): "\n".join(lines[h + 2:end]) for h, end in zip(heads, ends, strict=True)}


def test_the_tree_keeps_every_layer_contract() -> None:
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


# One import each contract forbids: (file, line added to it, the contract's name, the import
# lint-imports must name under that contract).
BREAKS = [
    # a control reaching into another control (the kill switch importing the gate)
    ("runtime/agent_saga/controls/killswitch/_switch.py", "from ..gate import PreFlightGate",
     "The gate composes the controls", "agent_saga.controls.killswitch._switch -> agent_saga.controls.gate"),
    # the SagaPolicy reaching into the limits (a sibling control)
    ("runtime/agent_saga/controls/policy/_model.py", "from ..limits import LimitSpec",
     "The gate composes the controls", "agent_saga.controls.policy._model -> agent_saga.controls.limits"),
    # the WAL importing the engine above it
    ("runtime/agent_saga/wal/base.py", "from ..engine import Saga", "The runtime is layered",
     "agent_saga.wal.base -> agent_saga.engine"),
    # one WAL backend importing another
    ("runtime/agent_saga/wal/redis.py", "from .file import FileWAL",
     "The WAL backends are independent", "agent_saga.wal.redis -> agent_saga.wal.file"),
    # the recovery plan importing the daemon above it
    ("runtime/agent_saga/recovery/plan.py", "from .daemon import RecoveryDaemon",
     "Recovery is layered", "agent_saga.recovery.plan -> agent_saga.recovery.daemon"),
    # the operator's conditions importing its handlers
    ("operator/agent_saga_operator/conditions.py", "from .handlers import startup",
     "The operator is layered", "agent_saga_operator.conditions -> agent_saga_operator.handlers"),
    # the runtime importing the operator
    ("runtime/agent_saga/kit.py", "import agent_saga_operator.handlers", "never imports the operator",
     "agent_saga.kit -> agent_saga_operator.handlers"),
    # outside the runtime: a private module, from the operator and from hack/
    ("operator/agent_saga_operator/config.py", "from agent_saga._redis import connect_async",
     "whose name starts with _", "agent_saga_operator.config -> agent_saga._redis"),
    ("hack/demo_fleet.py", "from agent_saga.controls.approvals._signing import ANY_APPROVER",
     "whose name starts with _", "hack.demo_fleet -> agent_saga.controls.approvals._signing"),
    # outside the runtime: a module behind a package's surface, from recoveryd and bench/
    ("recoveryd/agent_saga_recoveryd/app.py", "from agent_saga.wal.base import BaseWAL",
     "shows its surface in its __init__", "agent_saga_recoveryd.app -> agent_saga.wal.base"),
    ("bench/bench_wal.py", "from agent_saga.recovery.daemon import import_modules",
     "shows its surface in its __init__", "bench.bench_wal -> agent_saga.recovery.daemon"),
]


def test_an_import_that_breaks_a_contract_fails_the_lint(tmp_path: Path) -> None:
    # One copy of the tree with every forbidden import added (one lint run): each contract
    # must be broken, naming the import added for it.
    root = copy_tree(tmp_path)
    for path, line, _, _ in BREAKS:
        target = root / path
        target.write_text(target.read_text() + f"\n{line}  # noqa: E402,F401\n")
    run = lint_imports(root)
    assert run.returncode != 0, run.stdout
    broken = broken_contracts(run.stdout)
    for path, _, contract, violation in BREAKS:
        found = [text for name, text in broken.items() if contract in name]
        assert found, f"{path}: no broken contract named like {contract!r}; broken: {sorted(broken)}"
        assert any(re.search(r"^-\s+" + re.escape(violation) + r"\s", text, re.M) for text in found), (
            f"{contract!r} is broken, but not by {violation}:\n{found}")
