"""One real MCP client session through ``agent-saga mcp`` in front of a real MCP server
(both the official SDK), shared by the tests of this module: what passes, what is
refused, what waits for a human, what is forwarded untouched."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_support as ms
import pytest
from fixtures.cli import cli_module
from fixtures.polling import until
from mcp import ClientSession, stdio_client
from mcp.shared.exceptions import MCPError

REFUSED = -32001
OUTCOME_UNKNOWN = -32002


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mcp-session")


@pytest.fixture(scope="module")
def held(tmp: Path) -> Iterator[ms.HeldSession]:
    policy = ms.write_policy(tmp / "saga-policy.json")
    (tmp / "approvals").mkdir()
    server = ms.params(tmp, "--policy", str(policy), "--wal", str(tmp / "proxy.wal"), "--name", "bank",
                       "--approvals", str(tmp / "approvals"), AGENT_SAGA_SWITCH_STORE=str(tmp / "switches.json"))
    session = ms.HeldSession(server, tmp / "proxy.log")
    yield session
    session.close()


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return cli_module(*args, cwd=ms.ROOT)


def _direct_tools(tmp: Path) -> list[dict[str, Any]]:
    async def go() -> list[dict[str, Any]]:
        from mcp import StdioServerParameters

        server = StdioServerParameters(command=sys.executable, args=[str(ms.SERVER)], env=ms.proxy_env(tmp))
        async with stdio_client(server) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            return [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in (await s.list_tools()).tools]

    return asyncio.run(go())


def test_lists_the_same_tools_and_schemas_as_the_server(held: ms.HeldSession, tmp: Path) -> None:
    through = held.run(lambda s: s.list_tools())
    assert [t.model_dump(by_alias=True, exclude_none=True, mode="json") for t in through.tools] == _direct_tools(tmp)


def test_an_undeclared_tool_is_refused_with_an_error_the_model_can_read(held: ms.HeldSession, tmp: Path) -> None:
    with pytest.raises(MCPError) as err:
        held.run(lambda s: s.call_tool("delete_everything", {}))
    assert err.value.error.code == REFUSED
    assert "delete_everything is not declared" in err.value.error.message
    assert err.value.error.message.lower().count("nothing was executed") == 1
    assert ms.calls(tmp, "delete_everything") == []  # it never reached the server
    until("the refusal is in the WAL", lambda: ms.of_type(tmp / "proxy.wal", "STEP_REFUSED", tool="delete_everything"))


def test_a_compensable_call_logs_its_inverse_from_the_result_before_answering(held: ms.HeldSession,
                                                                             tmp: Path) -> None:
    res = held.run(lambda s: s.call_tool("create_charge", {"amount": 42, "to": "acct_1"}))
    charge = res.structured_content["id"]
    committed = [r for r in ms.records(tmp / "proxy.wal") if r["type"] == "STEP_COMMITTED"
                 and (r["payload"].get("compensation") or {}).get("kwargs", {}).get("arguments") == {"charge": charge}]
    assert committed, "the compensation is durable before the client has the answer"
    comp = committed[0]["payload"]["compensation"]
    assert comp["handler"] == "mcp:bank" and comp["kwargs"]["tool"] == "create_refund"
    intent = [r for r in ms.records(tmp / "proxy.wal") if r["type"] == "STEP_INTENT" and r["step"] == committed[0]["step"]]
    assert intent[0]["payload"]["semantics"] == "COMPENSABLE"
    assert intent[0]["payload"]["policy_args"] == {"amount": 42, "to": "acct_1"}


def test_a_large_result_passes_whole(held: ms.HeldSession) -> None:
    res = held.run(lambda s: s.call_tool("big", {"size": 4_000_000}))
    assert res.content[0].text == "x" * 4_000_000


def test_32_concurrent_calls_each_get_their_own_answer(held: ms.HeldSession, tmp: Path) -> None:
    async def go(s: ClientSession) -> list[Any]:
        return await asyncio.gather(*(s.call_tool("search_docs", {"query": f"q{i}"}) for i in range(32)))

    results = held.run(go)
    assert [r.content[0].text for r in results] == [f"results for q{i}" for i in range(32)]
    assert sorted(e["args"]["query"] for e in ms.calls(tmp, "search_docs")) == sorted(f"q{i}" for i in range(32))


def test_progress_and_cancellation_pass_through(held: ms.HeldSession, tmp: Path) -> None:
    async def go(s: ClientSession) -> list[float]:
        seen: list[float] = []
        got_three = asyncio.Event()

        async def on_progress(progress: float, total: float | None, message: str | None) -> None:
            seen.append(progress)
            if len(seen) == 3:
                got_three.set()

        call = asyncio.ensure_future(s.call_tool("slow", {"steps": 3}, progress_callback=on_progress))
        await asyncio.wait_for(got_three.wait(), 30)
        call.cancel()  # the SDK sends notifications/cancelled
        with pytest.raises(asyncio.CancelledError):
            await call
        return seen

    assert held.run(go) == [1, 2, 3]
    until("the server saw the cancellation", lambda: ms.calls(tmp, "slow_cancelled"))
    # Sent and never answered: it may have happened, so the step is UNKNOWN, not failed.
    until("the step is STEP_UNKNOWN", lambda: "STEP_UNKNOWN" in ms.step_types(tmp / "proxy.wal", "slow"))
    assert held.run(lambda s: s.call_tool("search_docs", {"query": "after"})).content[0].text == "results for after"


def test_tools_list_changed_passes_through(held: ms.HeldSession) -> None:
    held.run(lambda s: s.call_tool("tell_tools_changed", {}))
    until("the client got notifications/tools/list_changed", lambda: any(
        "ToolListChanged" in type(getattr(n, "root", n)).__name__ for n in held.notifications))


def test_a_halted_tool_is_refused(held: ms.HeldSession, tmp: Path) -> None:
    ok = held.run(lambda s: s.call_tool("search_docs", {"query": "before"}))
    assert ok.content[0].text == "results for before"
    done = _cli("halt", "--scope", "tool:search_docs", "--reason", "incident 7", "--by", "soc@corp", "--store",
                str(tmp / "switches.json"))
    assert done.returncode == 0, done.stderr
    answered = 0  # calls made before the proxy re-read the file (at most every 0.25 s)
    try:
        def refused() -> str | None:
            nonlocal answered
            try:
                held.run(lambda s: s.call_tool("search_docs", {"query": "during"}))
            except MCPError as exc:
                return exc.error.message if exc.error.code == REFUSED else None
            answered += 1
            return None

        message = until("the halt reaches the proxy", refused)
        assert "incident 7" in message
        # The refused call never reached the server: it saw only the calls answered before.
        assert len([e for e in ms.calls(tmp, "search_docs") if e["args"]["query"] == "during"]) == answered
    finally:
        _cli("resume", "--scope", "tool:search_docs", "--by", "soc@corp", "--store", str(tmp / "switches.json"))


def test_an_irreversible_call_waits_for_a_named_human_then_proceeds(held: ms.HeldSession, tmp: Path) -> None:
    store = str(tmp / "approvals")
    call = asyncio.run_coroutine_threadsafe(
        held.session.call_tool("wire_send", {"amount": 900, "to": "acct_9"}), held.loop)

    def pending() -> list[dict[str, Any]]:
        out = _cli("approvals", "list", "--store", store, "--json")
        return [r for r in json.loads(out.stdout or "[]") if r.get("tool") == "wire_send"]

    request = until("the approval request is pending", pending)[0]
    assert not call.done() and ms.calls(tmp, "wire_send") == []  # it waits; nothing was sent
    done = _cli("approvals", "approve", request["requestId"], "--store", store, "--approver", "risk@corp", "--note", "ok")
    assert done.returncode == 0, done.stderr
    assert call.result(timeout=60).content[0].text == "sent 900 to acct_9"
    assert [e["args"] for e in ms.calls(tmp, "wire_send")] == [{"amount": 900, "to": "acct_9"}]


def test_garbage_from_the_server_is_answered_and_the_session_survives(held: ms.HeldSession, tmp: Path) -> None:
    assert held.run(lambda s: s.call_tool("garble", {})).content[0].text == "garbled"
    log = until("the proxy reports both bad lines", lambda: (tmp / "proxy.log").read_text().count(
        "the upstream") >= 2 and (tmp / "proxy.log").read_text())
    assert log.count("refused a message from the upstream") == 2
    assert "the message is not JSON" in log and 'a message needs "method"' in log
    assert held.run(lambda s: s.call_tool("search_docs", {"query": "still"})).content[0].text == "results for still"


def test_an_argument_named_like_a_key_or_a_secret_nested_under_a_password_is_refused_unsent(
    held: ms.HeldSession, tmp: Path
) -> None:
    """Arguments the model sends are policy arguments, bound for STEP_INTENT and GATE_VERDICT:
    a secret as an argument's NAME, or nested under a credential's name, is refused before
    anything is sent or written, and the refusal does not echo it."""
    key_as_name = "sk_live_51HxYzAbCdEfGhIjKlMnOpQr"
    nested = "n3w-Pa55-under-password"
    for args, where in (({"query": "leak-1", key_as_name: True}, "['[REDACTED]']"),
                        ({"query": "leak-2", "password": {"new": nested}}, "['password']['new']")):
        with pytest.raises(MCPError) as err:
            held.run(lambda s, a=args: s.call_tool("search_docs", a))
        assert err.value.error.code == REFUSED, err.value.error
        assert where in err.value.error.message and "looks like a secret" in err.value.error.message
        assert key_as_name not in err.value.error.message and nested not in err.value.error.message
    assert not [c for c in ms.calls(tmp, "search_docs") if c["args"]["query"].startswith("leak-")]
    text = (tmp / "proxy.wal").read_text()
    assert key_as_name not in text and nested not in text
