"""The alert rules and the dashboard, checked by Prometheus's own tool: ``promtool check
rules`` on every rules file (the chart's, the deploy/ copy, and every dashboard query as a
recording rule), ``promtool test rules`` on the unit tests (a firing and a quiet case for
every alert), one source for both rules files, and a runbook page for every alert.
Whether the metrics the queries use are exported: tests/e2e/test_metrics_exported.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fixtures.binaries import REPO_ROOT, require_promtool
from fixtures.monitoring import (
    DEPLOY_RULES,
    RULE_TESTS,
    RULES,
    RUNBOOKS,
    alerts,
    dashboard,
    names_in,
    panel_queries,
    runbook_of,
    strangers_in,
    write_query_rules,
)

#: The sections every runbook page has, in this order.
SECTIONS = ("## What it means", "## How to confirm", "## What to do", "## What never to do")


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(require_promtool()), *args], capture_output=True, text=True, timeout=120)


def test_the_deploy_rules_file_is_the_charts() -> None:
    p = subprocess.run([sys.executable, str(REPO_ROOT / "hack" / "monitoring.py"), "--check"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0, p.stderr


def test_promtool_checks_every_rules_file_and_every_panel_query(tmp_path: Path) -> None:
    queries = write_query_rules(tmp_path / "dashboard-queries.rules.yaml")
    p = promtool("check", "rules", "--lint=all", "--lint-fatal", str(RULES), str(DEPLOY_RULES), str(queries))
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.count("SUCCESS") == 3, p.stdout
    assert f"SUCCESS: {len(alerts())} rules found" in p.stdout


def test_promtool_check_refuses_a_query_that_does_not_parse(tmp_path: Path) -> None:
    """The check above would catch a broken panel: a query promtool cannot parse fails it."""
    bad = tmp_path / "bad.rules.yaml"
    bad.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [
        {"record": "x:y", "expr": "sum by (le (rate(agent_saga_wal_fence_seconds_bucket[5m]))"}]}]}))
    p = promtool("check", "rules", str(bad))
    assert p.returncode != 0 and "parse error" in p.stdout + p.stderr


def test_promtool_unit_tests_of_every_alert_pass() -> None:
    p = promtool("test", "rules", str(RULE_TESTS))
    assert p.returncode == 0, p.stdout + p.stderr
    assert "SUCCESS" in p.stdout


def test_every_alert_has_a_firing_and_a_quiet_case() -> None:
    cases = [c for t in yaml.safe_load(RULE_TESTS.read_text())["tests"] for c in t["alert_rule_test"]]
    for rule in alerts():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it fires"
        assert any(not c["exp_alerts"] for c in mine), f"{rule['alert']}: no case where it stays quiet"


def test_every_alert_has_a_severity_and_a_runbook_page_with_its_sections() -> None:
    pages = set()
    for rule in alerts():
        assert rule["labels"]["severity"] in ("critical", "warning"), rule["alert"]
        assert {"summary", "description", "runbook_url"} <= set(rule["annotations"]), rule["alert"]
        page = runbook_of(rule)
        assert page.is_file(), f"{rule['alert']}: {page} does not exist"
        text = page.read_text()
        assert text.startswith(f"# {rule['alert']}\n"), f"{page.name} is not titled {rule['alert']}"
        where = [text.find(s) for s in SECTIONS]
        assert -1 not in where and where == sorted(where), f"{page.name}: needs {SECTIONS} in this order"
        pages.add(page.name)
    assert len(pages) == len(alerts()), "one page per alert"
    index = (RUNBOOKS / "README.md").read_text()
    for name in pages:
        assert f"({name})" in index, f"docs/runbooks/README.md does not link {name}"


def test_queries_use_only_agent_saga_metrics() -> None:
    for where, expr in [(r["alert"], r["expr"]) for r in alerts()] + panel_queries():
        assert names_in(expr), f"{where}: uses no agent-saga metric"
        assert not strangers_in(expr), f"{where}: {strangers_in(expr)} is not a metric agent-saga exports"


@pytest.mark.parametrize("section", ["Halts", "Refusals", "BudgetLimit", "Approvals", "orphans", "fence",
                                     "Reconcile rate"])
def test_the_dashboard_shows(section: str) -> None:
    titles = [p["title"] for p in dashboard()["panels"]]
    assert any(section in t for t in titles), f"no panel about {section}: {titles}"
