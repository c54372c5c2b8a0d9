"""CrewAI, in its own environment: runs crewai_cases.py under .venv-crewai's Python.

CrewAI pins mcp<2, openai<3 and pydantic<2.13, which the main environment's MCP SDK and
OpenAI Agents SDK cannot share, so ``make test`` (``make crewai-venv``) builds ``.venv-crewai`` (CrewAI plus
this package, editable) and this test runs the CrewAI cases there, offline.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PYTHON = ROOT / ".venv-crewai" / "bin" / "python"


def test_the_crewai_adapter_cases_pass_in_the_crewai_environment() -> None:
    if not PYTHON.exists():
        pytest.fail(f"{PYTHON} is missing: run `make crewai-venv` (CrewAI's own venv; `make test` builds it)")
    proc = subprocess.run(
        [str(PYTHON), "-m", "pytest", str(HERE / "crewai_cases.py"), "-q", "-p", "no:cacheprovider",
         "--confcutdir", str(HERE)],
        cwd=ROOT, capture_output=True, text=True, timeout=280,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert "3 passed" in proc.stdout, proc.stdout[-2000:]
