"""Kept-alive connections of ``agent-saga mcp --listen --upstream``: the client's connection
carries one request after another, and the proxy reuses its upstream connections — but a
connection the upstream closed while idle is never written to, a ``tools/call`` is never
sent twice (a reused connection dropped after the request is OUTCOME_UNKNOWN, not retried),
and a connection whose answer was not read to its end is never reused.

The upstream is a hand-written HTTP server (threads, raw sockets) that numbers its
connections and counts every ``tools/call`` it receives."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import mcp_support as ms
import pytest
from fixtures.polling import until

OUTCOME_UNKNOWN = -32002
POLICY = {"mode": "enforce", "tools": {t: {"semantics": "REVERSIBLE"} for t in ("echo", "vanish", "cut", "linger")}}


class Upstream:
    """Streamable HTTP, just enough: ``echo`` answers (JSON, kept alive); ``vanish`` reads
    the call and closes without a word; ``cut`` starts an event stream and closes inside
    it; ``linger`` sends its answer as an event and keeps the stream open until its
    connection is closed by the proxy. A DELETE is answered 204, without a length."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.calls: list[tuple[int, str, Any]] = []  # (connection, tool, arguments["n"])
        self.bodies: list[bytes] = []  # each tools/call's request body, as received
        self.idle: dict[int, socket.socket] = {}
        self.open: set[int] = set()
        self.lock = threading.Lock()
        self._n = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self._n += 1
            threading.Thread(target=self._serve, args=(self._n, conn), daemon=True).start()

    def _serve(self, cid: int, conn: socket.socket) -> None:
        with self.lock:
            self.open.add(cid)
        f = conn.makefile("rb")
        try:
            while True:
                with self.lock:
                    self.idle[cid] = conn
                head = b""
                while not head.endswith(b"\r\n\r\n"):
                    line = f.readline()
                    if not line:
                        return
                    head += line
                with self.lock:
                    self.idle.pop(cid, None)
                length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n")
                               if h.lower().startswith(b"content-length:")), 0)
                body = f.read(length) if length else b"{}"
                msg = json.loads(body)
                if msg.get("method") == "tools/call":
                    with self.lock:
                        self.bodies.append(body)
                if head.startswith(b"DELETE"):  # no body, no length: a 204 has none
                    with self.lock:
                        self.calls.append((cid, "DELETE", None))
                    conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
                    continue
                if not self._answer(cid, conn, msg):
                    return
        except OSError:
            return
        finally:
            with self.lock:
                self.idle.pop(cid, None)
                self.open.discard(cid)
            conn.close()

    def _answer(self, cid: int, conn: socket.socket, msg: dict[str, Any]) -> bool:
        if "id" not in msg:
            conn.sendall(b"HTTP/1.1 202 Accepted\r\nContent-Length: 0\r\n\r\n")
            return True
        if msg["method"] != "tools/call":
            body = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
                "protocolVersion": "2025-06-18", "capabilities": {"tools": {}},
                "serverInfo": {"name": "pool", "version": "1"}}}).encode()
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nMcp-Session-Id: s1\r\n"
                         b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
            return True
        tool = msg["params"]["name"]
        with self.lock:
            self.calls.append((cid, tool, msg["params"]["arguments"].get("n")))
        answer = json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {
            "content": [{"type": "text", "text": f"{tool} on connection {cid}"}]}}).encode()
        if tool == "vanish":
            return False
        if tool == "echo":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%b"
                         % (len(answer), answer))
            return True
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
        progress = b'data: {"jsonrpc":"2.0","method":"notifications/progress","params":{"progressToken":1,' \
                   b'"progress":1}}\n\n'
        event = b"data: " + answer + b"\n\n"
        conn.sendall(b"%x\r\n%b\r\n" % (len(progress), progress))
        if tool == "cut":
            return False
        conn.sendall(b"%x\r\n%b\r\n" % (len(event), event))
        conn.recv(1)  # linger: the stream stays open after the answer until the proxy closes it (b"")
        return False  # (or writes its next request here, which this server then never answers)

    def count(self, tool: str, n: int) -> int:
        with self.lock:
            return sum(1 for _, t, m in self.calls if t == tool and m == n)

    def connection_of(self, tool: str, n: int) -> int:
        with self.lock:
            return next(c for c, t, m in self.calls if t == tool and m == n)

    def close_idle(self) -> list[int]:
        """Close every connection waiting for a request (as a server's keep-alive timeout
        does); the ones closed, once their threads are done with them."""
        with self.lock:
            closing = dict(self.idle)
        for conn in closing.values():
            conn.shutdown(socket.SHUT_RDWR)
        until("the idle connections closed", lambda: not set(closing) & self.open)
        return sorted(closing)


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Upstream, int]]:
    tmp = tmp_path_factory.mktemp("mcp-http-pool")
    up = Upstream()
    with open(tmp / "proxy.log", "w") as plog:
        proxy = subprocess.Popen(
            [sys.executable, "-m", "agent_saga.cli", "mcp", "--policy", str(ms.write_policy(tmp / "p.json", POLICY)),
             "--wal", str(tmp / "proxy.wal"), "--name", "pool", "--listen", "127.0.0.1:0",
             "--upstream", f"http://127.0.0.1:{up.port}/mcp"],
            env=ms.proxy_env(tmp), stdout=plog, stderr=subprocess.STDOUT, cwd=str(ms.ROOT))
    try:
        yield up, until("the proxy names its port", lambda: ms.listening_port(tmp / "proxy.log"), proc=proxy)
    finally:
        proxy.terminate()
        proxy.wait(timeout=30)
        up.sock.close()


