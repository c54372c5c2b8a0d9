"""saga_lifespan under a real uvicorn process, driven by real HTTP requests.

One server for the routes (default WAL, rollback, refusal in-band, the background recovery
daemon finishing a saga an earlier run left open, health); one process per SIGTERM case,
since SIGTERM ends it:

- default graceful shutdown: the request in flight finishes, its saga COMPLETES, the
  client gets its response, the log is closed after it;
- ``--timeout-graceful-shutdown``: uvicorn cancels the request still running, its saga
  rolls back LIFO (the interrupted step is STEP_UNKNOWN and compensated), and the lifespan
  waits for that rollback before closing the log.

Each outcome is read from the WAL the process wrote. The listening socket is bound here and
handed to uvicorn (``--fd``): no port race.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga.history import fold
from agent_saga.wal.file import FileWAL
from fixtures.polling import until
from fixtures.wal import records as wal_records

APP_DIR = Path(__file__).parent / "fastapi_app"


class Shop:
    """One uvicorn process serving fastapi_app/shop_app.py."""

    def __init__(self, tmp: Path, *uvicorn_args: str) -> None:
        self.dir = tmp
        self.wal = tmp / "shop.wal"
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.log = tmp / "uvicorn.log"
        env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
        env.update(SHOP_WAL=str(self.wal), SHOP_DIR=str(tmp))
        self._log_file = open(self.log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "shop_app:app", "--app-dir", str(APP_DIR),
             "--fd", str(self.sock.fileno()), "--log-level", "info", *uvicorn_args],
            env=env, stdout=self._log_file, stderr=subprocess.STDOUT, pass_fds=(self.sock.fileno(),),
        )
        until("uvicorn to finish its startup", lambda: "Application startup complete" in self.output(),
              proc=self.proc, timeout=60)

    def output(self) -> str:
        return self.log.read_text()

    def request(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = err.read()
            if err.headers.get_content_type() == "application/json":
                return err.code, json.loads(body)
            return err.code, {"text": body.decode()}

    def records(self, saga_id: str | None = None) -> list[Any]:
        return wal_records(self.wal, saga=saga_id, damaged="skip")

    def terminated(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.sock.close()
        self._log_file.close()


def released(tmp: Path) -> list[str]:
    path = tmp / "released"
    return path.read_text().split() if path.exists() else []


def write_orphan(path: Path, saga_id: str, order: str) -> None:
    """What a process killed mid-saga leaves: a committed step, no terminal record, a
    lease that has run out (its flock is released when the WAL closes)."""
    wal = FileWAL(path)
    try:
        wal.append("SAGA_STARTED", saga_id, None, {"name": "order", "tags": []})
        wal.append("SAGA_LEASE", saga_id, None, {"lease_seconds": 0.05})
        step = f"{saga_id}/0"
        wal.append("STEP_INTENT", saga_id, step, {"tool": "shop.reserve", "semantics": "COMPENSABLE", "policy_args": None})
        wal.append("STEP_COMMITTED", saga_id, step, {"compensation": {
            "handler": "shop.release", "kwargs": {"order": order}, "description": ""}})
        wal.barrier_sync()
    finally:
        wal.close()


@pytest.fixture(scope="module")
def shop(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Shop]:
    tmp = tmp_path_factory.mktemp("shop")
    write_orphan(tmp / "shop.wal", "order-crashed-earlier", "orphan")
    server = Shop(tmp)
    try:
        yield server
    finally:
        server.stop()


def test_a_route_saga_writes_the_default_wal(shop: Shop):
    code, body = shop.request("POST", "/orders/o-1")
    assert (code, body["status"]) == (200, "COMPLETED")
    assert [r.type for r in shop.records(body["saga_id"])] == [
        "SAGA_STARTED", "STEP_INTENT", "STEP_COMMITTED", "SAGA_COMPLETED"]


def test_a_failing_route_rolls_back(shop: Shop):
    code, body = shop.request("POST", "/orders/fail-1")
    assert (code, body) == (402, {"error": "card declined", "rolled_back": True})
    assert "fail-1" in released(shop.dir)
    rolled = [r for r in shop.records() if r.type == "SAGA_ROLLED_BACK"
              and any(s["step"].startswith(r.saga) for s in r.payload["steps"])]
    assert any(s["outcome"] == "COMPENSATED" for r in rolled for s in r.payload["steps"])


def test_a_refusal_reaches_the_client_in_band(shop: Shop):
    code, body = shop.request("POST", "/wire")
    assert code == 409
    assert body["by"] == "agent_saga.engine" and "IRREVERSIBLE" in body["refused"]


def test_the_background_daemon_rolls_back_a_saga_an_earlier_run_left_open(shop: Shop):
    until("the recovery daemon to compensate the orphan", lambda: "orphan" in released(shop.dir))
    states = until("the orphan's terminal record", lambda: (
        (s := fold(shop.records("order-crashed-earlier")).get("order-crashed-earlier")) is not None
        and s.status == "ROLLED_BACK" and s))
    assert states.status == "ROLLED_BACK"
    assert released(shop.dir).count("orphan") == 1
    code, body = shop.request("GET", "/health")
    assert code == 200 and body["healthy"] is True
    assert body["recovery"] == {"running": True, "halted": None, "crashed": None}


def _hold(server: Shop, order: str) -> dict[str, Any]:
    """Start /hold/<order> in a thread; return once its second step is running."""
    result: dict[str, Any] = {}

    def call() -> None:
        try:
            result["response"] = server.request("POST", f"/hold/{order}")
        except (urllib.error.URLError, ConnectionError, OSError) as exc:
            result["error"] = exc

    result["thread"] = threading.Thread(target=call, daemon=True)
    result["thread"].start()
    until(f"{order}'s saga to reach its waiting step", lambda: (server.dir / f"holding-{order}").exists(),
          proc=server.proc)
    return result


def test_sigterm_lets_the_request_in_flight_finish_its_saga(tmp_path: Path):
    server = Shop(tmp_path)
    try:
        held = _hold(server, "h1")
        server.proc.send_signal(signal.SIGTERM)
        until("uvicorn to begin its graceful shutdown", lambda: "Shutting down" in server.output(), proc=server.proc)
        (tmp_path / "go-h1").touch()  # the step in flight finishes after the SIGTERM
        held["thread"].join(timeout=60)
        code, body = held["response"]
        assert (code, body["status"]) == (200, "COMPLETED")
        # uvicorn re-raises the SIGTERM it caught once its graceful shutdown is done
        assert server.proc.wait(timeout=60) == -signal.SIGTERM
        assert "Application shutdown complete" in server.output()
        types = [r.type for r in server.records(body["saga_id"])]
        assert types[-1] == "SAGA_COMPLETED"
        assert "COMPENSATION_STARTED" not in types and released(tmp_path) == []
        assert "agent-saga: shut down" in server.output()
    finally:
        server.stop()


def test_sigterm_past_the_graceful_timeout_rolls_the_saga_back(tmp_path: Path):
    server = Shop(tmp_path, "--timeout-graceful-shutdown", "1")
    try:
        held = _hold(server, "h2")
        assert server.terminated() == -signal.SIGTERM  # after a complete graceful shutdown
        assert "Application shutdown complete" in server.output()
        held["thread"].join(timeout=60)
        # uvicorn answers a request it cancelled before it responded with a plain 500
        assert held["response"] == (500, {"text": "Internal Server Error"})
        out = server.output()
        assert "Cancel 1 running task(s), timeout graceful shutdown exceeded" in out
        sagas = {r.saga for r in server.records() if r.type == "SAGA_STARTED"}
        (saga_id,) = sagas
        types = [r.type for r in server.records(saga_id)]
        assert types[:5] == ["SAGA_STARTED", "STEP_INTENT", "STEP_COMMITTED", "STEP_INTENT", "STEP_UNKNOWN"]
        assert types[-1] == "SAGA_ROLLED_BACK"
        assert types.count("COMPENSATION_DONE") == 2
        assert released(tmp_path) == ["h2-wait", "h2"]  # LIFO, the interrupted step first
        assert fold(server.records())[saga_id].status == "ROLLED_BACK"
        assert "agent-saga: shut down" in out
    finally:
        server.stop()
