"""What an agent with append rights on a RedisWAL can no longer do to the others, on a real
redis-server with the ACL users exactly as ``agent-saga acl`` prints them, the real CLI
(``verify``, ``certify``, ``recover``, ``wal quarantine``) and a real recoveryd:

- write into another identity's stream, or a service writer's (NOPERM), so a forged
  ``APPROVAL_DECIDED`` never lands in the victim's chain and its WAL goes on;
- forge a saga's completion in its own stream: recovery still refunds the victim's charge,
  certify does not call it intended, verify names the forger;
- have recovery call a handler with a credential reference it was never given: escalated
  (NOT_ALLOWED), never called;
- stop the fleet's recovery with one undecodable entry in its own stream: only its own
  sagas are held, the operator quarantines it and verify, certify and recover go on;
- and, on a FileWAL, a separately chained forged saga stamped with another ``writer`` is not
  a chain of its own: recovery halts on it as verify calls it broken.
"""

from __future__ import annotations

import json
import secrets
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from agent_saga import FileWAL, idempotency_key  # noqa: E402
from agent_saga.errors import ConfigurationError, WALError  # noqa: E402
from agent_saga.plane._acl import preload_scripts  # noqa: E402
from agent_saga.records import encode_line  # noqa: E402
from agent_saga.wal.file import iter_file_records  # noqa: E402
from agent_saga.wal.redis import RedisWAL  # noqa: E402
from fixtures.redis_server import RedisServer, client_for, tagged  # noqa: E402
from verified_support import Env, orphan_file, write_orphan  # noqa: E402

VICTIM, ATTACKER = "pay/victim", "pay/attacker"

STRIPE_SOURCE = '''
import json, os
from agent_saga import compensator

@compensator("stripe.refund")
def refund(charge_id, amount=None, credential_ref=None, idempotency_key=None):
    with open(os.environ["LEDGER_CALLS"], "a") as f:
        f.write(json.dumps({"charge_id": charge_id, "amount": amount, "credential_ref": credential_ref}) + "\\n")
'''


class Fleet:
    """A RedisWAL key on a fresh server, ACL users made from the real CLI's output, and the
    URLs recovery (the server's default user) and the CLI use."""

    def __init__(self, env: Env, server: RedisServer) -> None:
        self.env, self.server = env, server
        self.key = tagged(f"walid-{secrets.token_hex(3)}")
        self.password = secrets.token_hex(12)
        self.names: list[str] = []
        self.admin = client_for(server.url)
        preload_scripts(self.admin)  # what the operator does at start: agents only EVALSHA
        self.urls = {ident: self.user("agent", "--agent", ident) for ident in (VICTIM, ATTACKER)}
        self.operator = self.user("operator")

    def user(self, role: str, *args: str) -> str:
        name = f"{role}-{secrets.token_hex(3)}"
        r = self.env.cli("acl", role, "--user", name, *args, "--wal-key", self.key)
        assert r.returncode == 0, r.stderr
        argv = shlex.split(r.stdout)
        assert self.admin.execute_command(*argv, f">{self.password}") in (b"OK", "OK", True)
        self.names.append(name)
        return self.server.url.replace("://", f"://{name}:{self.password}@", 1)

    def wal(self, ident: str) -> RedisWAL:
        return RedisWAL(self.urls[ident], key=self.key, identity=ident)

    def log_url(self, url: str | None = None) -> str:
        return f"{url or self.server.url}?key={self.key}"

    def recover(self, *args: str) -> Any:
        return self.env.recover("--wal-url", self.log_url(), "--redis-url", self.server.url,
                                "--namespace", f"ns-{self.key.strip('{}')}", *args)

    def close(self) -> None:
        for n in self.names:
            self.admin.execute_command("ACL", "DELUSER", n)
        self.admin.close()


@pytest.fixture
def env(tmp_path: Path) -> Env:
    e = Env(tmp_path)
    (tmp_path / "stripe_handlers.py").write_text(STRIPE_SOURCE)
    return e


