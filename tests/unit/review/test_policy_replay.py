"""`agent-saga policy replay`: a proposed SagaPolicy over what the agents actually did.

Each test is named after a sentence of docs/gitops.md. The log is written by real sagas
through a real PreFlightGate (FileWAL on disk); the CLI runs in process (tests/unit/review/test_gitops_doc.py runs the console script, as
docs/gitops.md does).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from agent_saga import (
    ActionSemantics,
    ApprovalOutcome,
    Compensation,
    FileWAL,
    PreFlightGate,
    compensator,
    saga_scope,
)
from agent_saga.audit.redaction import redact_records, saga_seqs
from agent_saga.controls.policy import PolicyInForce, StaticPolicySource, parse_policy
from agent_saga.errors import GateBlocked
from agent_saga.review import policy_set, recorded_calls, replay_calls
from agent_saga.review._calls import Unevaluable
from agent_saga.wal.readers import FileLogReader

C, R, IRR = ActionSemantics.COMPENSABLE, ActionSemantics.REVERSIBLE, ActionSemantics.IRREVERSIBLE

#: Every stage a policy has: undeclared tools, tightened semantics, requireApproval, a
#: policy argument taken by a nested path, rules on it, on a tag and on a tool glob.
POLICY: dict[str, Any] = {
    "undeclaredTools": "Refuse",
    "tools": {
        "charge": {"semantics": "COMPENSABLE", "compensate": {"handler": "replay-test.refund", "args": {"id": "$.id"}},
                   "policyArgs": {"amount": "$.order.lines[0].amount"}},
        "search": {"semantics": "REVERSIBLE"},
        "export": {"semantics": "IRREVERSIBLE"},
        "wire": {"semantics": "COMPENSABLE", "compensate": {"handler": "replay-test.refund", "args": {"id": "$.id"}},
                 "requireApproval": True},
    },
    "rules": [
        {"name": "big", "argExceeds": {"arg": "amount", "threshold": 1000}, "verdict": "RequireApproval"},
        {"name": "huge", "argExceeds": {"arg": "amount", "threshold": 50000}, "verdict": "Block"},
        {"name": "eu-paused", "tagged": "eu", "verdict": "Block", "reason": "EU is paused"},
    ],
}


@compensator("replay-test.refund")
def _refund(id: str) -> None:  # noqa: A002 - the policy's argument name
    return None


class Approver:
    """Approves every other question (a denial is still REQUIRE_APPROVAL in the log)."""

    def __init__(self) -> None:
        self.n = 0

    async def request_approval(self, request: Any, verdict: Any) -> ApprovalOutcome:
        self.n += 1
        return ApprovalOutcome(self.n % 2 == 1, "risk@corp", "")


def order(amount: Any) -> dict[str, Any]:
    return {"order": {"lines": [{"amount": amount}]}}


#: (tool, code semantics, policy_args, tags): what the agent tries, saga by saga.
CALLS: list[tuple[str, ActionSemantics, dict[str, Any], tuple[str, ...]]] = [
    ("charge", C, order(10), ()),
    ("charge", C, order(5000), ()),
    ("charge", C, order(90000), ()),
    ("charge", C, {"order": {"lines": []}}, ()),          # the nested path is missing: refused
    ("charge", C, order("ten"), ()),                       # a rule cannot read it: refused
    ("charge", C, order(10), ("eu",)),                     # tagged
    ("search", R, {}, ()),
    ("search", C, {}, ()),                                 # the code is stricter than the policy
    ("export", R, {}, ()),                                 # tightened to IRREVERSIBLE: a human
    ("wire", C, {}, ()),
    ("wire", C, {}, ()),
    ("crm.update", R, {}, ()),                             # undeclared: refused
]


async def record(path: Path, policy: dict[str, Any] | None = POLICY, agent: str = "payments-agent") -> list[str]:
    """Drive CALLS through a real gate (one saga each) into a FileWAL at ``path``."""
    source = None if policy is None else StaticPolicySource(
        [PolicyInForce("ns/p", parse_policy(policy))], agent=agent)
    gate = PreFlightGate(policy=source, approval_provider=Approver(), checks=())
    wal = FileWAL(path)
    for tool, sem, args, tags in CALLS:
        try:
            async with saga_scope(wal, gate, name="s", tags=tags) as saga:
                comp = (lambda r: Compensation(handler="replay-test.refund", kwargs={"id": "x"})) if sem is C else None
                await saga.execute(tool, sem, lambda: {"id": "x"}, compensate=comp, policy_args=args)
        except GateBlocked:
            pass
    await wal.barrier()
    wal.close()
    return [r.payload["verdict"] for r in FileLogReader(str(path)).records() if r.type == "GATE_VERDICT"]


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Any:
    """The CLI's own ``main`` in this process (a process each costs the suite seconds)."""
    from agent_saga.cli import main

    def run(*args: str, key: str | None = None) -> subprocess.CompletedProcess[str]:
        monkeypatch.delenv("AGENT_SAGA_WAL_KEY_FILE", raising=False)
        if key is None:
            monkeypatch.delenv("AGENT_SAGA_WAL_KEY", raising=False)
        else:
            monkeypatch.setenv("AGENT_SAGA_WAL_KEY", key)
        code = main(list(args))
        out = capsys.readouterr()
        return subprocess.CompletedProcess(list(args), code, out.out, out.err)

    return run


