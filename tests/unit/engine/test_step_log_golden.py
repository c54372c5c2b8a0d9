"""The log a fixed set of sagas writes is byte-for-byte the recorded one.

The engine's step protocol decides what the log says happened, so what it writes for the
same steps must not drift: the order, the types and the payloads of the records, and the
chain over them. With the writer's two sources of variation pinned (the record's clock and
the salts' random bytes), the FileWAL holds the same bytes on every run; the test compares
them, and what each saga raised and how its rollback ended, with
``step_log.golden.jsonl`` (recorded from the engine before its step paths were merged).

The sagas: steps that succeed (REVERSIBLE and COMPENSABLE, async and sync tools, with a
key parameter, gated, with a timeout, a retry, a fallback), a raising tool and its
rollback, a cancelled tool, a timed-out tool, broken compensation factories, refusals,
and a log device that stalls under a durable step.

Re-record (only when a change to the log is intended, and say so in the commit):

    python tests/unit/engine/test_step_log_golden.py --write
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from agent_saga import chain
from agent_saga.compensation import Compensation
from agent_saga.retry import NO_RETRY, RetryPolicy
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from agent_saga.wal import batching
from agent_saga.wal.file import FileWAL
from engine_support import Wedge

GOLDEN = Path(__file__).with_name("step_log.golden.jsonl")

R, C, IRR = ActionSemantics.REVERSIBLE, ActionSemantics.COMPENSABLE, ActionSemantics.IRREVERSIBLE


class Boom(Exception):
    """The tool's own failure."""