@pytest.fixture
def fleet(env: Env, fresh_redis: RedisServer) -> Iterator[Fleet]:
    f = Fleet(env, fresh_redis)
    yield f
    f.close()


def test_an_agent_appends_only_to_its_own_identitys_streams(fleet: Fleet) -> None:
    import redis

    victim = fleet.wal(VICTIM)
    victim.barrier_sync(victim.append("SAGA_STARTED", "s-v", None, {"name": "payout", "tags": []}))
    attacker = client_for(fleet.urls[ATTACKER])
    g = attacker.incrby(f"{fleet.key}:gseq", 1)
    # Row: a forged, correctly chained APPROVAL_DECIDED XADDed into the victim's stream.
    forged = victim._log.tail(victim.writer)[1][1]
    assert not isinstance(forged, Exception)
    forged.type, forged.seq, forged.extra = "APPROVAL_DECIDED", forged.seq + 1, {}
    for stream in (f"{fleet.key}:w:{victim.writer}", f"{fleet.key}:w:{VICTIM}", f"{fleet.key}:w:recoveryd-0"):
        with pytest.raises(redis.exceptions.NoPermissionError):
            attacker.xadd(stream, {"r": encode_line(forged)}, id=f"{g}-0")
    # ... nor through the append script, under the victim's writer id.
    with pytest.raises(ConfigurationError, match="not a writer of identity"):
        RedisWAL(fleet.urls[ATTACKER], key=fleet.key, identity=ATTACKER, writer=VICTIM)
    stolen = RedisWAL(fleet.urls[ATTACKER], key=fleet.key, writer=f"{VICTIM}@stolen")
    with pytest.raises(WALError, match="can't access at least one of the keys"):
        stolen.barrier_sync(stolen.append("APPROVAL_DECIDED", "s-v", None, {"decision": "Approved"}))
    with pytest.raises(WALError, match="failed before close"):
        stolen.close()
    # The victim's WAL goes on (nothing fenced it), and its own writes pass.
    victim.barrier_sync(victim.append("SAGA_COMPLETED", "s-v", None, {"steps": 0}))
    assert victim.stats().failed is None
    mine = fleet.wal(ATTACKER)
    mine.barrier_sync(mine.append("SAGA_STARTED", "s-a", None, {"name": "x", "tags": []}))
    for w in (victim, mine):
        w.close()
    r = fleet.env.cli("verify", "--wal-url", fleet.log_url())
    assert r.returncode == 0, r.stdout + r.stderr
    attacker.close()


def test_a_forged_completion_of_another_agents_saga_changes_nothing(fleet: Fleet) -> None:
    victim = fleet.wal(VICTIM)
    write_orphan(victim, "s-v", "ch_victim")
    victim.close()
    forger = fleet.wal(ATTACKER)
    forger.barrier_sync(forger.append("SAGA_COMPLETED", "s-v", None, {"steps": 1}))  # chained in its own stream
    forger.close()

    r = fleet.env.cli("verify", "--wal-url", fleet.log_url())
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"writer {forger.writer}: FOREIGN: 1 record(s) of 1 saga(s) it does not own" in r.stdout
    assert f"owned by writer {victim.writer}" in r.stdout

    r = fleet.env.cli("certify", "--wal-url", fleet.log_url())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "UNACCOUNTED  saga s-v step s-v/0" in r.stdout and "intended" not in r.stdout
    assert f"IGNORED      writer {forger.writer}: 1 record(s) of sagas it does not own" in r.stdout

    r = fleet.env.cli("inspect", "--wal-url", fleet.log_url())
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"note: ignored writer {forger.writer}: 1 record(s) of sagas it does not own" in r.stdout + r.stderr

    r = fleet.recover()
    assert r.returncode == 1, r.stdout + r.stderr  # a forgery needs a human
    assert [c["charge_id"] for c in fleet.env.calls()] == ["ch_victim"]
    assert "s-v" in r.stdout and "ROLLED_BACK" in r.stdout
    assert f"writer {forger.writer}: 1 record(s) of sagas it does not own" in r.stdout


