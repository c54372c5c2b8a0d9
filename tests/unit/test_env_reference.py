"""docs/env.md lists every AGENT_SAGA_* variable the code reads, and only those.

The code is searched as shipped (the runtime, the operator, recoveryd, the chart's
templates, hack/ and the test fixtures a developer sets variables for); recoveryd builds
its names from a prefix (``AGENT_SAGA_RECOVERYD_`` + the flag), so those are read from its
``_env("NAME")`` calls.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "env.md"
SOURCES = ("runtime", "operator", "recoveryd", "charts/agent-saga/templates", "hack", "tests/fixtures",
           "Makefile", "Dockerfile")
NAME = re.compile(r"\bAGENT_SAGA_[A-Z0-9_]*[A-Z0-9]\b")
RECOVERYD_ENV = re.compile(r'_env\("([A-Z0-9_]+)"')


def _files() -> list[Path]:
    out: list[Path] = []
    for rel in SOURCES:
        path = ROOT / rel
        out += [path] if path.is_file() else [p for p in sorted(path.rglob("*"))
                                             if p.is_file() and p.suffix in {".py", ".sh", ".tpl", ".yaml", ".txt", ""}
                                             and "__pycache__" not in p.parts]
    return out


def read_by_code() -> set[str]:
    names: set[str] = set()
    for path in _files():
        text = path.read_text(errors="replace")
        names |= set(NAME.findall(text))
    config = (ROOT / "recoveryd" / "agent_saga_recoveryd" / "config.py").read_text()
    names |= {f"AGENT_SAGA_RECOVERYD_{n}" for n in RECOVERYD_ENV.findall(config)}
    return names


def documented() -> set[str]:
    return set(re.findall(r"`(AGENT_SAGA_[A-Z0-9_]*[A-Z0-9])`", PAGE.read_text()))


def test_every_variable_the_code_reads_is_documented() -> None:
    code = read_by_code()
    assert len(code) >= 40, sorted(code)  # the search itself works
    missing = sorted(code - documented())
    assert missing == [], f"add these to docs/env.md: {missing}"


def test_every_documented_variable_exists() -> None:
    stale = sorted(documented() - read_by_code())
    assert stale == [], f"docs/env.md lists variables nothing reads: {stale}"
