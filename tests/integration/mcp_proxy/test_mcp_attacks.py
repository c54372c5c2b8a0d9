"""Attacks on the stdio proxy's framing, against a server that obeys whatever reaches it
(tests/fixtures/mcp_raw_server.py: it runs id-less tools/calls, batch elements, and reads
duplicate keys first-wins). Each test is one way a tools/call could slip past the gate, or
a message that could kill or hang the proxy; each checks the server's ledger (what ran)
and the WAL (what was recorded)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_support as ms
import pytest
from fixtures.polling import until

RAW_SERVER = ms.ROOT / "tests" / "fixtures" / "mcp_raw_server.py"
POLICY: dict[str, Any] = {"mode": "enforce", "tools": {
    "charge": {"semantics": "COMPENSABLE", "compensate": {"tool": "echo", "args": {"undo": "$.id"}}},
    **{t: {"semantics": "REVERSIBLE"} for t in ("deep", "echo", "noise", "held", "huge", "batched")}}}
INVALID_REQUEST = -32600
OUTCOME_UNKNOWN = -32002


class Raw:
    """The proxy in front of the raw server, driven one JSON-RPC line at a time."""

    def __init__(self, tmp: Path, *options: str, **env: str) -> None:
        self.tmp = tmp
        self.pending = b""
        self.wal = tmp / "proxy.wal"
        argv = ["-m", "agent_saga.cli", "mcp", "--policy", str(ms.write_policy(tmp / "p.json", POLICY)), "--wal",
                str(self.wal), "--name", "raw", *options, "--", sys.executable, str(RAW_SERVER)]
        with open(tmp / "proxy.log", "w") as log:
            self.proc = subprocess.Popen([sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=log, env=ms.proxy_env(tmp, **env), cwd=str(ms.ROOT))
        init = self.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                              "clientInfo": {"name": "attack", "version": "1"}})
        assert init["result"]["serverInfo"]["name"] == "raw"
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def send(self, line: str | bytes | dict[str, Any] | list[Any]) -> None:
        assert self.proc.stdin is not None
        data = line if isinstance(line, bytes) else (line if isinstance(line, str) else json.dumps(line)).encode()
        self.proc.stdin.write(data + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 30) -> Any:
        """The next line the proxy answered. Reads the pipe's descriptor itself: a buffered
        ``readline`` may take two lines off the pipe at once, and ``select`` then waits for
        the second, which already sits in the buffer."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            ready, _, _ = select.select([fd], [], [], timeout)
            assert ready, "no answer from the proxy"
            chunk = os.read(fd, 1 << 20)
            assert chunk, "the proxy closed its output"
            self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return json.loads(line)

    def request(self, id_: Any, method: str, params: dict[str, Any] | None = None) -> Any:
        self.send({"jsonrpc": "2.0", "id": id_, "method": method, **({"params": params} if params else {})})
        return self.read()

    def call(self, id_: Any, tool: str, **args: Any) -> Any:
        return self.request(id_, "tools/call", {"name": tool, "arguments": args})

    def ran(self, tool: str) -> list[dict[str, Any]]:
        return ms.calls(self.tmp, tool)

    def log(self) -> str:
        return (self.tmp / "proxy.log").read_text()

    def close(self) -> int:
        assert self.proc.stdin is not None
        if not self.proc.stdin.closed:
            self.proc.stdin.close()
        return self.proc.wait(timeout=60)

    def end(self) -> None:
        """Teardown: whatever the test left running is stopped."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=60)
        for f in (self.proc.stdin, self.proc.stdout):
            if f is not None and not f.closed:
                try:
                    f.close()
                except BrokenPipeError:
                    pass


@pytest.fixture
def proxies() -> Iterator[list[Raw]]:
    started: list[Raw] = []
    yield started
    for raw in started:
        raw.end()


def start(proxies: list[Raw], tmp: Path, *options: str, **env: str) -> Raw:
    raw = Raw(tmp, *options, **env)
    proxies.append(raw)
    return raw


def test_a_tools_call_without_an_id_is_refused_alone_or_in_a_batch_and_never_runs(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    raw.send({"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "charge", "arguments": {}}})
    alone = raw.read()
    assert alone["id"] is None and alone["error"]["code"] == INVALID_REQUEST
    assert "needs an \"id\"" in alone["error"]["message"]
    raw.send([{"jsonrpc": "2.0", "method": "tools/call", "params": {"name": "charge", "arguments": {}}},
              {"jsonrpc": "2.0", "id": 2, "method": "ping"}])
    batch = raw.read()
    assert [(m["id"], m["error"]["code"]) for m in batch] == [(2, INVALID_REQUEST)]
    raw.send([[{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "charge"}}]])  # nested batch
    assert raw.read()[0]["error"]["code"] == INVALID_REQUEST
    assert raw.call(4, "echo", said="after")["result"]["content"][0]["text"] == '{"said": "after"}'
    assert raw.ran("charge") == []  # none of them reached the server
    assert "refused a tools/call without an id" in raw.log()
    assert raw.close() == 0


def test_a_duplicate_key_anywhere_is_refused_never_read_two_ways(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    # The proxy's parser keeps the last "method" (ping), this server the first (tools/call).
    raw.send('{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": {"name": "charge", "arguments": {}}, '
             '"method": "ping"}')
    first = raw.read()
    assert first["id"] == 5 and first["error"]["code"] == INVALID_REQUEST and "'method'" in first["error"]["message"]
    raw.send('{"jsonrpc": "2.0", "id": 6, "method": "tools/call", "params": {"name": "echo", '
             '"arguments": {"to": "a", "to": "b"}}}')
    nested = raw.read()
    assert nested["id"] == 6 and nested["error"]["code"] == INVALID_REQUEST
    assert raw.ran("charge") == [] and raw.ran("echo") == []
    assert raw.close() == 0


def test_two_calls_in_flight_with_one_id_never_cross_and_each_outcome_is_logged(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    raw.send({"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "held", "arguments": {"n": 1}}})
    until("the held call reached the server", lambda: raw.ran("held"))
    second = raw.call(7, "charge")  # the same id while the first is in flight
    assert second["id"] == 7 and second["error"]["code"] == INVALID_REQUEST
    assert "still in flight" in second["error"]["message"]
    raw.send({"jsonrpc": "2.0", "id": 8, "method": "tools/call", "params": {"name": "echo", "arguments": {}}})
    answers = {m["id"]: m for m in (raw.read(), raw.read())}  # the server answers 8, then releases 7
    assert answers[7]["result"]["structuredContent"]["call"] == {"name": "held", "arguments": {"n": 1}}
    assert answers[8]["result"]["content"][0]["text"] == "{}"
    assert raw.ran("charge") == []  # the duplicate was never sent
    assert raw.close() == 0
    assert {"STEP_INTENT", "STEP_COMMITTED"} <= set(ms.step_types(raw.wal, "held"))
    assert ms.step_types(raw.wal, "charge") == []


def test_a_client_id_of_the_proxys_own_form_is_refused(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    answer = raw.request("agent-saga:1", "ping")
    assert answer["id"] == "agent-saga:1" and answer["error"]["code"] == INVALID_REQUEST
    # Inside a batch too: its answer would reach the proxy's own waiting request.
    raw.send([{"jsonrpc": "2.0", "id": "agent-saga:2", "method": "ping"}, {"jsonrpc": "2.0", "id": 3, "method": "ping"}])
    answers = raw.read()
    assert [(a["id"], a["error"]["code"]) for a in answers] == [("agent-saga:2", INVALID_REQUEST), (3, INVALID_REQUEST)]
    assert raw.close() == 0


def test_a_lone_surrogate_is_answered_and_never_forwarded(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    raw.send('{"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": {"name": "echo", '
             '"arguments": {"s": "\\ud800"}}}')
    answer = raw.read()
    assert answer["id"] == 9 and answer["error"]["code"] == INVALID_REQUEST and "surrogate" in answer["error"]["message"]
    ok = raw.call(10, "echo", s="\U0001f600")  # a surrogate pair is a character: it passes
    assert json.loads(ok["result"]["content"][0]["text"]) == {"s": "\U0001f600"}
    assert [e["args"] for e in raw.ran("echo")] == [{"s": "\U0001f600"}]
    assert raw.close() == 0


def test_a_result_nested_1000_deep_fails_its_call_and_the_session_goes_on(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    charge = raw.call(11, "charge")["result"]["structuredContent"]["id"]
    deep = raw.call(12, "deep", depth=1000)
    assert deep["id"] == 12 and deep["error"]["code"] == OUTCOME_UNKNOWN
    assert "nests deeper than" in deep["error"]["message"]
    assert raw.call(13, "echo", after="deep")["result"]["content"][0]["text"] == '{"after": "deep"}'
    deep_client = '{"jsonrpc": "2.0", "id": 14, "method": "ping", "params": ' + '[' * 1000 + ']' * 1000 + '}'
    raw.send(deep_client)
    assert raw.read() == {"jsonrpc": "2.0", "id": 14, "error": {"code": INVALID_REQUEST, "message": (
        "Invalid Request: the message nests deeper than 64 levels, which the agent-saga proxy refuses")}}
    assert raw.close() == 0  # a clean end: committed, the legitimate charge stands
    assert "STEP_UNKNOWN" in ms.step_types(raw.wal, "deep")
    assert [r["type"] for r in ms.records(raw.wal) if r["type"].startswith("SAGA_") and r["type"] != "SAGA_STARTED"
            ] == ["SAGA_COMPLETED"]
    assert [e["args"] for e in raw.ran("echo")] == [{"after": "deep"}]  # no compensation of {"undo": charge}
    assert charge


def test_a_proxy_that_received_a_deep_result_still_stops_on_sigterm(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    raw.call(15, "charge")
    raw.send({"jsonrpc": "2.0", "id": 16, "method": "tools/call", "params": {"name": "deep", "arguments": {}}})
    until("the deep result was sent", lambda: raw.ran("deep"))
    raw.proc.send_signal(signal.SIGTERM)
    until("the proxy exited after SIGTERM", lambda: raw.proc.poll() is not None, timeout=60)
    assert raw.proc.returncode == 1  # dropped: rolled back
    assert [e["args"] for e in raw.ran("echo")] == [{"undo": "ch_1"}]


def test_messages_over_the_size_limit_are_answered_from_both_sides(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path, "--max-message-bytes", "65536")
    raw.send({"jsonrpc": "2.0", "id": 17, "method": "tools/call", "params": {"name": "echo",
                                                                          "arguments": {"pad": "y" * 100_000}}})
    over = raw.read()
    assert over["id"] == 17 and over["error"]["code"] == INVALID_REQUEST and "over 65536 bytes" in over["error"]["message"]
    huge = raw.call(18, "huge", size=100_000)
    assert huge["id"] == 18 and huge["error"]["code"] == OUTCOME_UNKNOWN
    assert raw.call(19, "huge", size=10)["result"]["content"][0]["text"] == "x" * 10
    assert [e["args"] for e in raw.ran("echo")] == []
    assert raw.close() == 0


def test_a_line_that_is_not_json_is_logged_scrubbed_escaped_and_bounded(tmp_path: Path, proxies: list[Raw]) -> None:
    secret = "sk_live_" + "Q" * 40
    raw = start(proxies, tmp_path, RAW_SECRET=secret)
    text = "Authorization: Bearer {secret} \x1b]0;owned\x07\x1b[31m" + "z" * 5000
    assert raw.call(20, "noise", text=text)["result"]["content"][0]["text"] == "noisy"
    assert raw.close() == 0
    log = raw.log()
    assert "not JSON" in log
    assert secret not in log and "QQQQQQQQ" not in log
    assert "\x1b" not in log and "\x07" not in log
    assert "z" * 300 not in log


def test_an_answered_request_frees_its_id_for_the_next(tmp_path: Path, proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    assert raw.request(21, "ping") == {"jsonrpc": "2.0", "id": 21, "result": {}}
    assert raw.request(21, "ping") == {"jsonrpc": "2.0", "id": 21, "result": {}}  # answered: the id is free again
    assert raw.close() == 0


def test_an_answer_inside_a_batch_from_the_server_reaches_its_call_and_is_logged(tmp_path: Path,
                                                                                 proxies: list[Raw]) -> None:
    raw = start(proxies, tmp_path)
    answer = raw.call(22, "batched")
    assert answer == {"jsonrpc": "2.0", "id": 22, "result": {"content": [{"type": "text", "text": "in a batch"}]}}
    assert raw.close() == 0
    assert "STEP_COMMITTED" in ms.step_types(raw.wal, "batched")
