"""docs/gitops.md, run as written: the commands of "Try it on your machine", each with bash
in a directory holding the repository's examples/, on the log examples/gitops/record_traffic.py
writes through a real gate. A trailing ``# exit N`` in the docs is the exit code the line must
end with (0 otherwise). The CI jobs shown as text run examples/gitops/review.sh, which this
runs too: a loosening change fails with one approval and passes with two."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "gitops.md"
EXIT = re.compile(r"#\s*exit (\d+)\s*$")


def section(title: str) -> str:
    text = DOC.read_text()
    start = text.index(f"## {title}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end != -1 else None]


def commands() -> list[tuple[str, int]]:
    block = re.search(r"```bash\n(.*?)```", section("Try it on your machine"), re.S)
    assert block, "docs/gitops.md lost its commands"
    out = []
    for line in block.group(1).splitlines():
        if not line.strip():
            continue
        m = EXIT.search(line)
        out.append((line, int(m.group(1)) if m else 0))
    return out


def test_the_documented_commands_run_as_written_with_the_exit_codes_they_state(tmp_path: Path) -> None:
    (tmp_path / "examples").symlink_to(REPO / "examples")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("AGENT_SAGA_WAL_KEY", None)
    ran = []
    for line, expected in commands():
        r = subprocess.run(["bash", "-c", line], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == expected, f"{line}\nexit {r.returncode}, expected {expected}\n{r.stdout}\n{r.stderr}"
        ran.append((line, r.stdout))
    assert any("review.sh" in line and "needs a second approval (1 so far)" in out for line, out in ran)
    review = (tmp_path / "review.markdown").read_text()
    assert "SagaPolicy diff: LOOSER" in review and "SagaPolicy replay: LOOSER" in review
    assert "| `wire.send` | 54 |" in review


def test_both_ci_jobs_run_the_review_script_the_docs_run() -> None:
    ci = section("In CI")
    assert ci.count("bash examples/gitops/review.sh old.yaml policies/payments.yaml audit payments-agent") == 2
    script = (REPO / "examples" / "gitops" / "review.sh").read_text()
    for command in ("agent-saga policy check", "agent-saga verify-bundle", "agent-saga policy diff",
                    "agent-saga policy replay"):
        assert command in script
