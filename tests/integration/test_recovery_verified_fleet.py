"""Recovery acts only on verified records, on every backend: logs edited at the server
(RedisWAL stream entries rewritten, PostgresWAL rows updated or deleted) stop the real
``agent-saga recover`` and a real ``agent-saga-recoveryd``, which stays up and unready."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from _wal_backends import WRITER, Harness, harness_for  # noqa: E402
from fixtures.readonly import make_writable, read_only_mount  # noqa: E402
from fixtures.redis_server import WAL_KEY, tagged  # noqa: E402
from verified_support import Env, Recoveryd, orphan_file, wait_for, write_orphan  # noqa: E402

COMMIT_SEQ = 4  # SAGA_STARTED, SAGA_LEASE, STEP_INTENT, STEP_COMMITTED
ENC_WAL = tagged("enc:wal")


@pytest.fixture
def env(tmp_path: Path) -> Env:
    return Env(tmp_path)


@pytest.fixture(params=["redis", "postgres"])
def server_log(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Harness]:
    with harness_for(request.param, request, tmp_path) as h:
        wal = h.open(writer=WRITER)
        try:
            write_orphan(wal, "s1", "ch_1")
        finally:
            wal.close()
        yield h


def recover_args(h: Harness, env: Env) -> list[str]:
    if h.name == "redis":
        server: Any = h.server  # type: ignore[attr-defined]
        return ["--wal-url", f"{server.url}?key={h.key}", "--redis-url", server.url,  # type: ignore[attr-defined]
                "--namespace", "ns-" + h.key.strip("{").replace("}", "")]  # type: ignore[attr-defined]
    return ["--wal-url", f"{h.dsn}?table=saga_wal",  # type: ignore[attr-defined]
            "--ledger", str(env.dir / "journal.jsonl"), "--claims", str(env.dir / "claims")]


def commit_payload(h: Harness) -> dict[str, Any]:
    rec = next(r for r in h.records() if r.seq == COMMIT_SEQ)
    assert rec.type == "STEP_COMMITTED"
    return json.loads(json.dumps(rec.payload))


def test_an_unedited_server_log_is_recovered_once(server_log: Harness, env: Env) -> None:
    r = env.recover(*recover_args(server_log, env))
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["charge_id"] for c in env.calls()] == ["ch_1"]


def test_kwargs_edited_at_the_server_halt_recovery_and_nothing_is_called(server_log: Harness, env: Env) -> None:
    payload = commit_payload(server_log)
    payload["compensation"]["kwargs"]["charge_id"] = "ch_ATTACKER"
    server_log.alter_payload(COMMIT_SEQ, payload)
    assert not server_log.verify().ok
    r = env.recover(*recover_args(server_log, env))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"record of saga s1 (writer {WRITER}, seq {COMMIT_SEQ}" in r.stdout and "type STEP_COMMITTED" in r.stdout
    assert "payload does not match its digest" in r.stdout
    assert env.calls() == []


def test_a_record_deleted_at_the_server_halts_recovery(server_log: Harness, env: Env) -> None:
    server_log.delete(2)
    r = env.recover(*recover_args(server_log, env))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "records 2 are missing and no compaction attestation accounts for them" in r.stdout
    assert env.calls() == []


def test_records_reordered_at_the_server_halt_recovery(server_log: Harness, env: Env) -> None:
    server_log.swap(3, COMMIT_SEQ)
    r = env.recover(*recover_args(server_log, env))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "fails verification" in r.stdout
    assert env.calls() == []


def test_a_line_that_cannot_be_decoded_at_the_server_halts_recovery(server_log: Harness, env: Env) -> None:
    server_log.corrupt(3)
    r = env.recover(*recover_args(server_log, env))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "HALTED" in r.stdout and "not valid JSON" in r.stdout
    assert env.calls() == []


# ------------------------------------------------------------------ recoveryd, a real process


def test_recoveryd_halts_on_a_tampered_log_and_stays_up_unready_naming_the_record(env: Env, fresh_redis: Any) -> None:
    wal = orphan_file(env.dir / "a.wal")
    wal.write_bytes(wal.read_bytes().replace(b'"charge_id":"ch_1"', b'"charge_id":"ch_ATTACKER"'))
    d = Recoveryd(env, "--wal-path", str(wal), "--redis-url", fresh_redis.url)
    try:
        status, body = wait_for(lambda: (s := d.get("/readyz"))[0] == 503 and "HALTED" in s[1] and s, "a halt on /readyz")
        assert f"{wal} line 4: record of saga s1 (seq 4, type STEP_COMMITTED) fails verification" in body
        assert "payload does not match its digest" in body
        assert d.metric("agent_saga_recovery_halted", str(wal)) == 1
        assert d.get("/livez")[0] == 200 and d.alive()
        assert env.calls() == []
    finally:
        d.stop()


def test_recoveryd_over_a_redis_log_edited_at_the_server_halts(env: Env, fresh_redis: Any) -> None:
    from agent_saga.wal.redis import RedisWAL

    wal = RedisWAL(fresh_redis.url, key=WAL_KEY, writer="agent-7")
    write_orphan(wal, "s1", "ch_1")
    wal.close()
    client = fresh_redis.client()
    stream = f"{WAL_KEY}:w:agent-7"
    entries = client.xrange(stream)
    client.delete(stream)
    for eid, fields in entries:  # the same entries, one of them edited
        client.xadd(stream, {"r": fields[b"r"].replace(b'"charge_id":"ch_1"', b'"charge_id":"ch_X"')}, id=eid)
    client.close()
    d = Recoveryd(env, "--wal-url", f"{fresh_redis.url}?key={WAL_KEY}", "--redis-url", fresh_redis.url)
    try:
        status, body = wait_for(lambda: (s := d.get("/readyz"))[0] == 503 and "HALTED" in s[1] and s, "a halt on /readyz")
        assert "record of saga s1 (writer agent-7, seq 4" in body and "payload does not match its digest" in body
        assert d.metric("agent_saga_recovery_halted") == 1 and d.alive()
        assert env.calls() == []
    finally:
        d.stop()


def test_recoveryd_on_a_read_only_log_stays_up_unready_then_recovers_once_writable(env: Env, fresh_redis: Any) -> None:
    orphan_file(env.dir / "data" / "a.wal")
    with read_only_mount(env.dir / "data") as ro:
        wal = ro / "a.wal"
        d = Recoveryd(env, "--wal-path", str(wal), "--redis-url", fresh_redis.url)
        try:
            status, body = wait_for(lambda: (s := d.get("/readyz"))[0] == 503 and "last sweep stopped" in s[1] and s,
                                    "recoveryd unready with the reason")
            assert f"recovery cannot write the log '{wal}': Read-only file system" in body
            assert d.metric("agent_saga_recovery_sweep_stopped", str(wal)) == 1
            assert d.metric("agent_saga_recovery_halted", str(wal)) == 0
            assert d.get("/livez")[0] == 200 and d.alive()
            assert env.calls() == []
            make_writable(ro)
            wait_for(lambda: d.get("/readyz")[0] == 200, "ready once the log is writable")
            wait_for(lambda: env.calls(), "the refund")
            assert d.metric("agent_saga_recovery_sweep_stopped", str(wal)) == 0
        finally:
            d.stop()
        assert d.proc.returncode == 0, d.output()
    assert [c["charge_id"] for c in env.calls()] == ["ch_1"]


def test_recover_reads_the_key_of_an_encrypted_fleet_log(env: Env, fresh_redis: Any) -> None:
    from agent_saga.audit import EncryptedWAL, new_wal_key
    from agent_saga.audit.encryption import AESGCMEncryptor, Keyring
    from agent_saga.wal.redis import RedisWAL

    key = new_wal_key("fleet-1")
    wal = EncryptedWAL(RedisWAL(fresh_redis.url, key=ENC_WAL, writer="agent-1"), AESGCMEncryptor(Keyring.parse(key)))
    write_orphan(wal, "s1", "ch_sealed")
    wal.close()
    args = ["--wal-url", f"{fresh_redis.url}?key={ENC_WAL}", "--redis-url", fresh_redis.url]
    r = env.recover(*args)
    assert r.returncode == 2 and "no key was given" in r.stdout, r.stdout + r.stderr
    assert env.calls() == []
    r = env.recover(*args, extra_env={"AGENT_SAGA_WAL_KEY": key})
    assert r.returncode == 0, r.stdout + r.stderr
    assert [c["charge_id"] for c in env.calls()] == ["ch_sealed"]
    # The daemon's own records went into the shared log encrypted, and verify without a key.
    r = env.cli("verify", "--wal-url", f"{fresh_redis.url}?key={ENC_WAL}")
    assert r.returncode == 0, r.stdout
    r = env.cli("certify", "--wal-url", f"{fresh_redis.url}?key={ENC_WAL}", extra_env={"AGENT_SAGA_WAL_KEY": key})
    assert r.returncode == 0 and "CERTIFIED" in r.stdout, r.stdout + r.stderr
