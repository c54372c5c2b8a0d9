"""A signed checkpoint of a RedisWAL stream pins every record it signed: entries deleted
from the stream and explained away by a compaction attestation forged after the
checkpoint are refused by the real ``agent-saga verify-checkpoint --wal-url``."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from agent_saga.records import Record
from agent_saga.wal.redis import RedisLog, RedisWAL
from fixtures.cli import cli
from fixtures.forgery import forge_deletion
from fixtures.redis_server import client_for, tagged


def test_redis_stream_deletion_behind_a_forged_attestation_is_caught(fresh_redis: Any, tmp_path: Path) -> None:
    key = tagged(f"t-{uuid.uuid4().hex[:8]}:wal")
    url = f"{fresh_redis.url}?key={key}"
    wal = RedisWAL(fresh_redis.url, key=key, writer="pod-1")
    wal.append("SAGA_STARTED", "pay-1", None, {"name": "pay"})  # 1
    wal.append("APPROVAL_DECIDED", "pay-1", "pay-1/0", {"decision": "deny", "by": "cfo@corp"})  # 2
    wal.append("SAGA_STARTED", "xfer-9", None, {"name": "transfer"})  # 3
    wal.append("STEP_INTENT", "xfer-9", "xfer-9/0", {"tool": "wire", "semantics": "COMPENSABLE"})  # 4
    wal.append("STEP_COMMITTED", "xfer-9", "xfer-9/0", {"result": {"id": "w-1"}})  # 5
    wal.append("SAGA_STARTED", "ok-1", None, {})  # 6
    wal.barrier_sync()
    wal.close()
    keyfile = tmp_path / "cp.key"
    assert cli("keygen", "checkpoint", "--out", str(keyfile)).returncode == 0
    cpf = tmp_path / "cp.json"
    r = cli("checkpoint", "--wal-url", url, "--key", str(keyfile), "--out", str(cpf))
    assert r.returncode == 0, r.stderr
    verify_cp = ("verify-checkpoint", "--wal-url", url, "--checkpoint", str(cpf), "--pubkey", f"{keyfile}.pub")
    assert cli(*verify_cp, "--strict").returncode == 0
    assert cli("certify", "--wal-url", url).returncode == 1  # xfer-9 is unresolved

    # The attack, on the stream itself: XDEL the denial and the unresolved saga, XADD a
    # forged attestation and a re-decided approval naming the same human.
    client = client_for(fresh_redis.url)
    try:
        log = RedisLog(client, key, "test")
        entries = [(eid, rec) for eid, _loc, rec in log.entries("pod-1")]
        recs = [rec for _eid, rec in entries if isinstance(rec, Record)]
        drop = {2, 3, 4, 5}
        _kept, lines = forge_deletion(
            recs, drop, [("APPROVAL_DECIDED", "pay-1", "pay-1/0", {"decision": "approve", "by": "cfo@corp"})]
        )
        stream = log.stream("pod-1")
        client.xdel(stream, *[eid for eid, rec in entries if rec.seq in drop])
        for line in lines:
            g = client.incrby(log.gseq_key, 1)
            client.xadd(stream, {"r": line[:-1]}, id=f"{g}-0")
    finally:
        client.close()
    assert cli("verify", "--wal-url", url).returncode == 0  # the chain alone is fooled...
    assert cli("certify", "--wal-url", url).returncode == 0  # ...and so is certify
    for extra in ((), ("--strict",)):
        r = cli(*verify_cp, *extra, "--json")
        assert r.returncode == 1, r.stdout + r.stderr
        reason = json.loads(r.stdout)["reason"]
        assert "the checkpoint signed 6" in reason and "gaps at 2..5" in reason, reason
        assert "compaction attested at seq 7, written after the checkpoint" in reason, reason
