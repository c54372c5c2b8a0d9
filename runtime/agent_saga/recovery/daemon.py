"""RecoveryDaemon: finish what a killed process left half done.

    daemon = RecoveryDaemon("./agent-saga.wal", imports=["myapp.handlers"])
    report = await daemon.sweep()            # one pass; or: await daemon.run(interval=5)

A sweep reads what is new in the log (once: the first sweep reads it all, later ones only
what was appended), finds the sagas with no terminal record whose owner's lease has
expired, and for each one: claims it, re-reads what was written since (another daemon
may just have finished it), checks quarantine again, plans its rollback from its records
(``agent_saga.recovery.plan``) and carries the plan out (``...resolver``), writing the
same records the engine's own rollback writes, continued in the same log.

Guarantees:
- A live process is never touched: a saga is claimed only once its lease has expired
  (plus ``lease_grace`` for clock skew) and, for a FileWAL file, only while its writer
  lock is free.
- Completed work is skipped, not repeated: the crashed process's WAL and the daemon
  journal (the ledger) are read together; an interrupted rollback is finished, not
  restarted. Two daemons racing on one saga: the claim admits one, the re-read and the
  ledger stop the other, and the handler's idempotency key (the same one the engine uses)
  absorbs the window a claim cannot close (a daemon paused past its claim's TTL).
- Never a guess: what cannot be resolved automatically is escalated to the human queue
  in the ledger (``agent-saga recover --escalations``) and the saga is closed PARTIAL.
- Acts only on verified records: each record read is checked against its digest and its
  chain first (``recovery.verified``); a record that fails, an unexplained gap, a repeated
  or backward sequence, a truncated or replaced log, and a record of an unknown type in a
  saga it would act on halt it. Where the scan keeps only records' places and hashes (a
  RedisWAL: memory bounded by the sagas in flight, one page of records per read), a
  claimed saga's records are read again and must be the ones verified, or it halts.
- Fails closed: those, a record the reader cannot decrypt, or an unreadable journal halt
  the daemon (``halted``, ``RecoveryHalted``) before it acts; it stays halted until rebuilt.
- ``sweep()`` never raises for one saga's failure or a place it cannot write (claims,
  journal, log: ``LocationUnavailable``): the report's ``error`` says what stopped it.
- ``drain()``: the claim in hand is finished, no new one is taken.
- One blocked compensation holds one of the ``concurrency`` slots, not the daemon:
  ``run()`` waits at most ``interval`` for a sweep's resolutions, then sweeps again while
  the slow ones go on in the background (their results are in the report of the sweep
  they end in), and a later sweep never takes a saga one of them holds.
- ``shard=True`` (a replica fleet): replicas split the orphans by a hash of the saga id
  over their live membership (``recovery.shards``); a dead replica's share is taken over
  when its membership entry expires. Claims, re-reads and the ledger still guard every
  saga: sharding orders the work, it decides nothing.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import random
import secrets
import socket
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from .. import observe as _observe
from ..audit.encryption import PayloadEncryptor
from ..clocks import SYSTEM_CLOCK, Clock, as_clock
from ..errors import ConfigurationError, WALError
from ..executor import get_tool_executor
from ..faults import fault_point
from ..wal.base import BaseWAL
from ..wal.compaction import CompactionReport
from .claims import Claim, ClaimLock, FileClaimLock
from .errors import ClaimLost, ClaimStoreUnavailable, RecoveryError, RecoveryHalted, location_error
from .ledger import FileLedger, RecoveryLedger
from .partials import owner_escalations
from .plan import plan_saga
from .quarantine import QuarantineSource, ask_quarantine
from .report import SweepReport
from .resolver import Resolution, SagaResult
from .scan import LogScan, SagaView
from .shards import Heartbeat, shard_of
from .sources import LogSource, PathSource, WALSource, WriterBusy, keep_set
from .targets import default_file_paths

__all__ = ["RecoveryDaemon", "SweepReport"]

log = logging.getLogger("agent_saga.recovery")

def default_daemon_id() -> str:
    host = "".join(c if c.isalnum() or c in "._-" else "-" for c in socket.gethostname())[:60] or "host"
    return f"recovery-{host}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(slots=True)
class _Sweep:
    results: list[SagaResult] = field(default_factory=list)
    stop: str | None = None  # why no further saga is taken
    drained: bool = False
    open: bool = True  # False once its report was made: later results go to the next one


class _ClaimGuard:
    """Renews a claim in the background; ``check()`` raises ``ClaimLost`` once it is not
    certainly ours (renewal refused, or not confirmed within 90% of its ttl).

    ``stop()`` does not rely on cancellation alone: a client may absorb a cancellation
    that lands mid-call (redis-py's asyncio client does) and return normally, and a
    renewal loop that missed its one cancel would run, and hold the sweep, forever.
    """

    def __init__(self, lock: ClaimLock, claim: Claim, clock: Clock = SYSTEM_CLOCK) -> None:
        self.lock = lock
        self.claim = claim
        self._clock = clock
        self.confirmed = clock.monotonic()
        self.lost: str | None = None
        self._stopping = False
        self._task = asyncio.ensure_future(self._renew())

    async def _renew(self) -> None:
        period = max(self.claim.ttl / 3.0, 0.01)
        while not self._stopping:
            await self._clock.sleep(period)
            if self._stopping:
                return
            try:
                if await self.lock.renew(self.claim):
                    self.confirmed = self._clock.monotonic()
                else:
                    self.lost = "another daemon holds it now (it expired)"
                    return
            except ClaimStoreUnavailable as exc:
                log.warning("claim on %s not renewed: %s", self.claim.name, exc)

    def check(self) -> None:
        if self.lost is None and self._clock.monotonic() - self.confirmed > self.claim.ttl * 0.9:
            self.lost = f"not renewed within its ttl of {self.claim.ttl}s"
        if self.lost is not None:
            raise ClaimLost(
                f"the claim on saga {self.claim.name} was lost: {self.lost}; stopped before "
                f"calling anything, the holder finishes it",
                saga_id=self.claim.name,
            )

    async def stop(self) -> None:
        self._stopping = True
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass


class RecoveryDaemon:
    """Resolves sagas whose owner died (see the module doc).

    Args:
        wal: a FileWAL path (``str`` / ``PathLike``) or any open ``BaseWAL`` (a RedisWAL
            or PostgresWAL fleet log, or this process's own log).
        ledger: the journal and escalation queue (default for a file log:
            ``FileLedger(<wal>.recovery.jsonl)``; required for a fleet log: ``RedisLedger``).
        lock: claims (default for a file log: ``FileClaimLock(<wal>.recovery-claims)``;
            required for a fleet log: ``RedisClaimLock``).
        imports: modules to import first: the ones declaring the ``@compensator`` handlers
            and ``@reconciler`` functions the agents use. A missing one is an error now,
            not an escalation storm later.
        quarantine: an extra ``QuarantineSource`` (the kill switch); SAGA_QUARANTINED
            records in the log are always honoured.
        lease_grace: seconds added to every lease before a saga counts as orphaned (clock
            skew between the owner's host and this one).
        claim_ttl: seconds a claim lives without renewal (renewed every third of it).
        concurrency: sagas resolved at once.
        compensation_timeout: seconds a handler or reconciler may take before the step is
            escalated as in doubt (``None``: no bound).
        daemon_id: this daemon's name in every record it writes (default: host, pid, random).
        clock: the time seam (``agent_saga.clocks``): a ``Clock`` (``ManualClock()`` in
            tests), or a function returning epoch seconds (lease expiry only).
        writer_wait: for a file log, how long to wait for its writer lock (seconds).
        encryptor: for an encrypted file log, its key(s) (see
            ``agent_saga.audit.encryption``; pass an ``EncryptedWAL`` as ``wal`` for other
            backends). Without a key an encrypted record halts the daemon: fail-closed.
        reopen: for an open fleet WAL, how to open a writer on it again when it has
            failed (a Redis failover or restart: the writer is fail-stop); without it a
            failed writer stops every later resolution until the process restarts.
        shard: split the orphans with the other daemons sharing ``lock`` (a replica
            fleet; the lock must keep a membership: ``RedisClaimLock``): each takes the
            sagas a hash of their id assigns it among the live members, and a dead one's
            share once its entry expires (``membership_ttl``).
        membership_ttl: seconds this daemon's membership entry lives without renewal
            (renewed every third of it; default: ``claim_ttl``).

    Raises ``ConfigurationError`` for bad arguments or a module in ``imports`` that cannot
    be imported.
    """

    def __init__(
        self,
        wal: BaseWAL | str | os.PathLike[str],
        *,
        ledger: RecoveryLedger | None = None,
        lock: ClaimLock | None = None,
        imports: Iterable[str] = (),
        quarantine: QuarantineSource | None = None,
        lease_grace: float = 5.0,
        claim_ttl: float = 30.0,
        concurrency: int = 4,
        compensation_timeout: float | None = 300.0,
        daemon_id: str | None = None,
        clock: Clock | Callable[[], float] | None = None,
        writer_wait: float = 2.0,
        encryptor: PayloadEncryptor | None = None,
        reopen: Callable[[], BaseWAL] | None = None,
        shard: bool = False,
        membership_ttl: float | None = None,
    ) -> None:
        if isinstance(imports, str):
            raise ConfigurationError(f"imports must be a list of module names, not the string {imports!r}")
        if lease_grace < 0 or claim_ttl <= 0 or concurrency < 1:
            raise ConfigurationError(
                f"need lease_grace >= 0, claim_ttl > 0 and concurrency >= 1 (got {lease_grace}, "
                f"{claim_ttl}, {concurrency})"
            )
        self.imported = tuple(import_modules(imports))
        path: str | None
        if isinstance(wal, BaseWAL):
            if encryptor is not None:
                raise ConfigurationError(
                    "encryptor= is for a FileWAL path; for an open WAL pass EncryptedWAL(wal, encryptor)"
                )
            self.source: LogSource = WALSource(wal, reopen)
            inner = getattr(wal, "inner", wal)
            path = getattr(inner, "path", None) if not self.source.fleet else None
        elif isinstance(wal, str | os.PathLike):
            path = os.fspath(wal)
            self.source = PathSource(path, writer_wait=writer_wait, encryptor=encryptor)
        else:
            raise ConfigurationError(f"wal must be a FileWAL path or a BaseWAL, got {wal!r}")
        if ledger is None or lock is None:
            if path is None:
                raise ConfigurationError(
                    f"recovering the fleet log {self.source.description} needs ledger= and lock= "
                    f"shared by every daemon (RedisLedger(url), RedisClaimLock(url)); local ones "
                    f"would let two daemons compensate the same step twice"
                )
            ledger_path, claims_dir = default_file_paths(path)
            ledger = ledger if ledger is not None else FileLedger(ledger_path)
            lock = lock if lock is not None else FileClaimLock(claims_dir)
        self.ledger: RecoveryLedger = ledger
        self.lock: ClaimLock = lock
        self.quarantine = quarantine
        self.lease_grace = lease_grace
        self.claim_ttl = claim_ttl
        self.concurrency = concurrency
        self.compensation_timeout = compensation_timeout
        self.daemon_id = daemon_id or default_daemon_id()
        self._clock = as_clock(clock)
        self.scan = LogScan(refs=self.source.rereads)
        self.halted: RecoveryHalted | None = None
        self.warnings: list[str] = []
        self._unknown_seen: set[str] = set()
        self._draining = False
        self._wake = asyncio.Event()
        self._read_lock = asyncio.Lock()
        self._reads_started = 0  # reads of the log begun (numbered in order, under _read_lock)
        self._reads_done = 0  # the number of the last read that completed
        self._sweep_lock = asyncio.Lock()
        self._rng = random.Random()
        self._in_hand: set[str] = set()  # sagas a worker holds now, whichever sweep started it
        self._background: set[asyncio.Future[None]] = set()  # workers of sweeps that reported
        self._late: list[SagaResult] = []  # results those workers finished since
        self._late_stop: str | None = None
        self.heartbeat: Heartbeat | None = None
        if shard:
            renew = getattr(lock, "members", None)
            if renew is None:
                raise ConfigurationError(
                    f"shard=True needs claims that keep a membership (RedisClaimLock); "
                    f"{getattr(lock, 'description', lock)!r} does not"
                )
            ttl = claim_ttl if membership_ttl is None else membership_ttl
            if ttl <= 0:
                raise ConfigurationError(f"membership_ttl must be > 0 seconds, got {membership_ttl}")
            self.heartbeat = Heartbeat(renew, self.daemon_id, ttl)
        if self.source.fleet and not getattr(ledger, "shared", False):
            self._warn(
                f"ledger {getattr(ledger, 'description', ledger)!r} is local to this host but the "
                f"log {self.source.description} is shared: daemons on other hosts cannot see "
                f"this one's successes and may compensate a step twice. Use RedisLedger"
            )
        if self.source.fleet and not getattr(lock, "shared", False):
            self._warn(
                f"claims {getattr(lock, 'description', lock)!r} are local to this host but the log "
                f"{self.source.description} is shared: use RedisClaimLock so replicas exclude each other"
            )

    def _warn(self, text: str) -> None:
        self.warnings.append(text)
        log.warning("%s", text)

    # ------------------------------------------------------------------ state

    @property
    def draining(self) -> bool:
        """True once ``drain`` was called: no new saga is taken."""
        return self._draining

    def drain(self) -> None:
        """Finish the claims in hand, take no new one; ``run`` returns after that."""
        self._draining = True
        self._wake.set()

    def _halt(self, exc: RecoveryHalted) -> None:
        if self.halted is None:
            self.halted = exc
            log.critical(
                "recovery of %s HALTED (fail-closed, nothing more is acted on until a human "
                "repairs the log and restarts the daemon): %s", self.source.description, exc.message,
            )

    async def _refresh(self) -> None:
        """Read what is new (verified: see ``recovery.verified``) into the scan. Raises
        ``RecoveryHalted`` for anything not verified or not readable as a record,
        ``LocationUnavailable`` if the log cannot be opened now.

        Reads are shared: a caller waiting while another read runs is served by the next
        read that starts after it asked, so the workers that claimed meanwhile pay one
        read of the log between them, not one each (what a claimant needs is a read that
        began after its claim)."""
        ticket = self._reads_started
        async with self._read_lock:
            if self._reads_done > ticket:
                return  # a read that began after this call asked has completed
            self._reads_started += 1
            number = self._reads_started
            await self._read_new()
            self._reads_done = number

    async def _read_new(self) -> None:
        """One read of what is new into the scan (under ``_read_lock``), page by page: the
        read holds one page of records at a time. A read of the whole log goes into a new
        scan, which replaces this one once the read has ended (verified whole)."""
        target = self.scan
        fresh: LogScan | None = None
        known = set(self.scan.unknown_types)
        try:
            async for read in self.source.read_pages():
                if read.from_start:
                    fresh = target = LogScan(refs=self.source.rereads)
                    fresh.records_read = self.scan.records_read
                target.feed_all(read.records)
        except RecoveryError:
            raise
        except WALError as exc:
            # Unparseable, undecryptable or unreadable: never skipped.
            where = getattr(exc, "location", "") or self.source.description
            raise RecoveryHalted(
                f"{self.source.description}: the log cannot be read ({exc.message}); the sweep "
                f"stopped before acting on any saga",
                location=where,
            ) from exc
        if fresh is not None:
            if self.scan.records_read:
                # Records left the log since the last read (a compaction): start over from
                # the whole log, so no saga is judged on half of its records.
                log.info("%s: records left the log since the last read; read it whole again", self.source.description)
            self.scan = fresh
        for t in self.scan.unknown_types.keys() - known - self._unknown_seen:
            self._unknown_seen.add(t)
            log.warning(
                "%s holds records of type %s, which this version of agent-saga does not know; "
                "recovery will not act on a saga holding one (upgrade agent-saga): first at %s",
                self.source.description, t, self.scan.unknown_types[t][1],
            )

    async def _records_of(self, view: SagaView) -> SagaView:
        """``view`` with its records, read again and checked against what the scan
        verified where the scan kept only their places (``LogSource.reread``)."""
        if not view.refs:
            return view
        records = await self.source.reread(view.saga_id, self.scan.places(view.refs))
        return replace(view, records=records, refs=b"")

    # ------------------------------------------------------------------ sweeping

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
        live = quarantined = in_flight = 0
        orphans: list[SagaView] = []

        def report() -> SweepReport:
            return SweepReport(
                source=self.source.description, started=started, duration=self._clock.monotonic() - t0,
                records_read=self.scan.records_read - before, in_flight=in_flight,
                live=live, quarantined=quarantined, orphans=len(orphans),
                oldest_orphan_age=self._oldest_orphan_age(), results=tuple(state.results),
                halted=None if self.halted is None else self.halted.message, error=state.stop or late_stop,
                drained=state.drained, dry_run=dry_run, unknown_types=tuple(sorted(self.scan.unknown_types)),
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
        for view in list(self.scan.in_flight.values()):
            if not view.lease_expired(now, self.lease_grace):
                live += 1
            elif view.quarantine is not None:
                quarantined += 1
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

        # Slots held by the slow resolutions of earlier sweeps are not free.
        slots = min(self.concurrency - len(self._in_hand), len(queue))
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
        guard = _ClaimGuard(self.lock, claim, self._clock)
        try:
            async with self.source.writer() as wal:
                await self._refresh()
                view = self.scan.in_flight.get(saga_id)
                if view is None:
                    return SagaResult(saga_id, "RESOLVED")
                if not view.lease_expired(self._clock.time(), self.lease_grace):
                    return SagaResult(saga_id, "LIVE")
                if await self._is_quarantined(view):
                    return SagaResult(saga_id, "QUARANTINED")
                view = await self._records_of(view)  # only what was verified is acted on
                plan = plan_saga(view)
                resolution = Resolution(
                    view=view, plan=plan, wal=wal, ledger=self.ledger, daemon_id=self.daemon_id,
                    source=self.source.description, executor=get_tool_executor(),
                    check_claim=guard.check, compensation_timeout=self.compensation_timeout,
                    claim_token=claim.token, clock=self._clock,
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
            log.error("recovery of saga %s stopped, the next sweep resumes it: %s", saga_id, exc.message)
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
            await guard.stop()
            try:
                await self.lock.release(claim)
            except (RecoveryError, OSError) as exc:
                log.warning("claim on %s not released (it expires by itself): %s", saga_id, exc)

    # ------------------------------------------------------------------ loop

    async def run(
        self,
        *,
        interval: float = 5.0,
        on_report: Callable[[SweepReport], Any] | None = None,
    ) -> None:
        """Sweep every ``interval`` seconds until ``drain()``; a halted daemon keeps
        reporting itself halted (so health checks see it) without acting."""
        while not self._draining:
            rep = await self.sweep(wait=interval)
            if on_report is not None:
                on_report(rep)
            if self._draining:
                break
            try:
                await asyncio.wait_for(self._wake.wait(), interval)
            except TimeoutError:
                pass
            self._wake.clear()
        if self._background:  # the claims in hand are finished before run returns
            await asyncio.gather(*self._background, return_exceptions=True)

    async def compact(self, grace_seconds: float, *, timeout: float | None = None) -> CompactionReport:
        """Compact the log, keeping every unresolved saga, every saga resolved less than
        ``grace_seconds`` ago and every saga with an open escalation (its evidence stays
        until a human closes it). Raises ``SagaError`` if the backend cannot compact,
        ``RecoveryHalted`` if the log cannot be read, ``WriterBusy`` if a file log's owner
        is alive."""
        if grace_seconds < 0:
            raise ConfigurationError(f"grace_seconds must be >= 0, got {grace_seconds}")
        if self.halted is not None:
            raise self.halted
        await self._refresh()
        open_sagas = {e.saga_id for e in await self.ledger.escalations()}
        keep = keep_set(self.scan.resolved, self._clock.time(), grace_seconds, open_sagas)
        async with self.source.writer() as wal:
            return await wal.compact(keep_sagas=keep, timeout=timeout)

    async def close(self) -> None:
        """Leave the membership, release the log writer (file logs) and the lock/ledger
        clients."""
        if self.heartbeat is not None and self.heartbeat.started:
            await self.heartbeat.stop()
            leave = getattr(self.lock, "leave", None)
            if leave is not None:
                try:
                    await leave(self.daemon_id)
                except RecoveryError as exc:
                    log.warning("recovery membership not left (it expires by itself): %s", exc.message)
        await self.source.close()
        await self.lock.close()
        await self.ledger.close()

    async def __aenter__(self) -> RecoveryDaemon:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "halted" if self.halted else "draining" if self._draining else "ready"
        return f"<RecoveryDaemon {self.daemon_id} {self.source.description} {state}>"


async def _observed_run(obs: _observe.Observer, view: SagaView, resolution: Resolution) -> SagaResult:
    """``resolution.run()`` under the observer's recovery span, linked to the trace the
    saga's SAGA_STARTED names (telemetry: ``agent_saga.observe``)."""
    first = view.records[0] if view.records else None
    traceparent = None
    if first is not None and first.type == "SAGA_STARTED" and isinstance(first.payload, dict):
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


def import_modules(names: Iterable[str]) -> Sequence[str]:
    """Import every module in ``names`` (handler and reconciler registrations); raises
    ``ConfigurationError`` naming the one that failed."""
    done: list[str] = []
    for name in names:
        if not isinstance(name, str) or not name.strip():
            raise ConfigurationError(f"imports must be module names, got {name!r}")
        try:
            importlib.import_module(name.strip())
        except Exception as exc:
            raise ConfigurationError(
                f"cannot import {name!r} ({type(exc).__name__}: {exc}): the recovery process must "
                f"import the same handler modules as the agents, or every saga escalates"
            ) from exc
        done.append(name.strip())
    return done
