"""The durable step protocol: what is on disk when, misuse refused before the effect."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from agent_saga.compensation import Compensation
from agent_saga.errors import (
    CompensationError,
    ConfigurationError,
    NotSerializable,
    RollbackIncomplete,
    SecretDetected,
)
from agent_saga.executor import set_tool_executor_size, tool_executor_stats
from agent_saga.idempotency import idempotency_key
from agent_saga.rollback import RollbackOutcome
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics, coerce_semantics
from agent_saga.wal.file import FileWAL, iter_file_records
from engine_support import (
    Boom,
    of_type,
    payload,
    types,
    wal_fixture,  # noqa: F401 - provides the `wal` fixture
)

C = ActionSemantics.COMPENSABLE
R = ActionSemantics.REVERSIBLE


def lines_on_disk(path: str) -> list[dict]:
    with open(path, "rb") as f:
        return [json.loads(line) for line in f.read().splitlines()]


@pytest.mark.parametrize("sync", [True, False], ids=["sync-forward", "async-forward"])
async def test_intent_is_on_disk_before_the_forward_runs(wal, sync):
    seen: list[dict] = []

    def look() -> dict:
        (intent,) = [r for r in lines_on_disk(wal.path) if r["type"] == "STEP_INTENT"]
        seen.append(intent)
        return {"id": "ch_1"}

    async def alook() -> dict:
        return look()

    async with saga_scope(wal) as saga:
        out = await saga.execute(
            "stripe.charge", C, look if sync else alook,
            lambda r: Compensation(handler="stripe.refund", kwargs={"charge": r["id"]}),
            policy_args={"amount": 4200},
        )
        # The compensation descriptor is durable before execute returns.
        assert wal.stats().durable_seq >= of_type(wal, saga.saga_id, "STEP_COMMITTED")[0].seq
    assert out == {"id": "ch_1"}
    intent = seen[0]["payload"]
    assert intent == {
        "tool": "stripe.charge",
        "semantics": "COMPENSABLE",
        "policy_args": {"amount": 4200},
        "idempotency_key": idempotency_key(saga.saga_id, f"{saga.saga_id}/0", "forward"),
    }
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["compensation"] == {
        "handler": "stripe.refund", "kwargs": {"charge": "ch_1"}, "description": "",
    }


class Wedge:
    """Blocks the WAL flusher before fsync until released (a wedged disk)."""

    def __init__(self) -> None:
        self.release = threading.Event()

    def __call__(self, point: str) -> None:
        if point == "before_sync":
            self.release.wait(30)


async def test_reversible_steps_never_wait_for_the_disk(tmp_path: Path):
    wedge = Wedge()
    w = FileWAL(tmp_path / "w.wal", fault_hook=wedge)
    try:
        async with saga_scope(w) as saga:

            async def read_cache() -> str:
                return "hit"

            # The disk is wedged, and REVERSIBLE steps complete anyway.
            for _ in range(3):
                assert await asyncio.wait_for(saga.execute("cache.get", R, read_cache), 5) == "hit"
            durable = asyncio.ensure_future(
                saga.execute("db.write", C, read_cache, lambda r: Compensation(fn=lambda: None))
            )
            await asyncio.sleep(0.05)
            assert not durable.done()  # a durable step waits for the fence
            wedge.release.set()
            assert await asyncio.wait_for(durable, 10) == "hit"
    finally:
        wedge.release.set()
        w.close()


async def test_compensable_without_compensate_is_refused_before_the_forward(wal):
    calls: list[str] = []
    with pytest.raises(ConfigurationError, match="no compensate"):
        async with saga_scope(wal) as saga:
            await saga.execute("stripe.charge", C, lambda: calls.append("charged"))
    assert calls == []
    assert "STEP_INTENT" not in types(wal, saga.saga_id)


async def test_irreversible_with_a_compensation_is_a_misdeclaration(wal):
    with pytest.raises(ConfigurationError, match="declare it COMPENSABLE"):
        async with saga_scope(wal) as saga:
            await saga.execute("sms", "IRREVERSIBLE", lambda: 1, lambda r: Compensation(fn=print))


async def test_unknown_semantics_is_refused(wal):
    with pytest.raises(ConfigurationError, match="REVERSIBLE, COMPENSABLE, IRREVERSIBLE"):
        async with saga_scope(wal) as saga:
            await saga.execute("x", "UNDOABLE", lambda: 1)


async def test_a_failed_forward_is_recorded_and_propagates_unchanged(wal):
    original = Boom("card declined sk_live_abcdefghijkl1234")
    with pytest.raises(Boom) as info:
        async with saga_scope(wal) as saga:
            await saga.execute("stripe.charge", C, lambda: (_ for _ in ()).throw(original),
                               lambda r: Compensation(fn=print))
    assert info.value is original
    (failed,) = of_type(wal, saga.saga_id, "STEP_FAILED")
    assert payload(failed)["error_type"] == "Boom"
    assert "sk_live_" not in payload(failed)["message"]  # secrets are redacted from errors
    assert saga.rollback_report.steps == ()  # it did not complete: nothing to undo


@pytest.mark.parametrize(
    "factory",
    [
        lambda r: 1 / 0,
        lambda r: "not a compensation",
        lambda r: {"kwargs": {"no": "handler"}},
        lambda r: None,
    ],
    ids=["raises", "garbage", "bad-dict", "none-for-compensable"],
)

async def test_a_broken_factory_after_the_effect_escalates(wal, factory):
    with pytest.raises(RollbackIncomplete) as info:
        async with saga_scope(wal) as saga:
            await saga.execute("stripe.charge", C, lambda: {"id": "ch_1"}, factory)
    assert isinstance(info.value.__cause__, CompensationError)
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["compensation"] is None
    assert payload(committed)["compensation_error"]["error_type"] == "CompensationError"
    (step,) = info.value.report.steps
    assert step.outcome is RollbackOutcome.ESCALATED
    assert of_type(wal, saga.saga_id, "ESCALATED")


async def test_unserialisable_kwargs_name_the_key_path_and_still_undo_in_process(wal):
    import datetime

    undone: list[object] = []

    def refund(**kw: object) -> None:
        undone.append(kw["refund"])

    with pytest.raises(NotSerializable) as info:
        async with saga_scope(wal) as saga:
            await saga.execute(
                "stripe.charge", C, lambda: "ch_1",
                lambda r: Compensation(fn=refund, kwargs={"refund": {"at": datetime.datetime(2026, 1, 1)}}),
            )
    assert info.value.key == "kwargs['refund']['at']"
    assert "kwargs['refund']['at']" in str(info.value)
    # The effect happened and the inverse is runnable here: it ran (not replayable, so logged so).
    assert len(undone) == 1
    assert saga.rollback_report.clean
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["compensation"] is None
    assert payload(committed)["compensation_error"]["in_process"] is True


async def test_a_secret_in_kwargs_is_refused_and_never_written(wal):
    with pytest.raises(RollbackIncomplete) as info:
        async with saga_scope(wal) as saga:
            await saga.execute(
                "stripe.charge", C, lambda: "ch_1",
                lambda r: Compensation(handler="stripe.refund",
                                       kwargs={"charge": r, "api_key": "sk_live_51Habcdefghijklmnop"}),
            )
    # The charge happened; no stripe.refund handler is registered here, so it escalates.
    cause = info.value.__cause__
    assert isinstance(cause, SecretDetected)
    assert cause.key == "kwargs['api_key']"
    assert "sk_live_51H" not in Path(wal.path).read_text()


async def test_policy_args_are_checked_before_anything(wal):
    with pytest.raises(NotSerializable, match=r"policy_args\['amount'\]"):
        async with saga_scope(wal) as saga:
            await saga.execute("x", R, lambda: 1, policy_args={"amount": object()})
    with pytest.raises(SecretDetected):
        async with saga_scope(wal) as saga:
            await saga.execute("x", R, lambda: 1, policy_args={"password": "hunter2"})


async def test_policy_args_are_snapshotted(wal):
    args = {"amount": 10, "to": ["acct_1"]}
    async with saga_scope(wal) as saga:
        await saga.execute("x", R, lambda: 1, policy_args=args)
        args["to"].append("acct_evil")  # mutating afterwards cannot change the record
    (intent,) = of_type(wal, saga.saga_id, "STEP_INTENT")
    assert payload(intent)["policy_args"] == {"amount": 10, "to": ["acct_1"]}


async def test_the_dict_form_is_accepted(wal):
    async with saga_scope(wal) as saga:
        await saga.execute("charge", C, lambda: {"id": "ch_2"},
                           lambda r: {"handler": "refund", "kwargs": {"id": r["id"]}})
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["compensation"]["handler"] == "refund"


async def test_forward_receives_the_idempotency_key_when_it_asks(wal):
    keys: list[str] = []

    async def charge(idempotency_key: str) -> str:
        keys.append(idempotency_key)
        return "ok"

    def sync_charge(**kw: str) -> str:
        keys.append(kw["idempotency_key"])
        return "ok"

    async with saga_scope(wal, saga_id="checkout-402") as saga:
        await saga.execute("a", R, charge)
        await saga.execute("b", C, sync_charge, lambda r: Compensation(fn=print))
    assert keys == [
        idempotency_key("checkout-402", "checkout-402/0", "forward"),
        idempotency_key("checkout-402", "checkout-402/1", "forward"),
    ]


async def test_a_sync_callable_returning_an_awaitable_counts_as_async(wal):
    async def inner() -> int:
        return 7

    async with saga_scope(wal) as saga:
        assert await saga.execute("x", R, lambda: inner()) == 7


async def test_sync_forwards_run_on_the_bounded_executor_and_saturation_is_reported(wal, caplog):
    loop_thread = threading.get_ident()
    threads: set[int] = set()
    release = threading.Event()
    original_size = tool_executor_stats().max_workers
    set_tool_executor_size(1)
    try:
        before = tool_executor_stats()

        def blocking(i: int) -> int:
            threads.add(threading.get_ident())
            release.wait(10)
            return i

        with caplog.at_level("WARNING", logger="agent_saga.executor"):
            async with saga_scope(wal) as saga:
                steps = [
                    asyncio.ensure_future(saga.execute(f"t{i}", R, lambda i=i: blocking(i)))
                    for i in range(3)
                ]
                for _ in range(200):
                    if tool_executor_stats().queued == 2:
                        break
                    await asyncio.sleep(0.005)
                during = tool_executor_stats()
                release.set()
                assert sorted(await asyncio.gather(*steps)) == [0, 1, 2]
        assert loop_thread not in threads and len(threads) == 1
        assert during.max_workers == 1 and during.active == 1 and during.queued == 2
        after = tool_executor_stats()
        assert after.saturated_count == before.saturated_count + 1
        assert after.peak_queued >= 2
        assert [r for r in caplog.records if "saturated" in r.getMessage()]
    finally:
        release.set()
        set_tool_executor_size(original_size)


async def test_ids_are_validated(wal):
    with pytest.raises(ConfigurationError, match="saga_id"):
        saga_scope(wal, saga_id="has space")
    with pytest.raises(ConfigurationError, match="saga name"):
        saga_scope(wal, name="bad name")
    async with saga_scope(wal, name="checkout") as saga:
        assert saga.saga_id.startswith("checkout-") and len(saga.saga_id) == len("checkout-") + 12


async def test_cancelled_while_the_intent_is_being_made_durable_never_calls_forward(tmp_path: Path):
    wedge = Wedge()
    w = FileWAL(tmp_path / "w.wal", fault_hook=wedge)
    calls: list[str] = []
    try:
        async def agent() -> None:
            async with saga_scope(w) as saga:
                await saga.execute("db.write", C, lambda: calls.append("x"), lambda r: Compensation(fn=print))

        task = asyncio.create_task(agent())
        await asyncio.sleep(0.05)  # blocked on the intent's fence: the disk is wedged
        task.cancel()
        wedge.release.set()
        with pytest.raises(asyncio.CancelledError):
            await task
    finally:
        wedge.release.set()
        w.close()
    assert calls == []
    recs = [r for _, r in iter_file_records(w.path)]
    (failed,) = [r for r in recs if r.type == "STEP_FAILED"]
    assert failed.payload is not None and failed.payload["started"] is False
    assert recs[-1].type == "SAGA_ROLLED_BACK"


def test_semantics_accept_their_names():
    assert coerce_semantics(" compensable") is C
    assert coerce_semantics("REVERSIBLE") is R
    assert coerce_semantics(ActionSemantics.IRREVERSIBLE) is ActionSemantics.IRREVERSIBLE
    assert ActionSemantics.COMPENSABLE == "COMPENSABLE"
    for bad in ("", "UNDOABLE", None, 1):
        with pytest.raises(ConfigurationError):
            coerce_semantics(bad)  # type: ignore[arg-type]
