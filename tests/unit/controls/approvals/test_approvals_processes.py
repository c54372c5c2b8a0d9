"""Approvals across real processes: an agent process waits; the CLI in another process
approves; the agent proceeds. An agent SIGKILLed while waiting is restarted, finds its
request and is not asked twice (the webhook is hit once)."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga.wal.file import iter_file_records
from fixtures.cli import cli_module as cli
from fixtures.polling import until

AGENT = r"""
import asyncio, sys
from agent_saga.wal.file import FileWAL
from agent_saga.controls import (ApprovalGateway, ApprovalPolicy, EscalationLevel, PreFlightGate,
                                 WebhookNotifier, open_approval_store)
from agent_saga.scope import saga_scope

wal_path, store, hook, saga_id, out = sys.argv[1:6]

async def main():
    wal = FileWAL(wal_path)
    gw = ApprovalGateway(open_approval_store(store), WebhookNotifier(hook), wal,
                         ApprovalPolicy(timeout=120, levels=(EscalationLevel(("@oncall",)),)), poll=0.05)
    def send():
        with open(out, "a") as f:
            f.write("sent\n")
    async with saga_scope(wal, PreFlightGate(approval_provider=gw), saga_id=saga_id) as saga:
        await saga.execute("wire.send", "IRREVERSIBLE", send, policy_args={"amount": 80000, "to": "acct_9"})
    wal.close()

asyncio.run(main())
"""


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict]]]:
    got: list[dict] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/hook", got
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def pending(store: str) -> list[dict]:
    out = cli("approvals", "list", "--json", "--store", store)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def wal_types(path: Path) -> list[str]:
    if not path.exists():
        return []
    return [getattr(item, "type", "?") for _, item in iter_file_records(path)]


def start(tmp_path: Path, store: str, hook: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", AGENT, str(tmp_path / "agent.wal"), store, hook, "saga-wire-1", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def approve_and_finish(agent: subprocess.Popen[str], rid: str, store: str) -> None:
    done = cli("approvals", "approve", rid[:10], "--approver", "risk@corp", "--note", "verified by phone",
               "--store", store)
    assert done.returncode == 0, done.stderr
    _, err = agent.communicate(timeout=60)
    assert agent.returncode == 0, err[-2000:]


def test_an_approval_requested_in_one_process_is_given_from_another(tmp_path: Path, webhook):
    hook, got = webhook
    store = str(tmp_path / "approvals")
    agent = start(tmp_path, store, hook)
    try:
        (req,) = until("the request", lambda: pending(store), proc=agent)
        assert req["tool"] == "wire.send" and req["display"] == {"amount": "80000", "to": "acct_9"}
        assert not (tmp_path / "out").exists(), "nothing happens before a human says yes"
        approve_and_finish(agent, req["requestId"], store)
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.communicate()
    assert (tmp_path / "out").read_text() == "sent\n"
    assert len(got) == 1 and got[0]["agent_saga"]["request"]["requestId"] == req["requestId"]
    types = wal_types(tmp_path / "agent.wal")
    assert types.count("APPROVAL_REQUESTED") == 1 and types.count("APPROVAL_DECIDED") == 1
    assert types[-1] == "SAGA_COMPLETED"


def test_a_crash_while_waiting_does_not_ask_twice(tmp_path: Path, webhook):
    hook, got = webhook
    store = str(tmp_path / "approvals")
    first = start(tmp_path, store, hook)
    try:
        (req,) = until("the request", lambda: pending(store), proc=first)
        until("the notification", lambda: got, proc=first)
        os.kill(first.pid, signal.SIGKILL)  # no finally, no atexit: a crash
        first.communicate(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    assert first.returncode == -signal.SIGKILL

    restarted = start(tmp_path, store, hook)
    try:
        until("the restarted agent to find its request", lambda: "APPROVAL_RESUMED" in wal_types(tmp_path / "agent.wal"), proc=restarted)
        assert [r["requestId"] for r in pending(store)] == [req["requestId"]], "still one request"
        approve_and_finish(restarted, req["requestId"], store)
    finally:
        if restarted.poll() is None:
            restarted.kill()
            restarted.communicate()
    assert len(got) == 1, "the human was asked once"
    assert (tmp_path / "out").read_text() == "sent\n"
    types = wal_types(tmp_path / "agent.wal")
    assert types.count("APPROVAL_REQUESTED") == 1 and types.count("APPROVAL_DECIDED") == 1
