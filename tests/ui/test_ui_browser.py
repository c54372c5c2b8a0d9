"""The debugger in a real browser: Playwright driving the system's chromium.

One log written by the engine for real (``ui_logs.build_log``: a crash recovered by the
daemon, a rollback, an approval, a halt, a quarantine, hostile tool names, a redaction)
served by one ``agent-saga ui`` process; a tampered copy served by a second one with a
token. One browser for the module. Every assertion reads the DOM the page built.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import playwright.sync_api as playwright_sync  # the dev extra
import pytest
import ui_logs
from agent_saga.audit.merkle import audit_root, verify_disclosure
from agent_saga.idempotency import COMPENSATION_SCOPE, idempotency_key
from agent_saga.wal.file import read_log

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SHOTS = os.environ.get("AGENT_SAGA_UI_SCREENSHOTS")  # a directory: write the docs' screenshots there
TOKEN = "ui-test-token-4f1c"


def _spawn(wal: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "agent_saga.ui", "--wal-path", str(wal), "--port", "0", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _address(proc: subprocess.Popen[str]) -> str:
    line = proc.stdout.readline()  # type: ignore[union-attr]  # printed once it listens
    assert " at http://" in line, (line, proc.stderr.read() if proc.poll() is not None else "")  # type: ignore[union-attr]
    return line.split(" at ", 1)[1].split()[0]


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(timeout=30)
    for stream in (proc.stdout, proc.stderr):
        stream.close()  # type: ignore[union-attr]


@pytest.fixture(scope="module")
def building(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.Popen[str], Path]:
    """The engine writing the logs in another process, while the browser starts."""
    tmp = tmp_path_factory.mktemp("ui")
    return ui_logs.start_build(tmp), tmp


@pytest.fixture(scope="module")
def logs(building: tuple[subprocess.Popen[str], Path]) -> dict[str, Any]:
    proc, tmp = building
    wal = ui_logs.finish_build(proc, tmp)
    line = ui_logs.tamper(wal, tmp / "tampered.wal", "checkout-rollback")
    (tmp / "token").write_text(TOKEN + "\n")
    return {"wal": wal, "tampered": tmp / "tampered.wal", "tampered_line": line, "token_file": tmp / "token",
            "records": [r for _, r in read_log(wal)]}


@pytest.fixture(scope="module")
def servers(logs: dict[str, Any]) -> Iterator[dict[str, str]]:
    main = _spawn(logs["wal"])  # both start at once: each pays an interpreter start
    locked = _spawn(logs["tampered"], "--token-file", str(logs["token_file"]))
    try:
        yield {"url": _address(main), "locked": _address(locked)}
    finally:
        _stop(locked)
        _stop(main)


@pytest.fixture(scope="module")
def browser(building: Any) -> Iterator[Any]:
    if CHROMIUM is None:  # a missing part fails, saying how to get it; nothing is skipped
        pytest.fail("missing part: chromium is not installed (`make system-deps` installs it)", pytrace=False)
    with playwright_sync.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def page(browser: Any, servers: dict[str, str]) -> Iterator[Any]:
    p = browser.new_page(viewport={"width": 1280, "height": 720}, accept_downloads=True)
    p.goto(servers["url"])
    p.wait_for_selector("body[data-ready=true]")
    yield p
    p.close()


def _open(page: Any, saga: str, asof: str = "") -> None:
    page.click(f"#runs li[data-saga='{saga}']")
    page.wait_for_function("k => document.querySelector('#timeline').dataset.shown === k", arg=f"{saga}|{asof}")


def _show_events(page: Any) -> None:
    """The kill switch, breaker and WAL events view, once it has replaced the saga shown
    (whose record lines are already on the page)."""
    page.click("#show-events")
    page.wait_for_function("() => document.querySelector('#timeline').dataset.shown === 'events'")


def _shot(page: Any, name: str) -> None:
    if SHOTS:
        page.screenshot(path=str(Path(SHOTS) / f"ui-{name}.png"))


def _statuses(page: Any) -> dict[str, str]:
    return page.eval_on_selector_all(
        "#runs li", "els => Object.fromEntries(els.map(e => [e.dataset.saga, e.querySelector('.badge').textContent]))")


def _search(page: Any, text: str, status: str = "", asof: str = "") -> list[str]:
    page.select_option("#status-filter", status)
    page.fill("#search", text)
    page.wait_for_function("k => document.querySelector('#runs').dataset.query === k", arg=f"{status}|{text}|0|{asof}")
    return list(_statuses(page))


def test_the_sidebar_lists_every_run_with_its_status_and_the_chain_verified(page: Any) -> None:
    assert _statuses(page) == {
        "crashed-order": "ROLLBACK_PARTIAL", "checkout-rollback": "ROLLED_BACK", "wire-approved": "COMPLETED",
        "wire-halted": "ROLLED_BACK", "frozen-saga": "QUARANTINED", "xss-saga": "COMPLETED",
        "erased-saga": "COMPLETED",
    }
    assert page.text_content("#chain").startswith("chain verified")
    _shot(page, "runs")


def test_the_sidebar_filters_by_status_and_searches_ids_tools_and_tags(page: Any) -> None:
    try:
        assert _search(page, "", "ROLLED_BACK") == ["checkout-rollback", "wire-halted"]
        assert _search(page, "wire", "") == ["wire-approved", "wire-halted"]
        assert _search(page, "bank.transfer") == ["crashed-order"]  # a tool
        assert _search(page, "checkout") == ["checkout-rollback"]  # its tag (and id)
        assert _search(page, "no-such-thing") == []
    finally:
        _search(page, "", "")


def test_a_rollback_shows_the_undo_last_in_first_out_with_its_idempotency_key(page: Any) -> None:
    _open(page, "checkout-rollback")
    outcomes = page.eval_on_selector_all("#timeline .step[data-step]", "els => els.map(e => e.dataset.outcome)")
    assert outcomes == ["compensated", "compensated", "failed"]
    undo = page.eval_on_selector_all("#timeline .step[data-undo]", "els => els.map(e => e.dataset.undo)")
    assert undo == ["checkout-rollback/1", "checkout-rollback/1", "checkout-rollback/0", "checkout-rollback/0"]
    page.click("#timeline .step[data-step='checkout-rollback/0']")
    inspector = page.text_content("#inspector")
    assert "stripe.charge" in inspector and "COMPENSABLE" in inspector and '"amount": 4200' in inspector
    assert "ui.refund" in inspector and '"charge_id": "ch_a"' in inspector  # the exact compensation
    assert idempotency_key("checkout-rollback", "checkout-rollback/0", COMPENSATION_SCOPE) in inspector
    assert "COMPENSATION_DONE" in inspector
    assert ui_logs.CREDENTIAL_REF in inspector  # a credential is shown as the reference the log holds
    page.click("#timeline .step[data-step='checkout-rollback/2']")
    assert "the carrier is down" in page.text_content("#inspector")
    assert ui_logs.LEAKED not in page.content(), "a secret in an error never reaches the log, so never the page"
    page.click("#timeline .step[data-step='checkout-rollback/0']")
    _shot(page, "rollback")


def test_a_crash_recovered_by_the_daemon_shows_what_it_undid_and_what_it_escalated(page: Any) -> None:
    _open(page, "crashed-order")
    steps = page.eval_on_selector_all("#timeline .step[data-step]",
                                      "els => els.map(e => [e.dataset.step, e.dataset.outcome])")
    assert steps == [["crashed-order/0", "compensated"], ["crashed-order/1", "compensated"],
                     ["crashed-order/2", "escalated"]]
    records = page.text_content("#timeline")
    assert "RECOVERY_STARTED" in records and "SAGA_ROLLBACK_PARTIAL" in records
    page.click("#timeline .step[data-step='crashed-order/2']")
    assert "may have happened" in page.text_content("#inspector")


def test_an_approval_shows_the_gate_verdict_and_who_approved(page: Any) -> None:
    _open(page, "wire-approved")
    page.click("#timeline .step[data-step='wire-approved/0']")
    inspector = page.text_content("#inspector")
    assert "REQUIRE_APPROVAL" in inspector and "rule:irreversible" in inspector
    assert "APPROVAL_DECIDED" in inspector and "risk@corp" in inspector and "verified by phone" in inspector
    _shot(page, "approval")


def test_a_halt_shows_the_kill_switch_refusal_and_the_engaged_lever(page: Any) -> None:
    _open(page, "wire-halted")
    assert page.get_attribute("#timeline .step[data-step='wire-halted/0']", "data-outcome") == "failed"
    page.click("#timeline .step[data-step='wire-halted/0']")
    inspector = page.text_content("#inspector")
    assert "REFUSED" in inspector and "kill_switch" in inspector and "fraud pattern" in inspector
    _show_events(page)
    events = page.text_content("#timeline")
    assert "KILL_SWITCH_ENGAGED" in events and "REDACTION" in events
    page.click("#timeline .rec >> text=KILL_SWITCH_ENGAGED")
    assert "soc@corp" in page.text_content("#inspector")


def test_a_slow_answer_for_an_older_view_never_replaces_the_saga_asked_for_since(page: Any) -> None:
    held: list[Any] = []
    page.route("**/api/events*", lambda route: held.append(route))  # its answer is held back
    try:
        with page.expect_request("**/api/events*"):
            page.click("#show-events")
        _open(page, "wire-approved")  # asked for after the events view, answered first
        assert len(held) == 1
        with page.expect_response("**/api/events*") as late:
            held[0].continue_()
        late.value.finished()
        page.evaluate("() => new Promise((done) => setTimeout(done, 50))")  # the page handles it
        assert page.get_attribute("#timeline", "data-shown") == "wire-approved|"
        assert page.locator("#timeline .step[data-step='wire-approved/0']").count() == 1
    finally:
        page.unroute("**/api/events*")


def test_a_quarantined_saga_is_frozen_not_rolled_back(page: Any) -> None:
    _open(page, "frozen-saga")
    assert page.text_content("#saga-status") == "QUARANTINED"
    assert page.get_attribute("#timeline .step[data-step='frozen-saga/0']", "data-outcome") == "quarantined"
    assert page.eval_on_selector_all("#timeline .step[data-undo]", "els => els.length") == 0


def test_a_redacted_saga_shows_its_records_as_redacted_and_nothing_of_them(page: Any) -> None:
    _open(page, "erased-saga")
    lines = page.eval_on_selector_all("#timeline .rec", "els => els.map(e => e.textContent)")
    assert lines and all("[redacted]" in t for t in lines), lines
    page.click("#timeline .rec >> nth=1")
    assert "redacted: the payload was erased" in page.text_content("#inspector")
    assert "ann@example.com" not in page.content()


def test_tool_names_kwargs_and_tags_carrying_html_render_inert(page: Any) -> None:
    _open(page, "xss-saga")
    page.click("#timeline .step[data-step='xss-saga/0']")
    assert page.text_content("#timeline .step[data-step='xss-saga/0'] b") == ui_logs.XSS_TOOL
    assert ui_logs.XSS_ARG in page.text_content("#inspector")
    assert ui_logs.XSS_TAG in page.text_content("#timeline")
    _search(page, "xss")
    assert ui_logs.XSS_TOOL in page.text_content("#runs")
    _search(page, "")
    assert page.evaluate("window.__xss") is None
    assert page.eval_on_selector_all("main img, main script, main b[onmouseover]", "els => els.length") == 0


def test_time_travel_shows_every_saga_as_of_a_record(page: Any, logs: dict[str, Any]) -> None:
    records = logs["records"]
    # The cut just after checkout-rollback's second charge committed: nothing undone yet.
    cut = next(i for i, r in enumerate(records)
               if r.saga == "checkout-rollback" and r.type == "STEP_COMMITTED" and r.step == "checkout-rollback/1")
    _open(page, "checkout-rollback")
    page.eval_on_selector("#asof", "(e, v) => { e.value = v; e.dispatchEvent(new Event('change')); }", cut)
    page.wait_for_function("k => document.querySelector('#runs').dataset.query === k", arg=f"||0|{cut}")
    try:
        assert _statuses(page) == {"crashed-order": "ROLLBACK_PARTIAL", "checkout-rollback": "IN_FLIGHT"}
        page.wait_for_function("k => document.querySelector('#timeline').dataset.shown === k",
                               arg=f"checkout-rollback|{cut}")
        assert page.text_content("#saga-status") == "IN_FLIGHT"
        assert page.text_content("#inspector") == "Choose a step or a record.", "no step of another time or saga"
        outcomes = page.eval_on_selector_all("#timeline .step[data-step]", "els => els.map(e => e.dataset.outcome)")
        assert outcomes == ["committed", "committed"]
        assert "nothing was undone" in page.text_content("#timeline")
        _shot(page, "time-travel")
    finally:
        page.click("#asof-latest")
        page.wait_for_function("k => document.querySelector('#runs').dataset.query === k", arg="||0|")


def test_a_disclosure_proof_downloads_and_verifies_against_the_logs_root(page: Any, logs: dict[str, Any]) -> None:
    _open(page, "wire-approved")
    with page.expect_download() as info:
        page.click("#proof")
    proof = json.loads(Path(info.value.path()).read_text())
    assert proof["saga"] == "wire-approved"
    assert {e["record"]["saga"] for e in proof["records"]} == {"wire-approved"}
    assert verify_disclosure(proof, audit_root(logs["records"])).ok


def test_a_tampered_log_highlights_its_first_broken_record(browser: Any, servers: dict[str, str],
                                                         logs: dict[str, Any]) -> None:
    p = browser.new_page(viewport={"width": 1280, "height": 720})
    try:
        p.goto(servers["locked"] + "#token=" + TOKEN)
        p.wait_for_selector("body[data-ready=true]")
        assert p.text_content("#chain").startswith("chain BROKEN at")
        assert f"line {logs['tampered_line']}" in p.text_content("#chain")
        row = p.locator("#runs li[data-saga='checkout-rollback']")
        assert "tampered" in row.text_content()
        p.click("#show-break")
        p.wait_for_function("() => document.querySelector('#timeline').dataset.shown === 'break'")
        assert p.get_attribute("#timeline .rec.broken", "data-position") == str(logs["tampered_line"] - 1)
        assert p.eval_on_selector_all("#timeline .rec.broken", "els => els.length") == 1
        assert "payload does not match its digest" in p.text_content("#break-reason")
        _shot(p, "tampered")
        _open(p, "checkout-rollback")
        p.click("#proof")
        p.wait_for_selector("#proof-error")
        assert "intact" in p.text_content("#proof-error")  # no proof of a broken chain
    finally:
        p.close()


def test_with_a_token_the_api_answers_401_without_it_and_the_page_says_so(browser: Any, servers: dict[str, str]) -> None:
    base = servers["locked"]
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": TOKEN}):
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(urllib.request.Request(base + "api/sagas", headers=headers), timeout=10)
        assert err.value.code == 401 and err.value.headers["WWW-Authenticate"].startswith("Bearer")
        err.value.close()
    ok = urllib.request.urlopen(urllib.request.Request(base + "api/status", headers={"Authorization": f"Bearer {TOKEN}"}),
                                timeout=10)
    with ok:
        assert ok.status == 200 and json.load(ok)["indexed"] is True
    p = browser.new_page()
    try:
        p.goto(base)
        p.wait_for_selector("#error")
        assert "bearer token" in p.text_content("#error")
        assert p.eval_on_selector_all("#runs li", "els => els.length") == 0
    finally:
        p.close()