class Client:
    """One kept-alive connection to the proxy, one session."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                        "MCP-Protocol-Version": "2025-06-18"}
        self.n = 0
        _, head = self.post({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "pool", "version": "1"}}})
        self.headers["Mcp-Session-Id"] = head["Mcp-Session-Id"]
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, msg: dict[str, Any]) -> tuple[Any, http.client.HTTPMessage]:
        self.conn.request("POST", "/mcp", json.dumps(msg).encode(), self.headers)
        resp = self.conn.getresponse()
        raw = resp.read().decode()
        data = [line[5:] for line in raw.splitlines() if line.startswith("data:")]
        return (json.loads(data[-1]) if data else json.loads(raw) if raw.strip() else None), resp.headers

    def post_text(self, text: str) -> Any:
        """POST ``text`` as it is (JSON that ``json.dumps`` would not write); the answer."""
        self.conn.request("POST", "/mcp", text.encode(), self.headers)
        raw = self.conn.getresponse().read().decode()
        data = [line[5:] for line in raw.splitlines() if line.startswith("data:")]
        return json.loads(data[-1]) if data else json.loads(raw)

    def call(self, tool: str, n: int) -> dict[str, Any]:
        self.n += 1
        answer, _ = self.post({"jsonrpc": "2.0", "id": self.n, "method": "tools/call",
                               "params": {"name": tool, "arguments": {"n": n}}})
        assert answer["id"] == self.n
        return answer  # type: ignore[no-any-return]


@pytest.fixture
def client(setup: tuple[Upstream, int]) -> Iterator[Client]:
    c = Client(setup[1])
    yield c
    c.conn.close()


def test_both_connections_are_kept_alive(setup: tuple[Upstream, int], client: Client) -> None:
    up, _ = setup
    sock = client.conn.sock
    for n in (1, 2, 3):
        assert "result" in client.call("echo", n)
        assert client.conn.sock is sock  # the proxy did not close the client's connection
    assert up.connection_of("echo", 1) == up.connection_of("echo", 2) == up.connection_of("echo", 3)


def test_a_connection_the_upstream_closed_while_idle_is_not_written_to(setup: tuple[Upstream, int], client: Client) -> None:
    up, _ = setup
    assert "result" in client.call("echo", 10)
    # The server marks a connection idle after it answered: the proxy may relay the answer first.
    until("the call's connection to wait for the next request", lambda: up.connection_of("echo", 10) in up.idle)
    closed = up.close_idle()
    assert up.connection_of("echo", 10) in closed
    answer = client.call("echo", 11)
    assert "result" in answer, answer  # a new connection, not an OUTCOME_UNKNOWN on the closed one
    assert up.connection_of("echo", 11) not in closed
    assert up.count("echo", 11) == 1


def test_a_call_whose_reused_connection_drops_is_unknown_and_never_sent_again(setup: tuple[Upstream, int], client: Client) -> None:
    up, _ = setup
    assert "result" in client.call("echo", 20)
    answer = client.call("vanish", 21)  # on the kept connection; the server reads it and closes
    assert answer["error"]["code"] == OUTCOME_UNKNOWN, answer
    assert up.connection_of("vanish", 21) == up.connection_of("echo", 20)
    assert up.count("vanish", 21) == 1  # a retry on a fresh connection would have sent it again
    assert "result" in client.call("echo", 22)


def test_a_stream_cut_before_the_answer_is_unknown(setup: tuple[Upstream, int], client: Client) -> None:
    up, _ = setup
    answer = client.call("cut", 30)
    assert answer["error"]["code"] == OUTCOME_UNKNOWN, answer
    assert up.count("cut", 30) == 1
    assert "result" in client.call("echo", 31)
    assert up.connection_of("echo", 31) != up.connection_of("cut", 30)


def test_a_stream_not_read_to_its_end_is_never_reused(setup: tuple[Upstream, int], client: Client) -> None:
    up, _ = setup
    assert "result" in client.call("linger", 40)  # answered; the stream is still open
    lingering = up.connection_of("linger", 40)
    assert "result" in client.call("echo", 41)
    assert up.connection_of("echo", 41) != lingering
    until("the proxy closed the unfinished stream's connection", lambda: lingering not in up.open)


def test_an_answer_without_a_body_is_not_waited_for_and_its_connection_is_reused(
        setup: tuple[Upstream, int], client: Client) -> None:
    up, _ = setup
    assert "result" in client.call("echo", 50)
    client.conn.request("DELETE", "/mcp", None, client.headers)
    resp = client.conn.getresponse()
    assert resp.status == 204 and resp.read() == b""
    with up.lock:
        deleted_on = [c for c, t, _ in up.calls if t == "DELETE"][-1]
    assert deleted_on == up.connection_of("echo", 50)
    again = Client(setup[1])
    try:
        assert "result" in again.call("echo", 51)
    finally:
        again.conn.close()
    assert up.connection_of("echo", 51) == deleted_on  # the 204 left the connection reusable


def test_a_call_goes_upstream_as_the_proxy_read_it_not_as_the_client_wrote_it(
        setup: tuple[Upstream, int], client: Client) -> None:
    """A number the proxy reads rounded (100.000000000000001 is the float 100.0) is what its
    gate, limits and log judged; a server reading decimals exactly must get that value, not
    the client's digits, which would be more than what was allowed."""
    up, _ = setup
    with up.lock:
        before = len(up.bodies)
    answer = client.post_text('{"jsonrpc": "2.0", "id": 900, "method": "tools/call", '
                              '"params": {"name": "echo", "arguments": {"n": 100.000000000000001}}}')
    assert answer["id"] == 900 and "result" in answer, answer
    with up.lock:
        sent = up.bodies[before:]
    assert len(sent) == 1, sent
    assert b"100.000000000000001" not in sent[0], sent[0]
    assert json.loads(sent[0])["params"]["arguments"] == {"n": 100.0}
