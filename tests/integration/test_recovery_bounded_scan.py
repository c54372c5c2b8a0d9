"""A daemon over a RedisWAL holds one page of records at a time and, per orphan, only where
its records are and the hashes it verified; it reads a claimed saga's records again and
acts only if they are the very records it verified: one edited after the scan (even
re-sealed so it verifies alone) halts it, one deleted is read as a whole log again."""

from __future__ import annotations

import gc
import json
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga import compensator
from agent_saga.chain import content_digest, header_hash
from agent_saga.records import Record, canonical_json, decode_line, encode_line
from agent_saga.recovery import RecoveryDaemon, RedisClaimLock, RedisLedger
from agent_saga.recovery.scan import LogScan
from agent_saga.wal.redis import RedisWAL

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from fixtures.redis_server import tagged  # noqa: E402
from verified_support import write_orphan  # noqa: E402

KEY = tagged("bounded:wal")
AGENT = "agent-1"
HANDLER = "test.bounded.refund"
CALLS: Counter[str] = Counter()
FUTURE = lambda: __import__("time").time() + 3600  # noqa: E731 - far past every lease
PAGE = 50


@compensator(HANDLER)
def refund(charge_id: str, idempotency_key: str) -> str:
    CALLS[charge_id] += 1
    return "refunded"


def write_orphans(url: str, n: int) -> None:
    """``n`` dead agents' sagas (4 records each: one committed charge, a lease run out)."""
    wal = RedisWAL(url, key=KEY, writer=AGENT, max_pending=1_000_000)
    try:
        for i in range(n):
            write_orphan(wal, f"s{i}", f"ch_{i}", handler=HANDLER, sync=False)
        wal.barrier_sync()
    finally:
        wal.close()


@pytest.fixture
def daemon(fresh_redis: Any) -> Iterator[tuple[RecoveryDaemon, Any]]:
    CALLS.clear()
    wal = RedisWAL(fresh_redis.url, key=KEY, writer="recovery-a")
    d = RecoveryDaemon(wal, ledger=RedisLedger(fresh_redis.url, namespace="bounded"),
                       lock=RedisClaimLock(fresh_redis.url, namespace="bounded"), clock=FUTURE,
                       daemon_id="a", compensation_timeout=None, concurrency=8)
    d.source.page_size = PAGE
    yield d, fresh_redis  # each test closes the daemon (in its own event loop)
    wal.close()


def live_records() -> int:
    return sum(1 for o in gc.get_objects() if type(o) is Record)


async def test_a_scan_holds_one_page_and_only_places_and_hashes_per_orphan(
    daemon: tuple[RecoveryDaemon, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    d, server = daemon
    n = 300  # 1,200 records: 24 pages
    write_orphans(server.url, n)
    assert d.source.rereads
    peak, pages = 0, 0
    real = LogScan.feed_all

    def feed_all(self: LogScan, records: Iterable[Record]) -> None:
        nonlocal peak, pages
        records = list(records)
        pages += 1
        assert len(records) <= PAGE
        peak = max(peak, live_records())
        real(self, records)

    monkeypatch.setattr(LogScan, "feed_all", feed_all)
    before = live_records()
    await d._refresh()
    assert pages >= (4 * n) // PAGE and len(d.scan.in_flight) == n
    # Decoded records alive at any page: the page fed and the reader's buffers, never the log.
    assert peak - before <= 3 * PAGE < 4 * n
    assert live_records() - before <= PAGE  # after the read: none of the scanned records is kept
    for view in d.scan.in_flight.values():
        assert view.records == [] and len(view.refs) == 4 * 44  # 4 records: gseq, writer, hash each
        assert [(w, len(h)) for w, _g, h in d.scan.places(view.refs)] == [(AGENT, 32)] * 4
    monkeypatch.setattr(LogScan, "feed_all", real)
    try:
        rep = await d.sweep()
    finally:
        await d.close()
    assert rep.ok and rep.recovered == n  # each read again and checked, then resolved
    assert CALLS == Counter({f"ch_{i}": 1 for i in range(n)})


def rewrite(server: Any, seq: int, edit: Any) -> None:
    """Replace the agent's record ``seq`` at the server, keeping its entry id."""
    client: Any = server.client()  # one server or a cluster, as the fixture runs
    stream = f"{KEY}:w:{AGENT}"
    entries = [(eid, f[b"r"]) for eid, f in client.xrange(stream)]
    i = next(i for i, (_e, line) in enumerate(entries) if json.loads(line)["seq"] == seq)
    entries[i] = (entries[i][0], edit(entries[i][1]))
    pipe = client.pipeline(transaction=True)
    pipe.delete(stream)
    for eid, line in entries:
        if line is not None:
            pipe.xadd(stream, {"r": line}, id=eid)
    pipe.execute()
    client.close()


def attacker(line: bytes, *, reseal: bool) -> bytes:
    rec = decode_line(line, "test")
    rec.payload["compensation"]["kwargs"]["charge_id"] = "ch_ATTACKER"  # type: ignore[index]
    if reseal:  # digest and header hash recomputed: the record verifies on its own
        rec.digest = content_digest(rec.salt or "", canonical_json(rec.payload))
        rec.hash = header_hash(rec)
    return encode_line(rec)


@pytest.mark.parametrize("reseal", [False, True], ids=["edited", "edited-and-resealed"])
async def test_a_record_changed_between_the_scan_and_the_re_read_halts_before_anything_is_called(
    daemon: tuple[RecoveryDaemon, Any], reseal: bool
) -> None:
    d, server = daemon
    write_orphans(server.url, 1)
    try:
        await d._refresh()  # scanned and verified
        assert "s0" in d.scan.in_flight
        rewrite(server, 4, lambda line: attacker(line, reseal=reseal))  # the STEP_COMMITTED
        rep = await d.sweep()
    finally:
        await d.close()
    assert rep.halted is not None and d.halted is not None
    assert "a record of saga s0 changed after recovery verified it" in rep.halted
    reason = "its hash differs" if reseal else "payload does not match its digest"
    assert reason in rep.halted
    assert CALLS == Counter() and rep.recovered == 0


async def test_a_record_deleted_between_the_scan_and_the_re_read_is_not_acted_on_and_the_log_is_read_whole(
    daemon: tuple[RecoveryDaemon, Any],
) -> None:
    d, server = daemon
    write_orphans(server.url, 1)
    try:
        await d._refresh()
        rewrite(server, 3, lambda line: None)  # the STEP_INTENT, gone
        rep = await d.sweep()
    finally:
        await d.close()
    # Not acted on; the sweep's closing read is a whole one, which finds the gap unexplained.
    assert rep.error is not None and "a record of saga s0 is gone since recovery read it" in rep.error
    assert rep.halted is not None and "records 3 are missing and no compaction attestation accounts" in rep.halted
    assert CALLS == Counter() and rep.recovered == 0
