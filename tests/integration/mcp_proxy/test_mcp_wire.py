"""The proxy on the wire, driven by hand: malformed JSON-RPC from the client is answered
with a JSON-RPC error and the session goes on; a batch holding a tools/call is refused
whole; ``--observe`` writes a skeleton in which every tool is IRREVERSIBLE."""

from __future__ import annotations

import json
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import mcp_support as ms
from agent_saga.controls.policy import load_policy_file


class Wire:
    """The proxy as a child process with pipes: one JSON-RPC line at a time."""

    def __init__(self, tmp: Path, *options: str) -> None:
        with open(tmp / "proxy.log", "w") as log:
            self.proc = subprocess.Popen([sys.executable, *ms.proxy_argv(*options)], stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, env=ms.proxy_env(tmp), cwd=str(ms.ROOT))

    def send(self, line: str | dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        text = line if isinstance(line, str) else json.dumps(line)
        self.proc.stdin.write(text.encode() + b"\n")
        self.proc.stdin.flush()

    def read(self, timeout: float = 60) -> Any:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        assert ready, "no answer from the proxy"
        return json.loads(self.proc.stdout.readline())

    def request(self, id_: int, method: str, params: dict[str, Any] | None = None) -> Any:
        self.send({"jsonrpc": "2.0", "id": id_, "method": method, **({"params": params} if params else {})})
        return self.read()

    def initialize(self) -> None:
        init = self.request(1, "initialize", {"protocolVersion": "2025-06-18", "capabilities": {},
                                              "clientInfo": {"name": "wire-test", "version": "1"}})
        assert init["result"]["serverInfo"]["name"] == "ledger-bank"
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def close(self) -> int:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout=60)
        finally:
            self.proc.stdout.close()


def test_malformed_messages_from_the_client_get_json_rpc_errors_and_the_session_survives(tmp_path: Path) -> None:
    wire = Wire(tmp_path, "--policy", str(ms.write_policy(tmp_path / "p.json")), "--wal", str(tmp_path / "w.wal"))
    wire.initialize()
    wire.send("{this is not json")
    assert wire.read()["error"]["code"] == -32700
    wire.send({"jsonrpc": "2.0", "id": 5})
    bad = wire.read()
    assert bad["id"] == 5 and bad["error"]["code"] == -32600
    wire.send({"jsonrpc": "1.0", "id": 6, "method": "tools/list"})
    assert wire.read()["error"]["code"] == -32600
    wire.send("[]")
    assert wire.read()["error"]["code"] == -32600
    wire.send(json.dumps([{"jsonrpc": "2.0", "id": 7, "method": "tools/call",
                           "params": {"name": "search_docs", "arguments": {"query": "x"}}},
                          {"jsonrpc": "2.0", "id": 8, "method": "ping"}]))
    batch = wire.read()
    assert [(m["id"], m["error"]["code"]) for m in batch] == [(7, -32600), (8, -32600)]
    assert ms.calls(tmp_path, "search_docs") == []  # nothing in the refused batch was sent
    no_name = wire.request(9, "tools/call", {"arguments": {}})
    assert no_name["error"]["code"] == -32602
    # ... and the session goes on: an unknown method is forwarded verbatim (the server answers it),
    # a ping passes, a tool call works.
    unknown = wire.request(10, "future/method", {"x": 1})
    assert unknown["id"] == 10 and unknown["error"]["code"] == -32601
    assert wire.request(11, "ping") == {"jsonrpc": "2.0", "id": 11, "result": {}}
    ok = wire.request(12, "tools/call", {"name": "search_docs", "arguments": {"query": "after"}})
    assert ok["result"]["content"][0]["text"] == "results for after"
    assert wire.close() == 0


def test_observe_forwards_everything_and_writes_an_all_irreversible_skeleton(tmp_path: Path) -> None:
    target = tmp_path / "saga-policy.yaml"
    wire = Wire(tmp_path, "--observe", "--emit-policy", str(target))
    wire.initialize()
    listed = wire.request(2, "tools/list")["result"]["tools"]
    undeclared = wire.request(3, "tools/call", {"name": "delete_everything", "arguments": {}})
    assert undeclared["result"]["content"][0]["text"] == "deleted"  # observe refuses nothing
    assert wire.close() == 0
    policy = load_policy_file(target)
    manifest = load_policy_file(tmp_path / "saga-policy.sagapolicy.yaml")
    assert set(policy.tools) == {t["name"] for t in listed} == set(manifest.tools)
    assert {d.semantics.value for d in policy.tools.values()} == {"IRREVERSIBLE"}
    assert target.read_text().count("# TODO") == len(listed)
    # What a name or the server's annotations suggest is a comment beside the declaration.
    text = target.read_text()
    assert '# candidate (its name reads (search)): semantics: REVERSIBLE' in text.split('"search_docs":', 1)[1]
    assert "# destructiveHint: true" in text.split('"delete_everything":', 1)[1].split('\n  "', 1)[0]
    assert "kind: SagaPolicy" in (tmp_path / "saga-policy.sagapolicy.yaml").read_text()
