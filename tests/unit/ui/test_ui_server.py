"""The debugger's server and index without a browser: binding rules, read-only, the Host
check, headers, bad input, damaged logs, time travel. Real FileWAL logs, a real server on
a free loopback port (one per module)."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga.cli import main
from agent_saga.errors import ConfigurationError
from agent_saga.ui import LogIndex, check_bind, start
from agent_saga.ui.index import QUARANTINED
from agent_saga.ui.views import list_sagas, saga_detail
from agent_saga.wal.file import FileWAL
from agent_saga.wal.readers import FileLogReader


def _write(path: Path) -> None:
    wal = FileWAL(path, sync=False)
    for s in ("s-1", "s-2"):
        wal.append("SAGA_STARTED", s, None, {"name": None, "tags": ["t"]})
        wal.append("STEP_INTENT", s, f"{s}/0", {"tool": "pay.charge", "semantics": "COMPENSABLE",
                                               "policy_args": {"amount": 1}})
        wal.append("STEP_COMMITTED", s, f"{s}/0", {"compensation": {"handler": "pay.refund", "kwargs": {}}})
    wal.append("SAGA_COMPLETED", "s-1", None, {"steps": 1})
    wal.append("SAGA_QUARANTINED", "s-2", None, {"by": "soc@corp", "reason": "r"})
    wal.append("SAGA_QUARANTINE_LIFTED", "s-2", None, {"by": "soc@corp"})
    wal.barrier_sync()
    wal.close()


def _index(path: Path) -> LogIndex:
    index = LogIndex(FileLogReader(str(path)))
    index.build()
    return index


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("ui-unit") / "a.wal"
    _write(path)
    return path


@pytest.fixture(scope="module")
def server(log: Path) -> Iterator[Any]:
    srv = start(LogIndex(FileLogReader(str(log))), "127.0.0.1", 0)
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)


def _request(srv: Any, method: str, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", srv.server_address[1], timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        res = conn.getresponse()
        return res.status, dict(res.getheaders()), res.read()
    finally:
        conn.close()


def test_a_non_loopback_bind_without_a_token_is_refused_naming_the_flag() -> None:
    for host in ("0.0.0.0", "10.0.0.7", "::"):
        with pytest.raises(ConfigurationError, match="--token"):
            check_bind(host, None)
    check_bind("0.0.0.0", "t0ken")
    for host in ("127.0.0.1", "::1", "localhost"):
        check_bind(host, None)


def test_the_command_refuses_a_public_bind_without_a_token_and_an_empty_token_file(
        log: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ui", "--wal-path", str(log), "--host", "0.0.0.0", "--port", "0"]) == 2
    assert "--token" in capsys.readouterr().err
    empty = tmp_path / "token"
    empty.write_text("\n")
    assert main(["ui", "--wal-path", str(log), "--token-file", str(empty), "--port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--token-file" in err and "is empty" in err


def test_the_server_is_read_only_and_every_response_carries_the_csp(server: Any) -> None:
    for method in ("POST", "PUT", "DELETE", "PATCH"):
        status, headers, _ = _request(server, method, "/api/sagas")
        assert status == 405 and headers["Allow"] == "GET, HEAD"
    for path in ("/", "/app.js", "/api/status", "/nope"):
        _, headers, _ = _request(server, "GET", path)
        assert "script-src 'self'" in headers["Content-Security-Policy"] and "unsafe-inline" not in headers[
            "Content-Security-Policy"]
        assert headers["X-Content-Type-Options"] == "nosniff"
    status, headers, body = _request(server, "HEAD", "/api/status")
    assert status == 200 and body == b"" and int(headers["Content-Length"]) > 0


def test_without_a_token_only_loopback_host_names_are_answered(server: Any) -> None:
    status, _, body = _request(server, "GET", "/api/status", {"Host": "attacker.example:80"})
    assert status == 403 and b"loopback" in body
    for host in ("localhost:1", "127.0.0.1:1", "[::1]:1"):
        assert _request(server, "GET", "/api/status", {"Host": host})[0] == 200


def test_bad_input_is_answered_400_naming_the_parameter(server: Any) -> None:
    status, _, body = _request(server, "GET", "/api/sagas?asof=yesterday")
    assert status == 400 and "?asof=" in json.loads(body)["error"]
    status, _, body = _request(server, "GET", "/api/saga?id=no-such")
    assert status == 400 and "'no-such' is not in this log" in json.loads(body)["error"]


def test_time_travel_statuses_come_from_the_index_without_rereading(log: Path) -> None:
    index = _index(log)
    s1, s2 = index.sagas["s-1"], index.sagas["s-2"]
    assert s1.status(None) == "COMPLETED" and s2.status(None) == "IN_FLIGHT"  # quarantine lifted
    assert s2.status(0) is None, "s-2 had not started at the first record"
    quarantined_at = s2.change_positions()[0]
    assert s2.status(quarantined_at) == QUARANTINED and s2.status(quarantined_at - 1) == "IN_FLIGHT"
    assert [r["saga_id"] for r in list_sagas(index, asof=2)["sagas"]] == ["s-1"]
    assert list_sagas(index, status=QUARANTINED, asof=quarantined_at)["total"] == 1
    detail = saga_detail(index, s1, 1, None)
    assert [s["state"] for s in detail["steps"]] == ["INTENT"] and detail["steps"][0]["outcome"] == "orphaned"


def test_an_undecodable_line_is_the_first_broken_record(log: Path, tmp_path: Path) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    bad = tmp_path / "bad.wal"
    bad.write_bytes(b"".join(lines[:3] + [b"{not json\n"] + lines[4:]))
    index = _index(bad)
    assert index.damage is not None and index.damage.position == 3 and index.damage.saga is None
    assert index.to_status()["verified"] is False and f"{bad} line 4" == index.damage.location
    assert index.count == len(lines), "records after the damage are still indexed (marked unverified)"


def test_a_deleted_record_is_found_at_the_gap(log: Path, tmp_path: Path) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    cut = tmp_path / "cut.wal"
    cut.write_bytes(b"".join(lines[:2] + lines[3:]))
    index = _index(cut)
    assert index.damage is not None and index.damage.position == 2, index.damage
    assert "missing" in index.damage.reason


def test_an_approval_record_is_shown_escaped(tmp_path: Path) -> None:
    """What an approver was asked reaches the page without control, bidi or zero-width
    characters (a model-chosen argument cannot reorder or hide what the auditor reads)."""
    path = tmp_path / "a.wal"
    wal = FileWAL(path, sync=False)
    wal.append("SAGA_STARTED", "s-1", None, {"name": None, "tags": []})
    wal.append("STEP_INTENT", "s-1", "s-1/0", {"tool": "wire.send", "semantics": "IRREVERSIBLE",
                                                "policy_args": {"amount": 80000}})
    wal.append("APPROVAL_DECIDED", "s-1", "s-1/0", {"decision": "Approved", "approver": "risk@corp",
                                                    "policy_args": {"to": "acct_\u202e9\u200b\x1b[2K"}})
    wal.barrier_sync()
    wal.close()
    index = _index(path)
    detail = saga_detail(index, index.sagas["s-1"], None, None)
    (approval,) = detail["steps"][0]["approvals"]
    assert approval["policy_args"] == {"to": "acct_<U+202E>9<U+200B>\\x1b[2K"}
    assert approval["approver"] == "risk@corp"
