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


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` over the packages under ``root`` (its pyproject.toml's contracts)."""
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: run `make install` (import-linter is in the dev extra)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(root / d) for d in PACKAGES))
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=root, env=env, capture_output=True,
                          text=True, timeout=120)


def copy_tree(dest: Path) -> Path:
    for folder, package in PACKAGES.items():
        shutil.copytree(REPO / folder / package, dest / folder / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", dest / "pyproject.toml")
    return dest


def test_the_tree_keeps_every_layer_contract() -> None:
    run = lint_imports(REPO)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        # a control reaching into another control (the kill switch importing the gate)
        ("agent_saga/controls/killswitch/_switch.py", "from ..gate import PreFlightGate",
         "The gate composes the controls"),
        # the WAL importing the engine above it
        ("agent_saga/wal/base.py", "from ..engine import Saga", "The runtime is layered"),
        # the runtime importing the operator
        ("agent_saga/kit.py", "import agent_saga_operator.handlers", "never imports the operator"),
    ],
)
def test_an_import_that_breaks_a_contract_fails_the_lint(tmp_path: Path, module: str, line: str,
                                                         contract: str) -> None:
    root = copy_tree(tmp_path)
    target = root / "runtime" / module
    target.write_text(target.read_text() + f"\n{line}  # noqa: E402,F401\n")
    run = lint_imports(root)
    assert run.returncode != 0, run.stdout
    flat = " ".join(run.stdout.split())
    # "<contract name> BROKEN", the name wrapped over lines (never another contract's verdict)
    assert re.search(re.escape(contract) + r"(?:(?! KEPT).)*? BROKEN", flat), run.stdout