def _orphan_with_ref(wal: RedisWAL, saga_id: str, kwargs: dict[str, Any]) -> None:
    step = f"{saga_id}/0"
    wal.append("SAGA_STARTED", saga_id, None, {"name": "refund", "tags": []})
    wal.append("SAGA_LEASE", saga_id, None, {"lease_seconds": 0.001})
    wal.append("STEP_INTENT", saga_id, step, {"tool": "stripe.charge", "semantics": "COMPENSABLE",
                                              "policy_args": {}, "idempotency_key": idempotency_key(saga_id, step, "forward")})
    wal.append("STEP_COMMITTED", saga_id, step, {"tool": "stripe.charge", "semantics": "COMPENSABLE", "compensation": {
        "handler": "stripe.refund", "kwargs": kwargs, "description": "refund"}})
    wal.barrier_sync()


@pytest.mark.parametrize("allow_list", [True, False], ids=["allow-list", "no-allow-list"])
def test_recoveryd_runs_a_compensation_only_with_its_writers_handler_and_credential_ref(
        fleet: Fleet, allow_list: bool) -> None:
    victim, attacker = fleet.wal(VICTIM), fleet.wal(ATTACKER)
    _orphan_with_ref(victim, "s-v", {"charge_id": "ch_v", "amount": 100, "credential_ref": "stripe_payments"})
    # Row: a forged orphan asking recovery to refund the attacker with an admin credential.
    _orphan_with_ref(attacker, "s-a", {"charge_id": "ch_ATTACKER", "amount": 999999,
                                       "credential_ref": "stripe_prod_admin"})
    for w in (victim, attacker):
        w.close()
    allow = ["--allow", f"{VICTIM}@* stripe.refund stripe_payments", "--allow", "pay/* stripe.refund"] if allow_list else []
    ns = f"ns-{fleet.key.strip('{}')}"
    r = fleet.env.recoveryd_once("--wal-url", fleet.log_url(), "--redis-url", fleet.server.url, "--namespace", ns,
                                 "--imports", "stripe_handlers", *allow)
    assert r.returncode == 1, r.stdout + r.stderr  # escalations: a human is needed
    calls = fleet.env.calls()
    assert all(c["charge_id"] != "ch_ATTACKER" for c in calls), calls
    assert calls == ([{"charge_id": "ch_v", "amount": 100, "credential_ref": "stripe_payments"}] if allow_list else [])
    q = fleet.env.cli("recover", "--wal-url", fleet.log_url(), "--redis-url", fleet.server.url, "--namespace", ns,
                      "--escalations", "--json")
    escalations = {e["saga_id"]: e for e in json.loads(q.stdout)}
    esc = escalations["s-a"]
    assert esc["escalation_kind"] == "NOT_ALLOWED"
    assert f"writer '{attacker.writer}' may not run 'stripe.refund' with credential_ref 'stripe_prod_admin'" in esc["reason"]
    assert esc["compensation"]["kwargs"]["charge_id"] == "ch_ATTACKER"  # the human sees what was asked
    assert ("s-v" in escalations) is not allow_list
    if not allow_list:
        assert "no recovery allow-list is configured" in escalations["s-v"]["reason"]


