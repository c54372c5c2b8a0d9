"""The examples in examples/ run offline and end clean (they are what `make demo` runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["multi_domain.py", "chaos_demo.py", "crash_recovery.py"])
def test_example_runs_and_ends_clean(name: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("clean") and "NOT CLEAN" not in r.stdout


def test_multi_domain_shows_lifo_rollback() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "multi_domain.py")],
                       capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    undo = [ln.split("]")[0].strip(" [") for ln in lines
            if any(w in ln for w in ("closed", "deleted namespace", "terminated"))]
    assert undo == ["github", "jira", "pinecone", "aws"]  # newest first
