"""The reference MCP "everything" server (@modelcontextprotocol/server-everything, npm, the
version hack/versions.env pins) behind ``agent-saga mcp --listen`` with its reviewed
policy (examples/policies/everything.yaml), driven by the official MCP SDK client.

One session is run twice, directly and through the proxy: progress, cancellation,
resources (list, read, templates, subscribe), prompts, completion, logging, ping, and the
server's own requests to the client (roots, sampling, elicitation) with the client's
answers. Every body the client received through the proxy is the server's, byte for
byte (event ids, the session id and generated clock times aside, which differ between
any two sessions), while each tools/call is a saga step: a declared tool answered, an
undeclared one refused, a halted one refused, one that needs a human refused when none
is set up. A client that stops reading a call's stream does not make the call unknown:
it is recorded, and its answer is replayed to the client that resumes the stream."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import everything_client as ec
import httpx2
import mcp_support as ms
import pytest
from fixtures.mcp_servers import (
    LISTEN_FD_PRELOAD,
    node_server_env,
    require_node,
    require_server_everything,
)
from fixtures.polling import until
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

REFUSED = -32001
POLICY = ms.ROOT / "examples" / "policies" / "everything.yaml"


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-everything")


@pytest.fixture(scope="module")
def urls(tmp: Path) -> Iterator[tuple[str, str]]:
    node, entry = require_node(), require_server_everything()
    # The server serves a socket bound here (handed over as a file descriptor), and the
    # proxy binds port 0 and names its port: no port is chosen free and then taken.
    listening = socket.create_server(("127.0.0.1", 0))
    up = listening.getsockname()[1]
    server_env = node_server_env(listening.fileno(), tmp)
    env = ms.proxy_env(tmp, AGENT_SAGA_SWITCH_STORE=str(tmp / "switches.json"))
    with listening, open(tmp / "server.log", "w") as slog, open(tmp / "proxy.log", "w") as plog:
        server = subprocess.Popen([node, "--require", str(LISTEN_FD_PRELOAD), str(entry), "streamableHttp"],
                                  env=server_env, stdout=slog, stderr=subprocess.STDOUT, cwd=str(tmp),
                                  pass_fds=(listening.fileno(),))
        proxy = subprocess.Popen(
            [sys.executable, "-m", "agent_saga.cli", "mcp", "--policy", str(POLICY), "--wal", str(tmp / "proxy.wal"),
             "--name", "everything", "--listen", "127.0.0.1:0", "--upstream", f"http://127.0.0.1:{up}/mcp"],
            env=env, stdout=plog, stderr=subprocess.STDOUT, cwd=str(ms.ROOT))
    try:
        until("the server answers", lambda: ms.answers_http(up), proc=server, timeout=60)
        px = until("the proxy names its port", lambda: ms.listening_port(tmp / "proxy.log"), proc=proxy, timeout=60)
        yield f"http://127.0.0.1:{up}/mcp", f"http://127.0.0.1:{px}/mcp"
    finally:
        for p in (proxy, server):
            p.terminate()
            p.wait(timeout=30)


@pytest.fixture(scope="module")
def sessions(urls: tuple[str, str]) -> tuple[ec.Seen, ec.Seen]:
    direct_url, proxy_url = urls
    return anyio.run(ec.run, direct_url), anyio.run(ec.run, proxy_url)


def _answers(seen: ec.Seen) -> dict[bytes, bytes]:
    """Each request the client POSTed -> the body it received, normalized."""
    out = {}
    for ex in seen.exchanges:
        if ex.method == "POST" and b'"method"' in ex.request and b'"id"' in ex.request:
            out[ex.request] = ec.normalized(bytes(ex.body), seen.session_id)
    return out


# What the server sends on a session's own clock, not in answer to the client: how many
# times it repeats a simulated log or resources/updated before the client stops it, and
# the progress of the cancelled operation, which the server goes on running. Each is
# compared once, not counted.
_TIMED = b'"method":"notifications/progress"'


def _stream_events(seen: ec.Seen) -> list[bytes]:
    """The events of the GET streams (the server's requests and notifications), normalized."""
    return sorted({ev for ex in seen.exchanges if ex.method == "GET"
                   for ev in ec.events(ec.normalized(bytes(ex.body), seen.session_id)) if _TIMED not in ev})


def _notes(seen: ec.Seen) -> list[bytes]:
    return sorted({n for n in (ec.note(x, seen.session_id) for x in seen.notes) if _TIMED not in n})


def _refused(wal: Path, tool: str) -> list[str]:
    """The record types of every step of ``tool`` the gate refused (no intent is logged)."""
    steps = {r["step"] for r in ms.of_type(wal, "GATE_VERDICT", tool=tool, allowed=False)}
    return [r["type"] for r in ms.records(wal) if r.get("step") in steps]


def _step_ended(wal: Path, tool: str, arguments: dict[str, Any]) -> list[str]:
    """The record types of the step that called ``tool`` with ``arguments``, once it ended
    (a REVERSIBLE step's records reach the file a moment after the answer)."""
    def ended() -> list[str]:
        steps = {r["step"] for r in ms.of_type(wal, "STEP_INTENT", tool=tool, policy_args=arguments)}
        types = [r["type"] for r in ms.records(wal) if r.get("step") in steps]
        return types if {"STEP_COMMITTED", "STEP_FAILED", "STEP_UNKNOWN"} & set(types) else []

    return until(f"the step of {tool} ended", ended)


def _same(doc: Any, seen: ec.Seen) -> Any:
    return json.loads(ec.normalized(json.dumps(doc, sort_keys=True).encode(), seen.session_id))


def test_the_client_receives_the_servers_bytes_through_the_proxy(sessions: tuple[ec.Seen, ec.Seen]) -> None:
    direct, proxied = sessions
    assert direct.session_id and proxied.session_id
    answers, through = _answers(direct), _answers(proxied)
    get_env = next(req for req in answers if b'"get-env"' in req)
    assert answers.keys() == through.keys()
    for req, body in answers.items():
        if req == get_env:
            continue
        if b'"duration":30' in req:  # the cancelled call: what came before the client stopped reading
            body, through[req] = b"".join(ec.events(body)[:2]), b"".join(ec.events(through[req])[:2])
        assert through[req] == body, f"through the proxy, {req[:120]!r} was answered differently"
    # tools/call answers too: the server's own event, its id line kept (a client resumes by it)
    echo = next(req for req in through if b'"still here"' in req)
    assert through[echo].count(b"id: EVENT\n") == 2 and b'"text":"Echo: still here"' in through[echo]
    # the client's answers to the server's requests (roots, sampling, elicitation), POSTed back
    posted = [[(ex.request, ex.status) for ex in seen.exchanges if ex.method == "POST" and b'"result"' in ex.request
               and b'"method"' not in ex.request] for seen in (direct, proxied)]
    assert posted[1] == posted[0] and [status for _, status in posted[1]] == [202, 202, 202]
    # the server's requests and notifications on the session's event stream (GET)
    assert _stream_events(proxied) == _stream_events(direct)
    assert any(b'"method":"roots/list"' in e for e in _stream_events(proxied))
    # what the SDK client made of it all
    assert _same(proxied.results, proxied) == {**_same(direct.results, direct), "get-env": proxied.results["get-env"]}
    assert proxied.asked == direct.asked
    assert [a[0] for a in direct.asked] == ["roots/list", "sampling/createMessage", "elicitation/create"]
    assert proxied.progress == direct.progress == [(1.0, 3.0), (2.0, 3.0), (3.0, 3.0)]
    assert _notes(proxied) == _notes(direct)


def test_each_tools_call_is_a_step_an_undeclared_tool_is_refused(sessions: tuple[ec.Seen, ec.Seen],
                                                                 tmp: Path) -> None:
    direct, proxied = sessions
    assert direct.results["get-env"] == "answered"  # the server would have returned its environment
    refusal = proxied.results["get-env"]
    assert refusal["code"] == REFUSED and "get-env is not declared" in refusal["message"]
    wal = tmp / "proxy.wal"
    # the client's DELETE ended the session cleanly (after every step's records)
    until("the session committed", lambda: ms.of_type(wal, "SAGA_COMPLETED"))
    assert _refused(wal, "get-env") == ["GATE_VERDICT", "STEP_REFUSED"]
    assert ms.step_types(wal, "get-env") == []  # never an intent: never sent
    for tool in ("echo", "get-sum", "trigger-sampling-request", "trigger-elicitation-request", "get-roots-list"):
        assert "STEP_COMMITTED" in ms.step_types(wal, tool), tool
    # the call the client cancelled after it was sent: it may have happened
    assert "STEP_UNKNOWN" in ms.step_types(wal, "trigger-long-running-operation")


async def test_a_halted_tool_and_one_that_needs_a_human_are_refused_unsent(urls: tuple[str, str],
                                                                           tmp: Path) -> None:
    _, proxy_url = urls
    store = str(tmp / "switches.json")
    async with streamable_http_client(proxy_url) as (r, w), ClientSession(r, w) as s:
        await s.initialize()
        assert (await s.call_tool("echo", {"message": "before"})).content[0].text == "Echo: before"
        # IRREVERSIBLE, and no approver is set up: refused; the server never registered its resource
        with pytest.raises(MCPError) as err:
            await s.call_tool("gzip-file-as-resource", {"name": "x.gz", "data": "data:text/plain;base64,eA=="})
        assert err.value.error.code == REFUSED
        assert "demo://resource/session/x.gz" not in [str(x.uri) for x in (await s.list_resources()).resources]
        done = subprocess.run([sys.executable, "-m", "agent_saga.cli", "halt", "--scope", "tool:echo", "--reason",
                               "incident 12", "--by", "soc@corp", "--store", store], capture_output=True, text=True,
                              timeout=60, cwd=str(ms.ROOT))
        assert done.returncode == 0, done.stderr
        try:
            message = ""
            with anyio.fail_after(30):
                while not message:  # the proxy re-reads the switch file at most every 0.25 s
                    try:
                        await s.call_tool("echo", {"message": "during"})
                    except MCPError as exc:
                        message = exc.error.message if exc.error.code == REFUSED else ""
            assert "incident 12" in message
        finally:
            subprocess.run([sys.executable, "-m", "agent_saga.cli", "resume", "--scope", "tool:echo", "--by",
                            "soc@corp", "--store", store], capture_output=True, timeout=60, cwd=str(ms.ROOT))
    assert _refused(tmp / "proxy.wal", "gzip-file-as-resource") == ["GATE_VERDICT", "STEP_REFUSED"]
    assert ms.step_types(tmp / "proxy.wal", "gzip-file-as-resource") == []


def _post(http: httpx2.Client, url: str, sid: str | None, msg: dict[str, Any]) -> httpx2.Response:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
               "MCP-Protocol-Version": "2025-11-25"}
    if sid:
        headers["Mcp-Session-Id"] = sid
    return http.post(url, content=json.dumps(msg), headers=headers)


