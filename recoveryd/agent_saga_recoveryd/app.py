"""The recoveryd process: one ``RecoveryDaemon`` per log, a sweep loop each, signals, health.

Lifecycle:
- start: import the handler modules (a missing one exits 2 before anything is claimed),
  open the logs, connect the shared ledger and claims, serve /metrics /livez /readyz;
  a fleet log whose server cannot be reached yet (Redis or PostgreSQL still starting, or
  failing over) does not stop the start: the process stays up, /readyz is 503 naming the
  log and the error, and opening it is tried again every ``interval`` seconds (at least
  one); that log's daemon starts sweeping once it opens. With ``--once`` it exits 1;
- run: every daemon sweeps every ``interval`` seconds; each report feeds the metrics;
- SIGTERM / SIGINT: drain. Each daemon finishes the claims in hand and takes no new one;
  the process then closes its logs and exits 0. A second signal exits at once (130):
  the claims in hand expire and another replica finishes them.
- a daemon that halts (a log it cannot read or verify) stays up, halted: /readyz fails
  and ``agent_saga_recovery_halted`` is 1 until a human repairs the log and restarts it.
- a sweep that stops early (a claims directory, journal or log it cannot write, a store
  it cannot reach) leaves the process up and unready with the reason on /readyz and
  ``agent_saga_recovery_sweep_stopped`` 1; the next sweep tries again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence

from agent_saga import configure_logging
from agent_saga.audit import EncryptedWAL, reader_encryptor
from agent_saga.errors import SagaError, WALCorrupt, WALError
from agent_saga.recovery import (
    ClaimLock,
    FileClaimLock,
    FileLedger,
    RecoveryDaemon,
    RecoveryLedger,
    SweepReport,
    default_file_paths,
    import_modules,
    open_claim_lock,
)
from agent_saga.wal import BaseWAL, open_wal, redact

from .config import Config, parse_args
from .health import HealthServer
from .metrics import RecoveryMetrics

log = logging.getLogger("agent_saga_recoveryd")


class Recoveryd:
    """The fleet process (see the module doc). ``await run()`` returns the exit code."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.metrics = RecoveryMetrics()
        self.daemons: list[RecoveryDaemon] = []
        self._wals: list[BaseWAL] = []
        self._last: dict[str, SweepReport] = {}
        self._unopened: dict[str, str] = {}  # fleet log URL -> why it cannot be opened yet
        self._draining = False
        self._signals = 0
        self.server: HealthServer | None = None
        self.started = time.monotonic()

    # ------------------------------------------------------------------ setup

    def _shared(self) -> tuple[RecoveryLedger | None, ClaimLock | None]:
        c = self.config
        if c.redis_url is None:
            return None, None
        from agent_saga.recovery import RedisLedger

        owner = c.daemon_id or None
        return (
            RedisLedger(c.redis_url, namespace=c.namespace),
            open_claim_lock(c.redis_url, namespace=c.namespace, owner=owner),
        )

    def build(self) -> None:
        """Make the daemons this configuration names (one per log)."""
        c = self.config
        import_modules(c.imports)
        encryptor = reader_encryptor(c.wal_key_file)
        ledger, lock = self._shared()

        def daemon(wal: BaseWAL | str, ledger: RecoveryLedger | None, lock: ClaimLock | None,
                   reopen: Callable[[], BaseWAL] | None = None) -> RecoveryDaemon:
            return RecoveryDaemon(
                wal, ledger=ledger, lock=lock, lease_grace=c.lease_grace, claim_ttl=c.claim_ttl,
                concurrency=c.concurrency, in_hand=c.in_hand, compensation_timeout=c.compensation_timeout,
                daemon_id=c.daemon_id, encryptor=encryptor if isinstance(wal, str) else None, reopen=reopen,
                # Replicas sharing Redis claims split the orphans (a dead one's share moves).
                shard=hasattr(lock, "members"), allow=c.allow,
            )

        for path in c.wal_paths:
            if ledger is None or lock is None:
                # Nothing is created here: an unwritable place is reported by the sweep
                # that needs it (unready, with the path), not a crash at start.
                ledger_path, claims_dir = default_file_paths(path)
                self.daemons.append(daemon(
                    path, FileLedger(c.ledger or ledger_path), FileClaimLock(c.claims or claims_dir),
                ))
            else:
                self.daemons.append(daemon(path, ledger, lock))
        def opened(url: str) -> BaseWAL:
            wal = open_wal(url)
            self._wals.append(wal)
            return wal if encryptor is None else EncryptedWAL(wal, encryptor)

        def fleet(url: str) -> RecoveryDaemon:
            # A fleet log's writer is fail-stop; after a Redis failover or restart the
            # daemon opens a new writer (a new chain in the same log) instead of stopping.
            return daemon(opened(url), ledger, lock, reopen=functools.partial(opened, url))

        self._fleet = fleet
        for url in c.wal_urls:
            try:
                self.daemons.append(fleet(url))
            except WALError as exc:
                if isinstance(exc, WALCorrupt):
                    raise
                self._cannot_open(url, exc)

    def _cannot_open(self, url: str, exc: WALError) -> None:
        first = url not in self._unopened
        self._unopened[url] = exc.message
        if first:
            log.error("%s: the log cannot be opened yet, retrying every %gs: %s", redact(url),
                      self._retry_every, exc.message)

    @property
    def _retry_every(self) -> float:
        return max(self.config.interval, 1.0)

    async def _open_when_reachable(self, url: str) -> None:
        """Try to open ``url`` every ``_retry_every`` seconds until it opens (then sweep it
        like the others) or the process drains."""
        while not self._draining:
            try:
                d = await asyncio.to_thread(self._fleet, url)
            except WALError as exc:
                self._cannot_open(url, exc)
                await asyncio.sleep(self._retry_every)
                continue
            self._unopened.pop(url, None)
            log.info("%s: the log is open now", redact(url))
            self.daemons.append(d)
            if self._draining:
                d.drain()
            await d.run(interval=self.config.interval, on_report=self.on_report)
            return

    # ------------------------------------------------------------------ health

    def livez(self) -> tuple[int, str, bytes]:
        """The liveness answer: 200 while the process runs its loop."""
        return 200, "text/plain", b"alive\n"

    def readyz(self) -> tuple[int, str, bytes]:
        """The readiness answer: 200 once every daemon completed a sweep, none is halted and
        none stopped early, unless draining; 503 naming each problem otherwise."""
        problems: list[str] = []
        if self._draining:
            problems.append("draining")
        for url, why in self._unopened.items():
            problems.append(f"{redact(url)}: the log cannot be opened yet (retrying every "
                            f"{self._retry_every:g}s): {why}")
        for d in self.daemons:
            src = d.source.description
            if d.halted is not None:
                problems.append(f"{src}: HALTED: {d.halted.message}")
                continue
            rep = self._last.get(src)
            if rep is None:
                problems.append(f"{src}: no sweep completed yet")
            elif rep.error:
                problems.append(f"{src}: last sweep stopped: {rep.error}")
        if problems:
            return 503, "text/plain", ("not ready:\n" + "\n".join(problems) + "\n").encode()
        return 200, "text/plain", b"ready\n"

    def render_metrics(self) -> tuple[int, str, bytes]:
        """The /metrics answer, readiness as /readyz says it now."""
        self.metrics.set_state(ready=self.readyz()[0] == 200, claim_ttl=self.config.claim_ttl)
        return self.metrics.render()

    async def count_escalations(self) -> None:
        """Export the open escalations of every ledger (``agent_saga_recovery_escalations_open``)
        every ``interval`` seconds; a ledger that cannot be read keeps the last counts."""
        while not self._draining:
            by_source: dict[str, int] = {}
            try:
                for ledger in {id(d.ledger): d.ledger for d in self.daemons}.values():
                    for e in await ledger.escalations():
                        by_source[e.source] = by_source.get(e.source, 0) + 1
            except SagaError as exc:
                log.debug("open escalations not counted: %s", exc)
            else:
                self.metrics.set_open_escalations(by_source)
            await asyncio.sleep(self.config.interval)

    def on_report(self, rep: SweepReport) -> None:
        """Fold one sweep's report into the metrics and the readiness state."""
        self._last[rep.source] = rep
        self.metrics.observe(rep)  # the daemon itself logs the summary of a busy sweep

    # ------------------------------------------------------------------ run

    def drain(self) -> None:
        """Finish the claims in hand, take no new one, then exit 0."""
        self._signals += 1
        if self._signals > 1:
            log.warning("second signal: exiting now; claims in hand expire and another replica finishes them")
            os._exit(130)
        log.info("draining: finishing the claims in hand, taking no new one")
        self._draining = True
        self.metrics.set_draining(True)
        for d in self.daemons:
            d.drain()

    async def run(self) -> int:
        """Sweep until stopped (SIGTERM drains); the exit status."""
        c = self.config
        try:
            self.build()
        except SagaError as exc:
            log.error("cannot start: %s", exc)
            return 2
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.drain)
        if c.metrics_port >= 0:
            self.server = HealthServer(
                {"/metrics": self.render_metrics, "/livez": self.livez, "/healthz": self.livez, "/readyz": self.readyz},
                c.bind, c.metrics_port,
            )
            port = await self.server.start()
            if c.port_file:
                _write_port(c.port_file, port)
            log.info("serving /metrics /livez /readyz on %s:%d", c.bind, port)
        if not self.metrics.available:
            log.warning("prometheus-client is not installed: /metrics answers 501 (pip install 'agent-saga[recoveryd]')")
        log.info(
            "recovering %s with handlers from %s", ", ".join(d.source.description for d in self.daemons),
            ", ".join(c.imports) or "(no --imports: every saga will escalate)",
        )
        code = 0
        try:
            if c.once:
                reports = [await d.sweep() for d in self.daemons]
                for rep in reports:
                    self.on_report(rep)
                    print(rep.summary())
                for url, why in self._unopened.items():
                    print(f"{redact(url)}: the log cannot be opened: {why}")
                if any(r.halted for r in reports):
                    code = 2
                elif any(r.escalations or r.error or r.awaits_human for r in reports) or self._unopened:
                    code = 1
            else:
                counting = asyncio.create_task(self.count_escalations(), name="escalations")
                await asyncio.gather(*(d.run(interval=c.interval, on_report=self.on_report) for d in self.daemons),
                                     *(self._open_when_reachable(url) for url in list(self._unopened)))
                counting.cancel()
                log.info("drained: every claim in hand finished; exiting")
        finally:
            for d in self.daemons:
                try:
                    await d.close()
                except Exception as exc:  # noqa: BLE001 - closing, report and go on
                    log.warning("closing %s: %s", d.source.description, exc)
            for wal in self._wals:
                try:
                    wal.close()
                except Exception as exc:  # noqa: BLE001
                    log.warning("closing a WAL: %s", exc)
            if self.server is not None:
                await self.server.close()
        return code


def _write_port(path: str, port: int) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(str(port))
    os.replace(tmp, path)  # a reader never sees a half-written number


def main(argv: Sequence[str] | None = None) -> int:
    """Console script ``agent-saga-recoveryd``; returns the exit code."""
    config = parse_args(argv)
    level = config.log_level.upper()
    configure_logging(level, json=config.log_json)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
    return asyncio.run(Recoveryd(config).run())
