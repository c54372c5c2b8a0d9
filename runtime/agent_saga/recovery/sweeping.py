"""One sweep of a recovery daemon: find the orphans, share them out, resolve each under a claim.

``Sweeping`` is the part of ``RecoveryDaemon`` that runs a pass (``sweep``): the orphans
of the scan (lease expired, not quarantined), this replica's share of them (``shard``),
``in_hand`` workers each claiming a saga, reading what was written since, planning
and carrying out its rollback (``resolver.Resolution``), of which ``concurrency`` call
handlers and reconcilers at a time (``Calls``). The guarantees are in
``recovery.daemon``.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from .. import observe as _observe
from ..clocks import Clock
from ..errors import WALError
from ..executor import ToolExecutor
from ..faults import fault_point
from ..records import RecordType
from .claimguard import ClaimGuard
from .claims import Claim, ClaimLock
from .daemonreads import DaemonReads
from .errors import ClaimLost, RecoveryError, RecoveryHalted, location_error
from .grants import Grants
from .ledger import LedgerEntry, RecoveryLedger
from .partials import owner_escalations
from .plan import plan_saga
from .quarantine import QuarantineSource, ask_quarantine
from .report import SweepReport
from .resolver import Resolution, SagaResult
from .scan import SagaView
from .shards import Heartbeat, shard_of
from .sources import WriterBusy

__all__ = ["Sweeping"]

log = logging.getLogger("agent_saga.recovery")


@dataclass(slots=True)
class _Sweep:
    results: list[SagaResult] = field(default_factory=list)
    stop: str | None = None  # why no further saga is taken
    drained: bool = False
    open: bool = True  # False once its report was made: later results go to the next one


class Sweeping(DaemonReads):
    """The daemon's sweep (set up by ``RecoveryDaemon.__init__``)."""

    ledger: RecoveryLedger
    lock: ClaimLock
    quarantine: QuarantineSource | None
    lease_grace: float
    claim_ttl: float
    concurrency: int
    in_hand: int
    # The ledger's ``record_release`` where it shares the claims' store (one request
    # journals a resolved saga and releases its claim), else None.
    _journal_release: Callable[[LedgerEntry, ClaimLock, Claim], Awaitable[object]] | None
    executor: ToolExecutor
    compensation_timeout: float | None
    grants: Grants
    daemon_id: str
    heartbeat: Heartbeat | None
    _clock: Clock
    _draining: bool
    _sweep_lock: asyncio.Lock
    _rng: random.Random
    _in_hand: set[str]
    _background: set[asyncio.Future[None]]
    _late: list[SagaResult]
    _late_stop: str | None
    _call_slots: tuple[asyncio.AbstractEventLoop, asyncio.Semaphore] | None = None

    async def sweep(self, *, dry_run: bool = False, wait: float | None = None) -> SweepReport:
        """One pass over the log (see the module doc). ``dry_run`` plans without claiming
        or writing anything. ``wait``: seconds to wait for the resolutions this sweep
        starts (``None``: until all end); those still running then go on in the
        background, holding their slots, and are reported by the sweep they end in.
        Never raises for a saga's failure: the report says."""
        async with self._sweep_lock:
            return await self._sweep(dry_run, wait)

    async def _sweep(self, dry_run: bool, wait: float | None = None) -> SweepReport:
        started, t0 = self._clock.time(), self._clock.monotonic()
        before = self.scan.records_read
        state = _Sweep()
        late_stop = None
        if not dry_run:  # what background resolutions finished since the last report
            state.results, self._late = self._late, []
            late_stop, self._late_stop = self._late_stop, None
        live = quarantined = in_flight = held = 0
        orphans: list[SagaView] = []
        held_writers: dict[str, str] = {}
        contested: list[str] = []

        def report() -> SweepReport:
            return SweepReport(
                source=self.source.description, started=started, duration=self._clock.monotonic() - t0,
                records_read=self.scan.records_read - before, in_flight=in_flight,
                live=live, quarantined=quarantined, orphans=len(orphans),
                oldest_orphan_age=self._oldest_orphan_age(), results=tuple(state.results),
                halted=None if self.halted is None else self.halted.message, error=state.stop or late_stop,
                drained=state.drained, dry_run=dry_run, unknown_types=tuple(sorted(self.scan.unknown_types)),
                held_writers=(*(f"writer {w}: {why}" for w, why in sorted(held_writers.items())), *contested),
                held=held,
                foreign=tuple(self.scan.foreign.describe()),
                broken_writers=tuple(sorted(w for w in held_writers if w not in self.source.quarantined)),
                contested=len(contested),
            )

        if self.halted is not None:
            return report()
        try:
            await self._refresh()
        except RecoveryHalted as exc:
            self._halt(exc)
            return report()
        except RecoveryError as exc:
            state.stop = exc.message  # the log cannot be opened now: the next sweep tries again
            log.error("%s", exc.message)
            return report()
        now = self._clock.time()
        in_flight = len(self.scan.in_flight)
        held_writers = self.source.held_writers()
        for view in list(self.scan.in_flight.values()):
            if not view.lease_expired(now, self.lease_grace):
                live += 1
            elif view.quarantine is not None:
                quarantined += 1
            elif (held_writers and view.owner in held_writers) or view.contested is not None:
                held += 1  # its writer is broken or quarantined, or two writers started it: a human decides
                if view.contested is not None:
                    contested.append(f"saga {view.saga_id}: CONTESTED: {view.contested}")
            else:
                orphans.append(view)
        if not dry_run and self.scan.owner_partials:
            await self._queue_owner_partials(state)
        if dry_run:
            for view in orphans:
                try:
                    planned = plan_saga(await self._records_of(view))
                    state.results.append(SagaResult(view.saga_id, "PLANNED", plan=planned))
                except RecoveryHalted as exc:
                    # What a real sweep would do: halt, having acted on nothing.
                    self._halt(exc)
                    state.results.append(SagaResult(view.saga_id, "FAILED", error=exc.message))
                    break
                except RecoveryError as exc:
                    state.stop = exc.message  # the log cannot be read again now
                    break
            return report()
        # Slots held by the resolutions of earlier sweeps (slow ones, or a long queue
        # drained in the background) are not free: with none free, no queue is made (its
        # shuffle and shard cost a pass over every orphan, for nothing).
        free = self.in_hand - len(self._in_hand)
        queue: list[str] = []
        if free > 0:
            self._rng.shuffle(orphans)  # replicas start at different sagas: fewer conflicts
            queue = [v.saga_id for v in orphans if v.saga_id not in self._in_hand]
        if self.heartbeat is not None:
            members = await self.join()  # renewed, and the membership as it is now
            queue = shard_of(queue, self.daemon_id, members)
        queue.reverse()

        def not_mine(saga_id: str) -> bool:  # the membership changed since the queue was made
            members = self.heartbeat.members if self.heartbeat is not None else None
            return not shard_of([saga_id], self.daemon_id, members)

        async def worker() -> None:
            while queue and state.stop is None and self.halted is None and state.open:
                if self._draining:
                    state.drained = True
                    return
                saga_id = queue.pop()
                if saga_id in self._in_hand or not_mine(saga_id):
                    continue  # a worker of an earlier sweep took it since, or it moved to another replica
                self._in_hand.add(saga_id)
                try:
                    result = await self._recover_one(saga_id, state)
                finally:
                    self._in_hand.discard(saga_id)
                if result is not None:
                    (state.results if state.open else self._late).append(result)
                if not state.open and state.stop is not None:
                    self._late_stop = self._late_stop or state.stop

        slots = min(self.in_hand - len(self._in_hand), len(queue))
        workers = [asyncio.ensure_future(worker()) for _ in range(max(slots, 0))]
        if workers:
            done, pending = await asyncio.wait(workers, timeout=wait)
            for task in done:
                task.result()  # a worker's own failure is the sweep's (as with gather)
            if pending:
                state.open = False  # their results belong to a later report
                for task in pending:
                    self._background.add(task)
                    task.add_done_callback(self._background.discard)
        if self.halted is None:
            try:
                await self._refresh()
            except RecoveryHalted as exc:
                self._halt(exc)
            except RecoveryError as exc:
                state.stop = state.stop or exc.message
        rep = report()
        if rep.recovered or rep.halted or rep.error:
            log.log(logging.INFO if rep.ok else logging.ERROR, "%s", rep.summary())
        return rep

    def _calls(self) -> asyncio.Semaphore | None:
        """What bounds the compensations running at once to ``concurrency`` when more
        sagas than that are in hand (one per event loop: a semaphore binds to its loop)."""
        if self.in_hand <= self.concurrency:
            return None  # no more workers than slots: nothing to wait for
        loop = asyncio.get_running_loop()
        held = self._call_slots
        if held is None or held[0] is not loop:
            held = self._call_slots = (loop, asyncio.Semaphore(self.concurrency))
        return held[1]

    async def join(self) -> list[str] | None:
        """With ``shard=True``: enter the fleet's membership now (the first sweep does
        otherwise) and keep renewing it in the background; the live members, or ``None``
        (no sharding, or the store cannot be reached: every orphan is taken)."""
        if self.heartbeat is None:
            return None
        members = await self.heartbeat.beat()
        self.heartbeat.start()
        return members

    async def _queue_owner_partials(self, state: _Sweep) -> None:
        """Queue for a human every step a saga's own rollback left not restored: its
        caller got ``RollbackIncomplete``, but the human queue must be complete."""
        pending, self.scan.owner_partials = self.scan.owner_partials, []
        try:
            for rec, earlier in pending:
                records = (await self.source.reread(rec.saga, self.scan.places(earlier))
                           if isinstance(earlier, bytes) else earlier)
                for esc in owner_escalations(rec, self.source.description, self.daemon_id, records):
                    await self.ledger.escalate(esc)
        except RecoveryHalted as exc:
            self._halt(exc)
        except RecoveryError as exc:
            self.scan.owner_partials[:0] = pending  # retried next sweep (idempotent ids)
            state.stop = exc.message

    def _oldest_orphan_age(self) -> float:
        now = self._clock.time()
        ages = [
            now - v.lease_until
            for v in self.scan.in_flight.values()
            if v.quarantine is None and v.lease_expired(now, self.lease_grace)
        ]
        return max(ages, default=0.0)

    async def _is_quarantined(self, view: SagaView) -> bool:
        if view.quarantine is not None:
            return True
        if self.quarantine is None:
            return False
        try:
            return await ask_quarantine(self.quarantine, view.saga_id)
        except Exception as exc:  # noqa: BLE001 - unreadable control: fail closed for this saga
            log.error("quarantine source failed for saga %s, leaving it alone this sweep: %r", view.saga_id, exc)
            return True

    async def _recover_one(self, saga_id: str, state: _Sweep) -> SagaResult | None:
        view = self.scan.in_flight.get(saga_id)
        if view is None:
            return SagaResult(saga_id, "RESOLVED")
        if await self._is_quarantined(view):
            return SagaResult(saga_id, "QUARANTINED")
        try:
            claim = await self.lock.acquire(saga_id, self.claim_ttl)
        except RecoveryError as exc:  # the claim store is unreachable or unwritable
            state.stop = exc.message
            log.error("%s", exc.message)
            return None
        if claim is None:
            return SagaResult(saga_id, "CLAIMED")
        fault_point("recovery.after_claim")
        guard = ClaimGuard(self.lock, claim, self._clock)
        released = False

        async def close(entry: LedgerEntry) -> None:
            # The terminal record is durable: the saga's journal entry and the release of
            # its claim go as one request (the order between them guards nothing).
            nonlocal released
            assert self._journal_release is not None and claim is not None
            await guard.stop()
            fault_point("recovery.before_release")
            await self._journal_release(entry, self.lock, claim)
            released = True
            fault_point("recovery.after_release")

        try:
            async with self.source.writer() as wal:
                await self._refresh(claimed=saga_id)
                view = self.scan.in_flight.get(saga_id)
                if view is None:
                    return SagaResult(saga_id, "RESOLVED")
                if not view.lease_expired(self._clock.time(), self.lease_grace):
                    return SagaResult(saga_id, "LIVE")
                if await self._is_quarantined(view):
                    return SagaResult(saga_id, "QUARANTINED")
                why = self.source.held_writers().get(view.owner or "")
                if view.contested is not None:
                    return SagaResult(saga_id, "WRITER_HELD", error=f"CONTESTED: {view.contested}")
                if why is not None:
                    return SagaResult(saga_id, "WRITER_HELD", error=f"writer {view.owner}: {why}")
                view = await self._records_of(view)  # only what was verified is acted on
                plan = plan_saga(view)
                resolution = Resolution(
                    view=view, plan=plan, wal=wal, ledger=self.ledger, daemon_id=self.daemon_id,
                    source=self.source.description, executor=self.executor,
                    check_claim=guard.check, compensation_timeout=self.compensation_timeout,
                    claim_token=claim.token, clock=self._clock, calls=self._calls(),
                    close=close if self._journal_release is not None else None,
                    grants=self.grants, writer=view.owner or self.source.description,
                )
                if _observe.current is None:
                    return await resolution.run()
                return await _observed_run(_observe.current, view, resolution)
        except RecoveryHalted as exc:
            self._halt(exc)
            return SagaResult(saga_id, "FAILED", error=exc.message)
        except WriterBusy as exc:
            return SagaResult(saga_id, "WRITER_BUSY", error=exc.message)
        except ClaimLost as exc:
            log.warning("%s", exc.message)
            return SagaResult(saga_id, "CLAIM_LOST", error=exc.message)
        except (WALError, RecoveryError) as exc:
            state.stop = f"saga {saga_id}: {exc.message}"
            log.error("recovery of saga %s stopped: %s", saga_id, exc.message)  # the message says what holds and what next
            return SagaResult(saga_id, "FAILED", error=exc.message)
        except OSError as exc:
            # A file this sweep needed (journal, claims, log) failed under it: that saga
            # stops where it is; the sweep reports it instead of raising.
            err = location_error(exc, exc.filename or self.source.description, "a file it needs",
                                 "Check the storage it lives on; the next sweep resumes the saga")
            state.stop = f"saga {saga_id}: {err.message}"
            log.error("recovery of saga %s stopped: %s", saga_id, err.message)
            return SagaResult(saga_id, "FAILED", error=err.message)
        finally:
            self.source.forget(saga_id)  # what its refresh read ahead, if it was not used
            await guard.stop()
            try:
                if not released:  # released with the saga's journal entry otherwise
                    await self.lock.release(claim)
            except (RecoveryError, OSError) as exc:
                log.warning("claim on %s not released (it expires by itself): %s", saga_id, exc)


async def _observed_run(obs: _observe.Observer, view: SagaView, resolution: Resolution) -> SagaResult:
    """``resolution.run()`` under the observer's recovery span, linked to the trace the
    saga's SAGA_STARTED names (telemetry: ``agent_saga.observe``)."""
    first = view.records[0] if view.records else None
    traceparent = None
    if first is not None and first.type == RecordType.SAGA_STARTED.value and isinstance(first.payload, dict):
        found = first.payload.get("traceparent")
        traceparent = found if isinstance(found, str) else None
    handle = _observe.safely(obs.recovery_started, view.saga_id, traceparent)
    try:
        result = await resolution.run()
    except BaseException as exc:
        _observe.safely(obs.recovery_ended, handle, "FAILED", f"{type(exc).__name__}: {exc}")
        raise
    _observe.safely(obs.recovery_ended, handle, result.status, result.error)
    return result