def test_a_poisoned_entry_holds_only_its_writers_sagas_until_quarantined(fleet: Fleet) -> None:
    victim, attacker = fleet.wal(VICTIM), fleet.wal(ATTACKER)
    write_orphan(victim, "s-v", "ch_victim")
    write_orphan(attacker, "s-a", "ch_a")
    for w in (victim, attacker):
        w.close()
    # Row: one undecodable entry in the attacker's own stream, inside the log's gseq range.
    raw = client_for(fleet.urls[ATTACKER])
    g = raw.incrby(f"{fleet.key}:gseq", 1)
    raw.xadd(f"{fleet.key}:w:{attacker.writer}", {"r": "{not json"}, id=f"{g}-0")
    raw.close()

    r = fleet.env.cli("verify", "--wal-url", fleet.log_url())
    assert r.returncode == 1, r.stdout + r.stderr
    out = dict(line.split(": ", 1) for line in r.stdout.splitlines() if line.startswith("writer "))
    assert "not valid JSON" in out[f"writer {attacker.writer}"]
    assert "intact" in out[f"writer {victim.writer}"].lower() or "ok" in out[f"writer {victim.writer}"].lower()

    r = fleet.env.cli("certify", "--wal-url", fleet.log_url())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the log failed verification" not in r.stdout
    assert f"NOT CERTIFIED writer {attacker.writer}: BROKEN" in r.stdout
    assert "UNACCOUNTED  saga s-v step s-v/0" in r.stdout  # the others are still classified

    r = fleet.env.recoveryd_once("--wal-url", fleet.log_url(), "--redis-url", fleet.server.url,
                                 "--namespace", f"ns-{fleet.key.strip('{}')}")
    assert r.returncode == 1, r.stdout + r.stderr  # the broken writer's sagas wait for a human
    assert "HALTED" not in r.stdout
    assert [c["charge_id"] for c in fleet.env.calls()] == ["ch_victim"]
    assert f"1 orphan(s) of writers recovery does not act on were left alone: writer {attacker.writer}: BROKEN" \
        in r.stdout

    # The operator quarantines it (an agent credential cannot), recorded; everyone goes on.
    q = ["wal", "quarantine", "--writer", attacker.writer, "--by", "oncall@corp", "--reason", "INC-7 poisoned entry"]
    denied = fleet.env.cli(*q, "--wal-url", fleet.log_url(fleet.urls[ATTACKER]))
    assert denied.returncode != 0 and "quarantined writer" not in denied.stdout
    ok = fleet.env.cli(*q, "--wal-url", fleet.log_url(fleet.operator))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    journal = fleet.admin.xrange(f"{fleet.key}:quarantine:journal")
    assert [json.loads(e[b"e"])["by"] for _id, e in journal] == ["oncall@corp"]

    r = fleet.env.cli("verify", "--wal-url", fleet.log_url())
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"writer {attacker.writer}: QUARANTINED by oncall@corp (INC-7 poisoned entry)" in r.stdout
    r = fleet.env.cli("certify", "--wal-url", fleet.log_url())
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SKIPPED      writer {attacker.writer}: QUARANTINED by oncall@corp" in r.stdout
    r = fleet.recover()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"writer {attacker.writer}: QUARANTINED by oncall@corp" in r.stdout
    assert [c["charge_id"] for c in fleet.env.calls()] == ["ch_victim"]


def test_a_file_line_stamped_with_another_writer_is_not_a_chain_of_its_own(env: Env, tmp_path: Path) -> None:
    wal = orphan_file(tmp_path / "a.wal", "s1", "ch_1")
    done = FileWAL(wal)
    done.barrier_sync(done.append("SAGA_ROLLED_BACK", "s1", None, {"steps": []}))  # s1 is settled
    done.close()
    # Row: a forged orphan chained on its own from genesis, each line stamped "writer".
    forged = orphan_file(tmp_path / "forged.wal", "s-forged", "ch_ATTACKER")
    with open(wal, "ab") as f:
        for _loc, rec in iter_file_records(forged):
            assert not isinstance(rec, Exception)
            rec.extra = {"writer": "other-writer"}
            f.write(encode_line(rec))
    assert env.cli("verify", "--wal-path", str(wal)).returncode == 1
    r = env.recover("--wal-path", str(wal))
    assert r.returncode == 2, r.stdout + r.stderr  # halted: nothing verify calls broken is acted on
    assert "fails verification" in r.stdout
    assert env.calls() == []


