"""The proxy's pieces without processes: option checks name the flag and the fix; JSON-RPC
classification; what a compensation path reads; one policy narrowed from a source."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga.controls.policy import PolicyInForce, StaticPolicySource, parse_policy
from agent_saga.errors import ConfigurationError
from agent_saga.mcp import OnePolicy, ProxyOptions, load_upstreams, result_document
from agent_saga.mcp._wire import classify, key


@pytest.mark.parametrize(("opts", "says"), [
    (ProxyOptions(command=[]), "after --"),
    (ProxyOptions(command=["srv"]), "--policy"),
    (ProxyOptions(command=["srv"], policy="p.json", policy_from_plane="ns/p"), "choose one"),
    (ProxyOptions(command=["srv"], observe=True), "--emit-policy"),
    (ProxyOptions(command=["srv"], observe=True, policy="p.json", emit_policy="x"), "drop --policy"),
    (ProxyOptions(command=["srv"], policy="p.json", emit_policy="x"), "goes with --observe"),
    (ProxyOptions(command=["srv"], policy="p.json", name="no spaces"), "--name"),
])
def test_bad_options_are_refused_naming_the_flag(opts: ProxyOptions, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        opts.check()


def test_observe_never_overwrites_a_policy(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text("reviewed")
    with pytest.raises(ConfigurationError, match="never overwritten"):
        ProxyOptions(command=["srv"], observe=True, emit_policy=str(tmp_path / "p.yaml")).check()


def test_json_rpc_classification() -> None:
    assert classify({"jsonrpc": "2.0", "id": 1, "method": "x"})[0] == "request"
    assert classify({"jsonrpc": "2.0", "method": "x"})[0] == "notification"
    assert classify({"jsonrpc": "2.0", "id": 1, "result": {}})[0] == "response"
    assert classify({"jsonrpc": "2.0", "id": True, "method": "x"})[0] == "invalid"
    assert classify({"id": 1, "method": "x"})[0] == "invalid"
    assert classify([1])[0] == "invalid"
    assert key(1) != key("1")


def test_a_compensation_path_reads_structured_content_then_json_text_then_the_result() -> None:
    assert result_document({"structuredContent": {"id": "a"}, "content": []}) == {"id": "a"}
    assert result_document({"content": [{"type": "text", "text": '{"id": "b"}'}]}) == {"id": "b"}
    plain = {"content": [{"type": "text", "text": "done"}]}
    assert result_document(plain) == plain


def test_one_policy_is_narrowed_and_a_missing_one_fails_closed() -> None:
    a = PolicyInForce("pay/a", parse_policy({"tools": {"t": {"semantics": "REVERSIBLE"}}}))
    b = PolicyInForce("pay/b", parse_policy({"tools": {"u": {"semantics": "REVERSIBLE"}}}))
    inner = StaticPolicySource([a, b], agent="agent")
    view = OnePolicy(inner, "pay/b", "agent").view()
    assert view.usable and [p.id for p in view.policies.policies] == ["pay/b"]
    missing = OnePolicy(inner, "pay/c", "agent").view()
    assert not missing.usable and "pay/c is not in the policy plane" in (missing.problem or "")


def test_an_upstreams_file_with_a_bad_entry_is_refused_naming_it(tmp_path: Path) -> None:
    f = tmp_path / "up.json"
    f.write_text('{"bank": {"cmd": ["x"]}}')
    with pytest.raises(ConfigurationError, match="upstream 'bank'"):
        load_upstreams(str(f))
    f.write_text('{"bank": {"command": "python server.py"}}')
    with pytest.raises(ConfigurationError, match="non-empty list of strings"):
        load_upstreams(str(f))
