"""A hand wider than ``concurrency``: more sagas held at once, no more compensations running.

``RecoveryDaemon(in_hand=N)`` holds up to N sagas (claimed, read, being resolved) so that
the same step of more sagas shares a request to the stores; their handler calls still run
``concurrency`` at a time. A saga waiting for a slot keeps its claim renewed, and checks
it again once it has the slot: one lost meanwhile stops it before its handler is called.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agent_saga import FileWAL, compensator
from agent_saga.errors import ConfigurationError
from agent_saga.recovery import FileClaimLock, RecoveryDaemon
from agent_saga.recovery.claims import Claim
from fixtures.polling import until_async
from recovery_support import FUTURE, append_orphan

RUNNING: set[str] = set()  # charge ids whose refund is running now
SEEN: list[tuple[str, int, int]] = []  # (charge id, refunds running, sagas in hand) at each start
STARTED: list[str] = []
HOLD: dict[str, asyncio.Event] = {}  # charge id -> the event its refund waits for, if any
DAEMON: list[RecoveryDaemon] = []  # the daemon under test (its hand is read by the refund)


@compensator("test.recovery.refund_counted")
async def refund_counted(charge_id: str, idempotency_key: str) -> str:
    STARTED.append(charge_id)
    RUNNING.add(charge_id)
    SEEN.append((charge_id, len(RUNNING), len(DAEMON[0]._in_hand) if DAEMON else 0))
    try:
        held = HOLD.get(charge_id)
        if held is not None:
            await held.wait()
        for _ in range(3):  # let the other workers run meanwhile
            await asyncio.sleep(0)
    finally:
        RUNNING.discard(charge_id)
    return "refunded"


def orphan(wal: FileWAL, saga_id: str) -> None:
    append_orphan(wal, saga_id, "test.recovery.refund_counted")


@pytest.fixture(autouse=True)
def _fresh() -> None:
    RUNNING.clear()
    SEEN.clear()
    STARTED.clear()
    HOLD.clear()
    DAEMON.clear()


async def test_sagas_in_hand_beyond_concurrency_compensate_one_slot_at_a_time(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "a.wal")
    for s in ("s1", "s2", "s3"):
        orphan(wal, s)
    d = RecoveryDaemon(wal, clock=FUTURE, concurrency=1, in_hand=3, compensation_timeout=None)
    DAEMON.append(d)
    try:
        rep = await d.sweep()
    finally:
        await d.close()
        wal.close()
    assert sorted((r.saga_id, r.status) for r in rep.results) == [
        ("s1", "ROLLED_BACK"), ("s2", "ROLLED_BACK"), ("s3", "ROLLED_BACK")]
    assert sorted(STARTED) == ["s1", "s2", "s3"], "each handler called once"
    assert max(running for _, running, _ in SEEN) == 1, "never two compensations at once with concurrency=1"
    assert SEEN[0][2] == 3, "the three sagas were held at once while the first compensated"


class RefusingLock(FileClaimLock):
    """A real file claim lock whose renewal reports a claim taken by another daemon once
    the first refund runs, for every saga whose refund has not started (as if it expired
    meanwhile)."""

    def __init__(self, directory: Path) -> None:
        super().__init__(directory)
        self.refused: list[str] = []

    async def renew(self, claim: Claim) -> bool:
        if STARTED and claim.name not in STARTED:
            self.refused.append(claim.name)
            return False
        return await super().renew(claim)


async def test_a_claim_lost_while_waiting_for_a_slot_stops_before_the_handler(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "b.wal")
    orphan(wal, "s1")
    orphan(wal, "s2")
    gate = asyncio.Event()
    HOLD["s1"] = HOLD["s2"] = gate  # whichever starts first holds the only slot
    lock = RefusingLock(tmp_path / "claims")
    d = RecoveryDaemon(wal, lock=lock, clock=FUTURE, concurrency=1, in_hand=2, claim_ttl=0.3,
                       compensation_timeout=None)
    try:
        sweep = asyncio.ensure_future(d.sweep())
        await until_async("the first refund started", lambda: len(STARTED) == 1)
        first = STARTED[0]
        other = "s2" if first == "s1" else "s1"
        await until_async("the waiting saga's claim was refused", lambda: other in lock.refused)
        gate.set()
        rep = await sweep
    finally:
        gate.set()
        await d.close()
        wal.close()
    statuses = {r.saga_id: r.status for r in rep.results}
    assert statuses == {first: "ROLLED_BACK", other: "CLAIM_LOST"}
    assert STARTED == [first], "the saga whose claim was lost while it waited never called its handler"


@pytest.mark.parametrize("in_hand", [0, 3, 2.5, True])
def test_in_hand_below_concurrency_or_not_a_number_is_refused(tmp_path: Path, in_hand: object) -> None:
    with pytest.raises(ConfigurationError, match="in_hand must be a whole number >= concurrency"):
        RecoveryDaemon(str(tmp_path / "c.wal"), concurrency=4, in_hand=in_hand)  # type: ignore[arg-type]


def test_recoveryd_holds_what_in_hand_says_and_refuses_less_than_concurrency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from agent_saga_recoveryd.app import Recoveryd
    from agent_saga_recoveryd.config import parse_args

    wal = str(tmp_path / "a.wal")
    app = Recoveryd(parse_args(["--wal-path", wal, "--concurrency", "2", "--in-hand", "8", "--metrics-port", "-1"]))
    app.build()
    assert [(d.concurrency, d.in_hand) for d in app.daemons] == [(2, 8)]
    assert parse_args(["--wal-path", wal, "--concurrency", "3"]).in_hand == 3  # default: one per slot
    with pytest.raises(SystemExit):
        parse_args(["--wal-path", wal, "--concurrency", "4", "--in-hand", "2"])
    assert "--in-hand must be >= --concurrency (4), got 2" in capsys.readouterr().err
