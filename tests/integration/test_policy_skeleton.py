"""``agent-saga policy skeleton``: the recorded tool surface (a real Redis) becomes a
SagaPolicy with every tool IRREVERSIBLE and a TODO; the file never upgrades itself."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import redis
from agent_saga.cli import main
from agent_saga.controls.policy import load_policy_file, load_policy_text, surface_entry_doc
from agent_saga.controls.policy._surface import read_surface, record_surface
from agent_saga.semantics import ActionSemantics
from fixtures.redis_server import KEY_PREFIX, RedisServer
from fixtures.redis_server import PLANE_PREFIX as P

pytestmark = pytest.mark.integration


def STORE(server: RedisServer) -> list[str]:
    """The CLI's ``--store`` and ``--key-prefix`` for the suite's Redis."""
    return ["--store", server.url, "--key-prefix", KEY_PREFIX]


@pytest.fixture
def r(fresh_redis: RedisServer) -> redis.Redis:
    return fresh_redis.client()


def record(r: redis.Redis, agent: str, tool: str, semantics: str | None = "COMPENSABLE", args=("amount",),
           schema=None, ns: str = "payments") -> None:
    record_surface(r, P, ns, agent, [surface_entry_doc(tool, semantics=semantics, policy_args=args,
                                                       now=time.time(), input_schema=schema)])


def test_calls_from_several_processes_of_one_agent_add_up(r: redis.Redis) -> None:
    record(r, "payments-1", "stripe__create_charge", args=("amount",))
    record(r, "payments-1", "stripe__create_charge", args=("customer",), schema={"type": "object"})
    record(r, "payments-1", "stripe__create_charge", args=())
    (entry,), problems = read_surface(r, P, "payments")
    assert problems == []
    assert entry.calls == 3 and entry.policy_args == ("amount", "customer")
    assert entry.input_schema == {"type": "object"} and entry.agents == ("payments-1",)


def test_an_unreadable_entry_is_skipped_and_reported(r: redis.Redis) -> None:
    record(r, "payments-1", "search_docs", semantics="REVERSIBLE")
    r.hset(f"{P}:surface:payments/payments-1", "broken", "{not json")
    entries, problems = read_surface(r, P, "payments")
    assert [e.tool for e in entries] == ["search_docs"]
    assert problems and problems[0].startswith("payments/payments-1 broken:")


def test_every_recorded_tool_arrives_irreversible_with_a_todo(r: redis.Redis, fresh_redis: RedisServer,
                                                             tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    record(r, "payments-1", "stripe__create_charge", semantics="COMPENSABLE",
           schema={"type": "object", "properties": {"amount": {"type": "integer"}}})
    record(r, "payments-2", "search_docs", semantics="REVERSIBLE", args=())
    record(r, "billing-1", "invoice.send", ns="billing")
    out = tmp_path / "policy.yaml"
    assert main(["policy", "skeleton", "-n", "payments", "-o", str(out), *STORE(fresh_redis)]) == 0
    said = capsys.readouterr().out
    assert f"wrote {out}: 2 tool(s), every one IRREVERSIBLE with a TODO" in said and fresh_redis.url.split("@")[-1] in said
    text = out.read_text()
    policy = load_policy_file(out)
    assert sorted(policy.tools) == ["search_docs", "stripe__create_charge"]  # not billing's
    assert {d.semantics for d in policy.tools.values()} == {ActionSemantics.IRREVERSIBLE}
    assert policy.mode == "Enforce" and policy.undeclared_tools == "Refuse"
    assert policy.applies_to is not None and policy.applies_to.agents == ("payments-1", "payments-2")
    assert text.count("# TODO: review") == 2
    assert "the code declares COMPENSABLE" in text and '"amount":{"type":"integer"}' in text


def test_the_file_never_upgrades_itself(r: redis.Redis, fresh_redis: RedisServer, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "policy.yaml"
    reviewed = "# reviewed by security\nmode: Enforce\ntools: {search_docs: {semantics: REVERSIBLE}}\n"
    out.write_text(reviewed)
    record(r, "payments-1", "search_docs", semantics="REVERSIBLE")
    assert main(["policy", "skeleton", "-n", "payments", "-o", str(out), *STORE(fresh_redis)]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert out.read_text() == reviewed


def test_one_agents_skeleton_names_it_and_only_its_tools(r: redis.Redis, fresh_redis: RedisServer,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    record(r, "payments-1", "stripe__create_charge")
    record(r, "payments-2", "search_docs")
    assert main(["policy", "skeleton", "-n", "payments", "--agent", "payments-2", *STORE(fresh_redis)]) == 0
    captured = capsys.readouterr()
    policy = load_policy_text(captured.out)
    assert list(policy.tools) == ["search_docs"]
    assert policy.applies_to is not None and policy.applies_to.agents == ("payments-2",)
    assert "1 tool(s) from the tool surface recorded in" in captured.err and "agent payments-2" in captured.err


def test_with_nothing_recorded_the_skeleton_says_to_observe_first(fresh_redis: RedisServer,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "skeleton", "-n", "payments", *STORE(fresh_redis)]) == 0
    text = capsys.readouterr().out
    assert "run the agents in Observe mode first" in text
    assert load_policy_text(text).tools == {}


def test_an_unreachable_policy_plane_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "skeleton", "-n", "payments", "--store", "redis://127.0.0.1:1/0"]) == 2
    assert "the policy plane redis://127.0.0.1:1/0 could not be read" in capsys.readouterr().err


def test_without_a_store_the_skeleton_names_the_setting(monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AGENT_SAGA_REDIS_URL", raising=False)
    assert main(["policy", "skeleton", "-n", "payments"]) == 2
    assert "AGENT_SAGA_REDIS_URL" in capsys.readouterr().err
