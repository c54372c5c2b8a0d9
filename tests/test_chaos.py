"""The crash suite's entry point: ``python -m pytest tests/test_chaos.py -v``.

The suite itself lives in tests/chaos/ (real worker processes killed with SIGKILL /
os._exit at every crash point, then recovered; docs/recovery.md, "Crash testing").
Named on the command line, this file collects that directory (tests/conftest.py,
``pytest_collect_file``); collected with the rest of the tests (``make test``), it holds
only the check below, so the crash suite runs once.
"""

from __future__ import annotations

from pathlib import Path

CHAOS = Path(__file__).resolve().parent / "chaos"


def test_the_crash_suite_is_where_this_entry_point_collects_it() -> None:
    modules = sorted(p.name for p in CHAOS.glob("test_*.py"))
    assert "test_chaos_crash_points.py" in modules and "test_chaos_race.py" in modules, modules