def test_a_quarantined_writers_sagas_are_left_alone_and_named(fleet: Fleet) -> None:
    attacker = fleet.wal(ATTACKER)
    write_orphan(attacker, "s-a", "ch_a")
    attacker.close()
    q = fleet.env.cli("wal", "quarantine", "--wal-url", fleet.log_url(fleet.operator), "--writer", attacker.writer,
                      "--by", "oncall@corp", "--reason", "INC-8: BROKEN: CONTESTED: reads like a verdict")
    assert q.returncode == 0, q.stdout + q.stderr
    listed = fleet.env.cli("wal", "quarantine", "--wal-url", fleet.log_url(), "--list", "--json")
    assert [(e["writer"], e["by"]) for e in json.loads(listed.stdout)] == [(attacker.writer, "oncall@corp")]
    # The verdict comes from what the sweep found, never from the text of a reason: a
    # quarantine is a decision already taken, whatever its reason says.
    r = fleet.recover()
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"writer {attacker.writer}: QUARANTINED by oncall@corp: INC-8: BROKEN" in r.stdout
    r = fleet.env.recoveryd_once("--wal-url", fleet.log_url(), "--redis-url", fleet.server.url,
                                 "--namespace", f"ns-{fleet.key.strip('{}')}")
    assert r.returncode == 0, r.stdout + r.stderr
    assert fleet.env.calls() == []
    lift = fleet.env.cli("wal", "quarantine", "--wal-url", fleet.log_url(fleet.operator), "--writer", attacker.writer,
                         "--by", "oncall@corp", "--reason", "cleared", "--lift")
    assert lift.returncode == 0, lift.stdout + lift.stderr
    r = fleet.recover()
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["charge_id"] for c in fleet.env.calls()] == ["ch_a"]
    actions = [json.loads(e[b"e"])["action"] for _id, e in fleet.admin.xrange(f"{fleet.key}:quarantine:journal")]
    assert actions == ["quarantine", "lift"]


def test_a_back_dated_start_and_completion_of_another_agents_saga_is_contested(fleet: Fleet) -> None:
    import time

    from agent_saga.chain import seal
    from agent_saga.records import GENESIS, Record

    raw = client_for(fleet.urls[ATTACKER])
    top = raw.incrby(f"{fleet.key}:gseq", 2)  # entry ids reserved before the victim writes
    victim = fleet.wal(VICTIM)
    write_orphan(victim, "s-v", "ch_victim")
    victim.close()
    # Row: the saga's start and completion, chained in the attacker's own stream under the
    # reserved (earlier) entry ids: read whole, they come before the victim's start.
    writer, prev, now = f"{ATTACKER}@backdated", GENESIS, int(time.time() * 1e6)
    for seq, (type_, payload) in enumerate([("SAGA_STARTED", {"name": "x", "tags": []}),
                                            ("SAGA_COMPLETED", {"steps": 1})], 1):
        rec = Record(type_, "s-v", None, payload, seq=seq, ts=now)
        canonical = seal(rec, prev)
        raw.xadd(f"{fleet.key}:w:{writer}", {"r": encode_line(rec, canonical)[:-1]}, id=f"{top - 2 + seq}-0")
        prev = rec.hash
    raw.sadd(f"{fleet.key}:writers", writer)
    raw.close()

    r = fleet.recover()
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"saga s-v: CONTESTED: resolved by writer {writer}'s records, then started by writer {victim.writer}" \
        in r.stdout
    assert fleet.env.calls() == []  # neither story is acted on: a human decides
    r = fleet.env.cli("certify", "--wal-url", fleet.log_url())
    assert r.returncode == 1, r.stdout + r.stderr
    assert "NOT CERTIFIED saga s-v: CONTESTED" in r.stdout and "intended" not in r.stdout
    assert fleet.env.cli("verify", "--wal-url", fleet.log_url()).returncode == 1
