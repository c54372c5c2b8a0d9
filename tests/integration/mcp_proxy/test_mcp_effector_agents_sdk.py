"""The effector shape with a real framework: an OpenAI Agents SDK agent
(examples/mcp/openai_agents_effector.py, the SDK's own MCPServerStreamableHttp), driven by
a scripted model, reaches the payments MCP server (examples/payments/payments_mcp: the
official SDK, 401 without its bearer token) only through `agent-saga mcp --listen`, which
holds the token (a credentials directory, as the sidecar's Secret mount) and enforces
examples/k8s/effector/policy.yaml. The agent holds no token: pointed at the server itself,
the SDK cannot even initialize."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_support as ms
import pytest
from agents import set_tracing_disabled
from agents.items import ModelResponse
from agents.models.interface import Model
from agents.usage import Usage
from fixtures.known_secrets import secret
from fixtures.polling import until
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

sys.path.insert(0, str(ms.ROOT / "examples" / "mcp"))
import openai_agents_effector as example  # noqa: E402

set_tracing_disabled(True)  # no exporter: the suite runs offline
POLICY = ms.ROOT / "examples" / "k8s" / "effector" / "policy.yaml"
TOKEN = secret("effector-agents-sdk-token", "tk")


class ScriptedModel(Model):
    """Answers each turn from a script; records what it was given."""

    def __init__(self, script: list[Any]) -> None:
        self.script, self.inputs, self.tools = list(script), [], []  # type: list[Any], list[Any], list[Any]

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema,  # type: ignore[no-untyped-def]
                           handoffs, tracing, *, previous_response_id, conversation_id, prompt):
        self.inputs.append(input)
        self.tools.append([t.name for t in tools])
        return ModelResponse(output=[self.script.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):  # type: ignore[no-untyped-def]  # pragma: no cover
        raise NotImplementedError


def call(name: str, args: dict[str, Any], id_: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", name=name, arguments=json.dumps(args), call_id=id_,
                                    id=f"fc_{id_}", status="completed")


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(id="m1", type="message", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


@pytest.fixture(scope="module")
def tmp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("effector-sdk")
    (path / "server-secret").mkdir()
    (path / "server-secret" / "token").write_text(TOKEN + "\n")
    (path / "proxy-credentials").mkdir()  # the sidecar's own mount of the same Secret
    (path / "proxy-credentials" / "payments-token").write_text(TOKEN + "\n")
    return path


@pytest.fixture(scope="module")
def server(tmp: Path) -> Iterator[int]:
    """The payments server on a bound socket; its stdout is its ledger."""
    listening = socket.create_server(("127.0.0.1", 0))
    port = listening.getsockname()[1]
    env = {**ms.proxy_env(tmp), "PAYMENTS_TOKEN_FILE": str(tmp / "server-secret" / "token"),
           "PYTHONPATH": os.pathsep.join([str(ms.ROOT / "examples" / "payments"), os.environ.get("PYTHONPATH", "")])}
    with listening, open(tmp / "server.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "payments_mcp", "--http-fd", str(listening.fileno())], env=env,
                                stdout=log, stderr=subprocess.STDOUT, pass_fds=(listening.fileno(),))
    try:
        until("the payments server answers", lambda: ms.answers_http(port), proc=proc)
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def proxy(tmp: Path, server: int) -> Iterator[int]:
    (tmp / "mcp-upstreams.json").write_text(json.dumps({"payments": {
        "url": f"http://127.0.0.1:{server}/mcp", "credentials": [{"credentialRef": "payments-token"}]}}))
    env = ms.proxy_env(tmp, AGENT_SAGA_MCP_UPSTREAMS=str(tmp / "mcp-upstreams.json"),
                       AGENT_SAGA_CREDENTIALS_DIR=str(tmp / "proxy-credentials"))
    with open(tmp / "proxy.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent_saga.cli", "mcp", "--policy", str(POLICY), "--wal", str(tmp / "proxy.wal"),
             "--name", "payments", "--agent", "effector-agent", "--listen", "127.0.0.1:0",
             "--upstream", f"http://127.0.0.1:{server}/mcp"],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=str(ms.ROOT))
    try:
        yield until("the proxy names its port", lambda: ms.listening_port(tmp / "proxy.log"), proc=proc)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def ledger(tmp: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (tmp / "server.log").read_text().splitlines()
            if line.startswith('{"payments"')]


def tool_outputs(model: ScriptedModel) -> list[str]:
    return [str(item.get("output")) for turn in model.inputs if isinstance(turn, list) for item in turn
            if isinstance(item, dict) and item.get("type") == "function_call_output"]


async def test_the_sdk_agent_charges_through_the_proxy_which_holds_the_token(tmp: Path, proxy: int) -> None:
    model = ScriptedModel([call("charge", {"amount": 1200, "customer": "cus_42"}, "1"), say("charged")])
    result = await example.run("charge cus_42 12 dollars", model=model, url=f"http://127.0.0.1:{proxy}/mcp")
    assert result.final_output == "charged"
    assert set(model.tools[0]) >= {"charge", "refund", "wire", "balance"}  # the server's tools, via the proxy
    (out,) = tool_outputs(model)
    charged = [e for e in ledger(tmp) if e["payments"] == "charge" and e["customer"] == "cus_42"]
    assert len(charged) == 1 and charged[0]["id"] in out
    # A saga step with its inverse, derived from the result; and the token nowhere but the server.
    intents = [r for r in ms.records(tmp / "proxy.wal") if r["type"] == "STEP_INTENT"
               and r["payload"].get("tool") == "charge"]
    assert intents, ms.records(tmp / "proxy.wal")
    assert charged[0]["id"] in (tmp / "proxy.wal").read_text()
    for place in ((tmp / "proxy.wal").read_text(), (tmp / "proxy.log").read_text(), json.dumps(tool_outputs(model))):
        assert TOKEN not in place and TOKEN[:12] not in place


async def test_an_irreversible_call_is_refused_and_the_model_is_told(tmp: Path, proxy: int) -> None:
    # No approval store: a call that needs a human is refused, never sent.
    model = ScriptedModel([call("wire", {"amount": 500, "to": "acct_9"}, "1"), say("the wire was refused")])
    result = await example.run("wire 5 dollars to acct_9", model=model, url=f"http://127.0.0.1:{proxy}/mcp")
    assert result.final_output == "the wire was refused"
    (out,) = tool_outputs(model)
    assert "approval" in out.lower() or "human" in out.lower(), out
    assert not [e for e in ledger(tmp) if e["payments"] == "wire"]


async def test_pointed_at_the_server_itself_the_sdk_agent_gets_nowhere(tmp: Path, server: int) -> None:
    model = ScriptedModel([call("charge", {"amount": 1, "customer": "cus_direct"}, "1"), say("done")])
    with pytest.raises(BaseExceptionGroup) as err:  # the SDK's task groups around the refused initialize
        await example.run("charge", model=model, url=f"http://127.0.0.1:{server}/mcp")
    assert [type(e).__name__ for e in leaves(err.value)] == ["MCPError"], repr(err.value)
    assert model.inputs == []  # the agent never got as far as asking the model
    assert not [e for e in ledger(tmp) if e.get("customer") == "cus_direct"]


def leaves(group: BaseExceptionGroup[Any]) -> list[BaseException]:
    return [x for e in group.exceptions for x in (leaves(e) if isinstance(e, BaseExceptionGroup) else [e])]