def write_policy(path: Path, doc: dict[str, Any]) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


@pytest.fixture
def log(tmp_path: Path) -> Path:
    import asyncio

    p = tmp_path / "agent-saga.wal"
    asyncio.run(record(p))
    return p


async def test_replay_agrees_with_the_live_gate_call_for_call(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    live = await record(p)
    assert len(live) == len(CALLS) and {"ALLOW", "REQUIRE_APPROVAL", "BLOCK"} <= set(live)
    pset = policy_set([PolicyInForce("ns/p", parse_policy(POLICY))], "payments-agent")
    replayed = list(replay_calls(recorded_calls(FileLogReader(str(p)).records()), None, pset))
    assert not [c for c in replayed if isinstance(c, Unevaluable)]
    assert [c.proposed for c in replayed] == live  # type: ignore[union-attr]


async def test_with_no_policy_replay_agrees_with_a_gate_that_has_none(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    live = await record(p, policy=None)
    replayed = list(replay_calls(recorded_calls(FileLogReader(str(p)).records()), None, None))
    assert [c.current for c in replayed] == live == [c.proposed for c in replayed]  # type: ignore[union-attr]


def test_exit_0_when_no_recorded_call_changes_its_verdict(log: Path, tmp_path: Path, cli: Any) -> None:
    pol = write_policy(tmp_path / "p.json", POLICY)
    r = cli("policy", "replay", pol, "--current", pol, "--wal-path", str(log), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["calls"] == len(CALLS) and doc["stricter"] == doc["looser"] == 0 and "charge" in doc["by_tool"]


def test_exit_1_when_calls_become_stricter_and_none_looser(log: Path, tmp_path: Path, cli: Any) -> None:
    cur = write_policy(tmp_path / "cur.json", POLICY)
    tighter = json.loads(json.dumps(POLICY))
    tighter["tools"]["search"]["requireApproval"] = True
    new = write_policy(tmp_path / "new.json", tighter)
    r = cli("policy", "replay", new, "--current", cur, "--wal-path", str(log), "--json")
    assert r.returncode == 1, r.stderr
    doc = json.loads(r.stdout)
    assert doc["stricter"] == 2 and doc["looser"] == 0
    search = doc["by_tool"]["search"]
    assert search["current"]["ALLOW"] == 2 and search["proposed"]["REQUIRE_APPROVAL"] == 2
    assert len(search["examples"]["stricter"]) == 2 and search["examples"]["stricter"][0]["saga"].startswith("s-")


def test_exit_3_when_any_call_becomes_looser(log: Path, tmp_path: Path, cli: Any) -> None:
    cur = write_policy(tmp_path / "cur.json", POLICY)
    looser = json.loads(json.dumps(POLICY))
    looser["undeclaredTools"] = "Allow"
    looser["tools"]["search"]["requireApproval"] = True
    new = write_policy(tmp_path / "new.json", looser)
    r = cli("policy", "replay", new, "--current", cur, "--wal-path", str(log), "--json")
    assert r.returncode == 3, r.stderr
    doc = json.loads(r.stdout)
    assert doc["looser"] == 1 and doc["stricter"] == 2
    assert doc["by_tool"]["crm.update"]["changes"] == {"BLOCK -> ALLOW": 1}
    md = cli("policy", "replay", new, "--current", cur, "--wal-path", str(log), "--markdown")
    assert md.returncode == 3 and "| `crm.update` :warning: | 1 |" in md.stdout


def test_exit_2_for_a_bad_policy_naming_the_field(log: Path, tmp_path: Path, cli: Any) -> None:
    bad = write_policy(tmp_path / "bad.json", {"tools": {"charge": {"semantics": "COMPENSABLE"}}})
    r = cli("policy", "replay", bad, "--wal-path", str(log))
    assert r.returncode == 2 and "tools.charge.compensate" in r.stderr


def test_exit_2_for_a_bad_log_or_option(log: Path, tmp_path: Path, cli: Any) -> None:
    pol = write_policy(tmp_path / "p.json", POLICY)
    r = cli("policy", "replay", pol, "--wal-path", str(tmp_path / "missing.wal"))
    assert r.returncode == 2 and "missing.wal" in r.stderr
    r = cli("policy", "replay", pol, "--wal-path", str(log), "--since", "soon")
    assert r.returncode == 2 and "--since" in r.stderr
    (tmp_path / "torn.wal").write_text("{not json\n" * 2)
    r = cli("policy", "replay", pol, "--wal-path", str(tmp_path / "torn.wal"))
    assert r.returncode == 2 and "torn.wal" in r.stderr


def test_a_rule_on_a_nested_path_changes_only_the_calls_it_reads(log: Path, tmp_path: Path, cli: Any) -> None:
    cur = write_policy(tmp_path / "cur.json", POLICY)
    lower = json.loads(json.dumps(POLICY))
    lower["rules"][0]["argExceeds"]["threshold"] = 1  # $.order.lines[0].amount of 10 now asks a human
    new = write_policy(tmp_path / "new.json", lower)
    doc = json.loads(cli("policy", "replay", new, "--current", cur, "--wal-path", str(log), "--json").stdout)
    assert doc["by_tool"]["charge"]["changes"] == {"ALLOW -> REQUIRE_APPROVAL": 1}  # the eu one is blocked anyway
    assert doc["stricter"] == 1


def test_a_rule_on_a_tag_changes_only_the_tagged_sagas(log: Path, tmp_path: Path, cli: Any) -> None:
    cur = write_policy(tmp_path / "cur.json", POLICY)
    lifted = json.loads(json.dumps(POLICY))
    lifted["rules"] = [r for r in lifted["rules"] if r["name"] != "eu-paused"]
    new = write_policy(tmp_path / "new.json", lifted)
    r = cli("policy", "replay", new, "--current", cur, "--wal-path", str(log), "--json")
    doc = json.loads(r.stdout)
    assert r.returncode == 3 and doc["looser"] == 1
    assert doc["by_tool"]["charge"]["changes"] == {"BLOCK -> ALLOW": 1}


def test_applies_to_is_matched_against_the_agent_named(log: Path, tmp_path: Path, cli: Any) -> None:
    scoped = write_policy(tmp_path / "scoped.json", {**POLICY, "appliesTo": {"agents": ["payments-*"]}})
    r = cli("policy", "replay", scoped, "--wal-path", str(log), "--agent", "payments-agent", "--json")
    assert r.returncode == 1 and json.loads(r.stdout)["stricter"] > 0  # from no policy: stricter
    r = cli("policy", "replay", scoped, "--wal-path", str(log), "--agent", "crm-agent", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["stricter"] == 0  # it does not govern crm-agent
    r = cli("policy", "replay", scoped, "--wal-path", str(log))
    assert r.returncode == 2 and "--agent" in r.stderr


def test_a_redacted_record_is_counted_and_named_not_skipped(log: Path, tmp_path: Path, cli: Any) -> None:
    saga = next(r.saga for r in FileLogReader(str(log)).records() if r.type == "STEP_INTENT")
    redact_records(log, saga_seqs(log, saga), reason="TICKET-1")
    pol = write_policy(tmp_path / "p.json", POLICY)
    r = cli("policy", "replay", pol, "--wal-path", str(log), "--json")
    doc = json.loads(r.stdout)
    assert doc["calls"] == len(CALLS) and doc["evaluated"] == len(CALLS) - 1
    assert doc["unevaluable"]["redacted"]["count"] == 1
    assert doc["unevaluable"]["redacted"]["examples"][0]["saga"] == saga
    text = cli("policy", "replay", pol, "--wal-path", str(log)).stdout
    assert "NOT REPLAYED: 1 redacted" in text and saga in text


async def test_an_encrypted_log_replays_with_the_key_and_is_named_without_it(tmp_path: Path, cli: Any) -> None:
    from agent_saga.audit import EncryptedWAL, encryptor_from_env, new_wal_key

    key = new_wal_key()
    p = tmp_path / "enc.wal"
    gate = PreFlightGate(policy=None, approval_provider=Approver(), checks=())
    wal = EncryptedWAL(FileWAL(p), encryptor_from_env({"AGENT_SAGA_WAL_KEY": key}))
    for tool, sem, args, tags in CALLS[:3]:
        async with saga_scope(wal, gate, name="s", tags=tags) as saga:
            comp = (lambda r: Compensation(handler="replay-test.refund", kwargs={"id": "x"})) if sem is C else None
            await saga.execute(tool, sem, lambda: {"id": "x"}, compensate=comp, policy_args=args)
    await wal.barrier()
    wal.close()
    pol = write_policy(tmp_path / "p.json", POLICY)
    with_key = cli("policy", "replay", pol, "--wal-path", str(p), "--json", key=key)
    doc = json.loads(with_key.stdout)
    assert with_key.returncode == 1 and doc["evaluated"] == 3 and doc["unevaluable"] == {}
    assert doc["by_tool"]["charge"]["proposed"] == {"ALLOW": 1, "REQUIRE_APPROVAL": 1, "BLOCK": 1}
    without = cli("policy", "replay", pol, "--wal-path", str(p), "--json")
    doc = json.loads(without.stdout)
    assert without.returncode == 0 and doc["evaluated"] == 0 and doc["unevaluable"]["encrypted"]["count"] == 3