def test_a_call_whose_client_stopped_reading_is_recorded_and_replayed(urls: tuple[str, str], tmp: Path) -> None:
    _, proxy_url = urls
    with httpx2.Client(timeout=30) as http:
        init = _post(http, proxy_url, None, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}})
        sid = init.headers["mcp-session-id"]
        _post(http, proxy_url, sid, {"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "trigger-long-running-operation", "arguments": {"duration": 0.6, "steps": 2},
            "_meta": {"progressToken": "p"}}}
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream",
                   "MCP-Protocol-Version": "2025-11-25", "Mcp-Session-Id": sid}
        with http.stream("POST", proxy_url, content=json.dumps(call), headers=headers) as resp:
            first = next(resp.iter_lines())  # the server's priming event: its id is where to resume
        assert first.startswith("id: ")
        last_event = first[4:]
        # The client went away; the call goes on and is recorded with its answer.
        assert _step_ended(tmp / "proxy.wal", "trigger-long-running-operation", {"duration": 0.6, "steps": 2}) == [
            "GATE_VERDICT", "STEP_INTENT", "STEP_COMMITTED"]
        # The client resumes the stream where it stopped: the rest of it, the answer included.
        replayed = []
        with http.stream("GET", proxy_url, headers={"Accept": "text/event-stream", "Mcp-Session-Id": sid,
                                                    "Last-Event-ID": last_event,
                                                    "MCP-Protocol-Version": "2025-11-25"}) as resp:
            for line in resp.iter_lines():
                if line.startswith("data: "):
                    replayed.append(json.loads(line[6:]))
                    if replayed[-1].get("id") == 2:
                        break
        assert [m["params"]["progress"] for m in replayed if m.get("method") == "notifications/progress"] == [1, 2]
        assert "Long running operation completed" in replayed[-1]["result"]["content"][0]["text"]
        http.delete(proxy_url, headers={"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"})


def test_a_call_on_a_session_the_server_does_not_know_gets_the_servers_own_answer(urls: tuple[str, str],
                                                                                   tmp: Path) -> None:
    # The client learns from the HTTP status that its session is gone (and starts a new
    # one), as it would talking to the server directly: not a 200 wrapping an error.
    call = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "echo", "arguments": {
        "message": "to a session that ended"}}}
    answers = []
    with httpx2.Client(timeout=30) as http:
        for url in urls:
            resp = _post(http, url, "a-session-that-ended", call)
            answers.append((resp.status_code, resp.headers.get("content-type"), resp.content))
    assert answers[0][0] == 400 and b"No valid session ID" in answers[0][2]
    assert answers[1] == answers[0]
    # HTTP 400: the server did not accept the call, so it did not happen: the step failed
    assert _step_ended(tmp / "proxy.wal", "echo", {"message": "to a session that ended"}) == [
        "GATE_VERDICT", "STEP_INTENT", "STEP_FAILED"]