class _Clock:
    """The retry back-off's time seam: no real sleep."""

    def monotonic(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        return None


class _Allow:
    async def decide(self, request: Any) -> Any:
        from agent_saga.gates import GateDecision

        return GateDecision.allow(decided_by="golden")


class _Block:
    async def decide(self, request: Any) -> Any:
        from agent_saga.gates import GateDecision

        return GateDecision.block(f"{request.tool} is halted", decided_by="golden")


class _Pinned:
    """Deterministic stand-ins for the writer's clock and its random bytes."""

    def __init__(self) -> None:
        self.ticks = 1_800_000_000_000_000_000
        self.stream = hashlib.sha256(b"golden").digest()
        self.counter = 0

    def time_ns(self) -> int:
        self.ticks += 1000
        return self.ticks

    def urandom(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            self.counter += 1
            out += hashlib.sha256(self.stream + self.counter.to_bytes(8, "big")).digest()
        return out[:n]


Step = Callable[[Any, list[str]], Awaitable[None]]


_WEDGE = Wedge()  # the main log's device, wedged by one saga


async def _ok(**kw: Any) -> dict[str, Any]:
    return {"id": "r1", "key": kw.get("idempotency_key")}


def _ok_sync() -> dict[str, str]:
    return {"id": "s1"}


def _ok_sync_key(idempotency_key: str) -> dict[str, str]:
    return {"id": "s2", "key": idempotency_key}


async def _ok_plain() -> dict[str, str]:
    return {"id": "p1"}


async def _raises() -> None:
    raise Boom("card declined")


def _raises_sync() -> None:
    raise Boom("sync tool failed")


async def _hangs() -> None:
    await asyncio.Event().wait()


def _undo(done: list[str], what: str) -> Callable[[Any], Compensation]:
    def factory(r: Any) -> Compensation:
        return Compensation(fn=lambda: done.append(f"undo {what} {r!r}"), kwargs={})

    return factory


def _handler(r: Any) -> Compensation:
    return Compensation(handler="golden.refund", kwargs={"id": r["id"] if r else None})


def _factory_raises(r: Any) -> Compensation:
    raise Boom("factory broke")


async def success(saga: Any, done: list[str]) -> None:
    await saga.execute("cache.put", R, _ok_plain)
    await saga.execute("cache.put.sync", R, _ok_sync)
    await saga.execute("cache.put.key", R, _ok, _undo(done, "rev"), policy_args={"n": 1})
    await saga.execute("stripe.charge", C, _ok, _undo(done, "charge"), policy_args={"amount": 4200})
    await saga.execute("stripe.charge.sync", C, _ok_sync_key, _undo(done, "sync"))
    await saga.execute("cache.explicit", R, _ok_plain, retry=NO_RETRY)
    await saga.execute("cache.timed", R, _ok_plain, timeout=30)
    await saga.execute("stripe.timed", C, _ok, _undo(done, "timed"), timeout=30)
    await saga.execute("stripe.returns.dict", C, _ok_plain, lambda r: {"handler": "golden.refund", "kwargs": r})
    attempts = iter([Boom("flaky"), None])

    async def flaky() -> dict[str, str]:
        err = next(attempts)
        if err is not None:
            raise err
        return {"id": "f1"}

    policy = RetryPolicy(max_attempts=3, base_delay=0.5)
    await saga.execute("stripe.flaky", C, flaky, _undo(done, "flaky"), retry=policy)
    await saga.execute("stripe.fallback", C, _raises, _undo(done, "fallback"),
                       retry=RetryPolicy(max_attempts=2, base_delay=0.5), fallback_action=_ok_plain)


async def gated(saga: Any, done: list[str]) -> None:
    await saga.execute("crm.update", C, _ok, _undo(done, "crm"), policy_args={"who": "a"})
    await saga.execute("cache.put", R, _ok_plain)
    await saga.execute("ledger.close", IRR, _ok_plain)


async def failure(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.charge", C, _ok, _undo(done, "charge"))
    await saga.execute("cache.put", R, _ok, _undo(done, "cache"))
    await saga.execute("cache.noop", R, _ok_plain)
    await saga.execute("email.send", C, _raises, _undo(done, "never"))


async def failure_sync(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.charge", C, _ok_sync, _undo(done, "charge"))
    await saga.execute("cache.put", R, _raises_sync, _undo(done, "never"))


async def failure_retried(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.charge", C, _ok, _handler)
    await saga.execute("email.send", C, _raises, _undo(done, "never"),
                       retry=RetryPolicy(max_attempts=2, base_delay=0.5))


async def failure_reversible(saga: Any, done: list[str]) -> None:
    await saga.execute("cache.put", R, _ok, _undo(done, "cache"))
    await saga.execute("cache.get", R, _raises)


async def _cancel_once(saga: Any, tool: str, undo: Callable[[Any], Compensation], sem: ActionSemantics) -> None:
    """Run a step whose tool hangs; cancel it once the tool has started."""
    started = asyncio.Event()

    async def hangs() -> None:
        started.set()
        await asyncio.Event().wait()

    task = asyncio.ensure_future(saga.execute(tool, sem, hangs, undo))
    await started.wait()
    task.cancel()
    await task


async def cancelled(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.charge", C, _ok, _undo(done, "charge"))
    await _cancel_once(saga, "stripe.hold", _undo(done, "hold"), C)


async def cancelled_reversible(saga: Any, done: list[str]) -> None:
    await _cancel_once(saga, "cache.wait", _undo(done, "wait"), R)


async def cancelled_at_fence(saga: Any, done: list[str]) -> None:
    """Cancelled while its intent's fence waits for the disk: the tool never starts."""
    await saga.execute("stripe.charge", C, _ok, _undo(done, "charge"))
    _WEDGE.armed.set()
    task = asyncio.ensure_future(saga.execute("stripe.hold", C, _ok, _undo(done, "never")))
    from fixtures.polling import until_async

    await until_async("the flusher is stuck before its sync", _WEDGE.reached.is_set)
    task.cancel()
    _WEDGE.release.set()
    await task


async def timed_out(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.charge", C, _ok, _undo(done, "charge"))
    await saga.execute("stripe.hold", C, _hangs, _handler, timeout=0.05)


async def broken_factory(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.charge", C, _ok, _undo(done, "charge"))
    await saga.execute("stripe.hold", C, _ok, _factory_raises)


async def broken_factory_reversible(saga: Any, done: list[str]) -> None:
    await saga.execute("cache.put", R, _ok, lambda r: "not a compensation")


async def broken_factory_timed(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.hold", C, _ok, lambda r: None, timeout=30)


async def unreplayable(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.charge", C, _ok, lambda r: Compensation(fn=lambda **kw: done.append("undo"),
                                                                       kwargs={"o": object()}))


async def refused(saga: Any, done: list[str]) -> None:
    await saga.execute("cache.put", R, _ok, _undo(done, "cache"))
    await saga.execute("ledger.close", IRR, _ok_plain)


async def blocked(saga: Any, done: list[str]) -> None:
    await saga.execute("stripe.charge", C, _ok, _undo(done, "charge"))


SAGAS: list[tuple[str, Step, Any]] = [
    ("success", success, None),
    ("gated", gated, _Allow()),
    ("failure", failure, None),
    ("failure-sync", failure_sync, None),
    ("failure-retried", failure_retried, None),
    ("failure-reversible", failure_reversible, None),
    ("cancelled", cancelled, None),
    ("cancelled-reversible", cancelled_reversible, None),
    ("cancelled-at-fence", cancelled_at_fence, None),
    ("timed-out", timed_out, None),
    ("broken-factory", broken_factory, None),
    ("broken-factory-reversible", broken_factory_reversible, None),
    ("broken-factory-timed", broken_factory_timed, None),
    ("unreplayable", unreplayable, None),
    ("refused", refused, None),
    ("blocked", blocked, _Block()),
]


def _outcome(name: str, saga: Any, exc: BaseException | None, done: list[str]) -> str:
    parts = [f"# {name}: status={saga.status}"]
    if exc is not None:
        parts.append(f"raised {type(exc).__name__}: {exc}")
        parts += [f"note {n}" for n in getattr(exc, "__notes__", [])]
        cause = exc.__cause__
        if cause is not None:
            parts.append(f"cause {type(cause).__name__}: {cause}")
            parts += [f"cause note {n}" for n in getattr(cause, "__notes__", [])]
    report = saga.rollback_report
    if report is not None:
        parts.append(f"clean={report.clean}")
        parts += [f"step {s.step_id} {s.outcome.value}" for s in report.steps]
    parts += done
    return "\n".join(parts)


async def _run(name: str, body: Step, gate: Any, wal: FileWAL) -> str:
    done: list[str] = []
    holder: list[Any] = []
    exc: BaseException | None = None
    try:
        async with saga_scope(wal, gate, saga_id=f"golden-{name}", clock=_Clock()) as saga:
            holder.append(saga)
            await body(saga, done)
    except BaseException as e:  # noqa: BLE001 - the outcome is what is recorded
        exc = e
    return _outcome(name, holder[0], exc, done)


async def _stalled(path: Path) -> str:
    """A log device that stalls under a durable step's intent: the forward never runs,
    the rollback runs every compensation without waiting a second bound."""
    wedge = Wedge()
    wal = FileWAL(path, stall_timeout=0.2, fault_hook=wedge)

    async def body(saga: Any, done: list[str]) -> None:
        await saga.execute("stripe.charge", C, _ok, _undo(done, "charge"))
        wedge.armed.set()
        await saga.execute("stripe.hold", C, _ok, _undo(done, "hold"))

    try:
        outcome = await _run("stalled", body, None, wal)
    finally:
        wedge.release.set()
    from fixtures.polling import until_async

    # The batch the flusher was stuck in (the intent) lands once the device is back.
    await until_async("the write in flight lands", lambda: wal.stats().durable_seq >= 3)
    try:
        wal.close()
    except Exception:  # noqa: BLE001, S110 - a stalled writer says so on close; the log is what counts
        pass
    return outcome


async def record(directory: Path) -> str:
    """Run every saga with the writer's clock and randomness pinned; return the golden text."""
    pinned = _Pinned()
    saved = (batching._time_ns, chain.os)
    batching._time_ns = pinned.time_ns  # type: ignore[assignment]
    chain.os = type("os", (), {"urandom": staticmethod(pinned.urandom)})  # type: ignore[assignment]
    try:
        global _WEDGE
        _WEDGE = Wedge()
        wal = FileWAL(directory / "steps.wal", fault_hook=_WEDGE)
        outcomes = [await _run(name, body, gate, wal) for name, body, gate in SAGAS]
        wal.close()
        outcomes.append(await _stalled(directory / "stalled.wal"))
    finally:
        batching._time_ns, chain.os = saved  # type: ignore[assignment]
    logs = [(directory / "steps.wal").read_text(), (directory / "stalled.wal").read_text()]
    return ("\n".join(outcomes) + "\n").replace(str(directory), "<tmp>") + "".join(logs)


async def test_the_log_of_a_fixed_set_of_sagas_is_byte_for_byte_the_recorded_one(tmp_path: Path) -> None:
    got = await record(tmp_path)
    want = GOLDEN.read_text()
    if got != want:  # the first differing line, readable
        for i, (a, b) in enumerate(zip(got.splitlines(), want.splitlines(), strict=False)):
            assert a == b, f"line {i + 1} differs"
    assert got == want


if __name__ == "__main__":
    import tempfile

    here = Path(__file__).resolve()
    sys.path[:0] = [str(here.parents[1]), str(here.parents[2])]  # tests/unit (engine_support), tests/ (fixtures)
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/unit/engine/test_step_log_golden.py --write")
    with tempfile.TemporaryDirectory() as d:
        GOLDEN.write_text(asyncio.run(record(Path(d))))
    print(f"wrote {GOLDEN}")
