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
- Acts for a saga's own writer only: records of a saga in another agent identity's chain
  are ignored (``wal.writers``); a writer whose chain is broken, or that an operator
  quarantined, has its sagas left alone (the report names it) while the others are
  recovered; a compensation runs only if ``allow`` (``recovery.grants``) grants its
  handler and credential references to the saga's writer, else it is escalated.
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
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._identity import process_identity
from .._unawaited import runs_if_discarded
from ..audit.encryption import PayloadEncryptor
from ..clocks import Clock, as_clock
from ..errors import ConfigurationError
from ..executor import ToolExecutor
from ..wal.base import BaseWAL
from ..wal.compaction import CompactionReport
from .claimguard import ClaimGuard as _ClaimGuard  # noqa: F401 - the name tests use
from .claims import ClaimLock, FileClaimLock
from .errors import RecoveryError, RecoveryHalted
from .grants import Grants
from .ledger import FileLedger, RecoveryLedger
from .quarantine import QuarantineSource
from .report import SweepReport
from .resolver import SagaResult
from .scan import LogScan
from .shards import Heartbeat
from .sources import LogSource, PathSource, WALSource, keep_set
from .sweeping import Sweeping
from .targets import default_file_paths

__all__ = ["RecoveryDaemon", "SweepReport"]

log = logging.getLogger("agent_saga.recovery")

def default_daemon_id() -> str:
    """``recovery-<host>-<pid>-<random>``: unique per process (``_identity``)."""
    return process_identity().unique_id("recovery-", host_chars=60)


class RecoveryDaemon(Sweeping):
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
        concurrency: compensations (handler and reconciler calls) running at once.
        in_hand: sagas held at once, claimed and being resolved (default:
            ``concurrency``). A hand wider than ``concurrency`` shares each request to
            the log, the claims and the ledger among more sagas (the same step of
            different sagas goes in one round trip) without more compensations running at
            once: the others wait their turn holding their claims (renewed meanwhile).
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
        in_hand: int | None = None,
        allow: Grants | Iterable[str] | None = None,
    ) -> None:
        if isinstance(imports, str):
            raise ConfigurationError(f"imports must be a list of module names, not the string {imports!r}")
        if lease_grace < 0 or claim_ttl <= 0 or concurrency < 1:
            raise ConfigurationError(
                f"need lease_grace >= 0, claim_ttl > 0 and concurrency >= 1 (got {lease_grace}, "
                f"{claim_ttl}, {concurrency})"
            )
        if in_hand is not None and (isinstance(in_hand, bool) or not isinstance(in_hand, int) or in_hand < concurrency):
            raise ConfigurationError(
                f"in_hand must be a whole number >= concurrency ({concurrency}), got {in_hand!r}: "
                f"it is how many sagas are held at once, of which concurrency compensate at a time"
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
        # A ledger that shares the claims' store (``RedisLedger.releases_for``) journals a
        # resolved saga and releases its claim in one request.
        releases_for = getattr(ledger, "releases_for", None)
        self._journal_release = (getattr(ledger, "record_release", None)
                                 if releases_for is not None and releases_for(lock) else None)
        self.quarantine = quarantine
        self.lease_grace = lease_grace
        self.claim_ttl = claim_ttl
        self.concurrency = concurrency
        self.in_hand = concurrency if in_hand is None else in_hand
        # Sync handlers and reconcilers run on a pool of this daemon's own, not the
        # process's tool executor (an agent's tools, or its default size of cpus + 4, below
        # concurrency on a small node, where every batch of compensations queued and logged
        # a saturation warning): room for ``concurrency`` calls and as many again that ran
        # past compensation_timeout (a thread cannot be stopped; its slot is freed).
        self.executor = ToolExecutor(2 * concurrency, name="agent-saga-recovery")
        self.compensation_timeout = compensation_timeout
        #: which writer may have which handler and credential_ref run (``recovery.grants``)
        self.grants = allow if isinstance(allow, Grants) else Grants.parse(allow)
        self.daemon_id = daemon_id or default_daemon_id()
        self._clock = as_clock(clock)
        self.scan = LogScan(refs=self.source.rereads)
        self.halted: RecoveryHalted | None = None
        self.warnings: list[str] = []
        self._unknown_seen: set[str] = set()
        self._want: set[str] = set()
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

    @runs_if_discarded
    async def compact(self, grace_seconds: float, *, timeout: float | None = None) -> CompactionReport:
        """Compact the log, keeping every unresolved saga, every saga resolved less than
        ``grace_seconds`` ago and every saga with an open escalation (its evidence stays
        until a human closes it). Await it; a bare call in a script runs to completion, a
        bare call in async code raises ``ConfigurationError`` (as ``BaseWAL.compact``). Raises ``SagaError`` if the backend cannot compact,
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
        self.executor.shutdown()

    async def __aenter__(self) -> RecoveryDaemon:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        state = "halted" if self.halted else "draining" if self._draining else "ready"
        return f"<RecoveryDaemon {self.daemon_id} {self.source.description} {state}>"


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
            missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
            where = (f"; {missing!r} is not on this process's path: install it in this environment, or add "
                     f"the directory that holds it to PYTHONPATH" if missing and
                     (name.strip() + ".").startswith(missing + ".") else "")
            raise ConfigurationError(
                f"cannot import {name!r} ({type(exc).__name__}: {exc}){where}: the recovery process must "
                f"import the same handler modules as the agents, or every saga escalates"
            ) from exc
        done.append(name.strip())
    return done
