"""``saga_scope``: the saga boundary, and what leaving it means.

    async with saga_scope(wal, gate, name="checkout") as saga:
        await saga.execute(...)

Invariants:
- Entering writes SAGA_STARTED (made durable by the first barrier that follows) and sets
  the saga id in the logging context for the body.
- Leaving normally waits for steps still running in sibling tasks, then writes a durable
  SAGA_COMPLETED.
- Leaving with any exception (``BaseException``: cancellation and ``KeyboardInterrupt``
  too) rolls back LIFO in a task shielded from cancellation. A clean rollback re-raises
  the original exception object unchanged, with a note; a partial one raises
  ``RollbackIncomplete(report=...)`` from it. A cancellation that arrives during the
  rollback is honoured once the rollback has finished.
- A gate with ``admit_saga`` is asked before anything is written; it may refuse the
  saga (a kill-switch DRAIN): ``GateBlocked``, nothing recorded, the body never runs.
- A saga opened without a gate still obeys the process's kill switch when one is
  configured (``AGENT_SAGA_REDIS_URL``, ``AGENT_SAGA_SWITCH_STORE``, ``set_kill_switch``):
  it gets a gate that consults the kill switch and the breaker, and refuses IRREVERSIBLE
  steps as no gate would (``agent_saga.gates.no_gate_fallback``).
- A QUARANTINED saga is never rolled back automatically: leaving with its own
  ``SagaQuarantined``, or with any exception while the gate's ``quarantine_of`` names a
  quarantine on it, writes a durable SAGA_QUARANTINED (the steps left standing) instead
  of rolling back, and raises ``SagaQuarantined`` (the original exception if it was
  one, or a cancellation). A human decides; the recovery daemon skips the saga.
- The saga id is validated before anything is written: ``[A-Za-z0-9._:@/+=-]``, at most
  190 characters so that every step id ``"{saga_id}/{index}"`` is a valid id too.
- Leaving, whichever way, runs the saga's ``on_exit`` hooks once it is resolved (after the
  completion, rollback or freeze), shielded from cancellation; ``on_commit`` hooks run
  before SAGA_COMPLETED (``agent_saga.engine``).
- While the scope is open (rollback included) the saga's lease is renewed from a
  background thread (``agent_saga.leases``), never per step: SAGA_STARTED grants the
  default lease, a SAGA_LEASE record follows it when ``lease_seconds`` differs.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterable
from types import TracebackType
from typing import Any

from . import observe as _observe
from .clocks import SYSTEM_CLOCK, Clock
from .context import saga_id_var
from .engine import Saga
from .errors import ConfigurationError, RollbackIncomplete, SagaQuarantined
from .executor import get_tool_executor
from .gates import Gate, no_gate_fallback
from .leases import DEFAULT_LEASE_SECONDS, LeaseHandle, check_lease_seconds
from .leases import register as register_lease
from .leases import unregister as unregister_lease
from .records import RecordType, validate_id
from .wal.base import BaseWAL

__all__ = ["SagaScope", "saga_scope"]

_MAX_SAGA_ID = 190  # leaves room for "/<index>" within the 200-character id limit


class SagaScope:
    """The async context manager returned by ``saga_scope``; yields a ``Saga``."""

    __slots__ = (
        "_clock", "_gate", "_lease", "_lease_seconds", "_name", "_obs", "_saga", "_saga_id", "_tags",
        "_token", "_wal",
    )

    def __init__(
        self,
        wal: BaseWAL | None,
        gate: Gate | None,
        name: str | None,
        saga_id: str | None,
        tags: Iterable[str],
        clock: Clock | None,
        lease_seconds: float | None = None,
    ) -> None:
        self._lease_seconds = (
            DEFAULT_LEASE_SECONDS if lease_seconds is None else check_lease_seconds(lease_seconds)
        )
        self._lease: LeaseHandle | None = None
        if gate is None:
            gate = no_gate_fallback()  # a configured kill switch still stops a saga without a gate
        if gate is not None and not callable(getattr(gate, "decide", None)):
            raise ConfigurationError(
                f"gate must implement the Gate protocol (async def decide(request) -> "
                f"GateDecision), got {gate!r}"
            )
        if wal is not None and not isinstance(wal, BaseWAL):
            raise ConfigurationError(f"wal must be a BaseWAL (e.g. FileWAL(path)), got {wal!r}")
        if name is not None and not isinstance(name, str):
            raise ConfigurationError(f"name must be a string, got {name!r}")
        if isinstance(tags, str):
            raise ConfigurationError(f"tags must be an iterable of strings, not the string {tags!r}")
        self._tags = tuple(tags)
        for tag in self._tags:
            if not isinstance(tag, str) or not tag:
                raise ConfigurationError(f"tags must be non-empty strings, got {tag!r}")
        if saga_id is None:
            saga_id = f"{name or 'saga'}-{uuid.uuid4().hex[:12]}"
            what = "saga name (it prefixes the saga id)"
        else:
            what = "saga_id"
        validate_id(saga_id, what)
        if len(saga_id) > _MAX_SAGA_ID:
            raise ConfigurationError(f"{what} {saga_id!r} is longer than {_MAX_SAGA_ID} characters")
        self._saga_id = saga_id
        self._wal = wal
        self._gate = gate
        self._name = name
        self._clock = clock or SYSTEM_CLOCK
        self._saga: Saga | None = None
        self._token: Any = None
        self._obs: tuple[_observe.Observer, Any] | None = None

    async def __aenter__(self) -> Saga:
        if self._saga is not None:
            raise ConfigurationError(f"saga_scope for {self._saga_id} was already entered: make a new one")
        wal = self._wal
        if wal is None:
            from .wal import get_default_wal

            wal = get_default_wal()
        admit = getattr(self._gate, "admit_saga", None)
        if admit is not None:  # a DRAIN refuses new sagas before anything is written
            await admit(self._saga_id, self._name, self._tags)
        saga = Saga(
            self._saga_id, self._name, self._tags, wal, self._gate, self._clock, get_tool_executor()
        )
        started: dict[str, Any] = {"name": self._name, "tags": list(self._tags)}
        obs = _observe.current
        if obs is not None:  # telemetry: the saga's span, and its trace id for a recovery daemon
            self._obs = (obs, _observe.safely(obs.saga_started, self._saga_id, self._name))
            traceparent = _observe.safely(obs.traceparent)
            if traceparent:
                started["traceparent"] = traceparent
        try:
            wal.append(RecordType.SAGA_STARTED.value, self._saga_id, None, started)
            if self._lease_seconds != DEFAULT_LEASE_SECONDS:
                wal.append(RecordType.SAGA_LEASE.value, self._saga_id, None, {"lease_seconds": self._lease_seconds})
        except BaseException as exc:
            self._observed_end("FAILED", exc)
            raise
        self._lease = register_lease(saga, self._saga_id, wal, self._lease_seconds)
        self._saga = saga
        self._token = saga_id_var.set(self._saga_id)
        return saga

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if self._obs is None:
            return await self._exit(exc)
        try:
            suppressed = await self._exit(exc)
        except BaseException as out:
            self._observed_end(None, out)
            raise
        self._observed_end(None, exc)
        return suppressed

    def _observed_end(self, status: str | None, error: BaseException | None) -> None:
        """Tell the observer how the saga left its scope (once)."""
        if self._obs is None:
            return
        (obs, handle), self._obs = self._obs, None
        if status is None:
            state = self._saga.status if self._saga is not None else "FAILED"
            status = state if state in ("COMPLETED", "ROLLED_BACK", "QUARANTINED") else "FAILED"
            if status == "COMPLETED" and error is not None:
                status = "FAILED"  # the completion record itself failed
        _observe.safely(obs.saga_ended, handle, status, error)

    async def _exit(self, exc: BaseException | None) -> bool:
        saga = self._saga
        assert saga is not None, "__aexit__ without __aenter__"
        raised_here = False
        frozen: dict[str, Any] | None = None
        try:
            if exc is None:
                try:
                    await saga._complete()
                    return False
                except BaseException as late:
                    if saga.status == "COMPLETED":
                        raise  # the completion record itself failed: nothing to undo
                    # Interrupted while waiting for sibling steps: this exception leaves the
                    # scope, so the saga rolls back like for any other.
                    exc, raised_here = late, True
            frozen = self._quarantine(exc)
            if frozen is not None:
                await saga._freeze(frozen, exc)
            else:
                report, cancelled = await saga._rollback(exc)
        finally:
            saga_id_var.reset(self._token)
            if self._lease is not None:
                unregister_lease(self._lease)
            if saga._exit_hooks:
                await _shielded(saga._run_exit_hooks())
        if frozen is not None:
            return self._frozen_exit(saga, exc, raised_here)
        if report.clean:
            exc.add_note(f"agent-saga: {report.summary()}")
            failure: BaseException = exc
        else:
            failure = RollbackIncomplete(
                f"{report.summary()}; not restored: "
                + "; ".join(f"{s.step_id} ({s.tool}) {s.outcome.value}: {s.error}" for s in report.not_restored)
                + ". A human must resolve these steps: see exc.report and the ESCALATED / "
                "COMPENSATION_FAILED records in the WAL",
                report=report, saga_id=saga.saga_id,
            )
        if cancelled and not isinstance(exc, asyncio.CancelledError):
            raise asyncio.CancelledError(
                f"cancelled during the rollback of saga {saga.saga_id} (finished first)"
            ) from failure
        if failure is exc:
            if raised_here:
                raise exc
            return False  # re-raise the original exception object unchanged
        raise failure from exc


    def _quarantine(self, exc: BaseException) -> dict[str, Any] | None:
        """The quarantine that freezes this saga instead of rolling it back, or ``None``."""
        if isinstance(exc, SagaQuarantined) and exc.saga_id == self._saga_id:
            return dict(exc.lever) if exc.lever else {"reason": exc.reason, "by": exc.decided_by}
        gate = self._gate
        if gate is None and self._saga is not None:  # adopted mid-saga, or the zero-setup switch's now
            gate = self._saga.gate if self._saga.gate is not None else no_gate_fallback()
        ask = getattr(gate, "quarantine_of", None)
        if ask is None:
            return None
        try:
            lever = ask(self._saga_id)
        except Exception:  # noqa: BLE001 - cannot tell: rolling back is the default
            return None
        return dict(lever) if lever else None

    def _frozen_exit(self, saga: Saga, exc: BaseException, raised_here: bool) -> bool:
        standing = len(saga._done)
        note = (f"agent-saga: saga {saga.saga_id} is quarantined: frozen, NOT rolled back; {standing} "
                f"step(s) left standing for a human (SAGA_QUARANTINED in the WAL)")
        if (isinstance(exc, SagaQuarantined) and exc.saga_id == saga.saga_id) or not isinstance(exc, Exception):
            exc.add_note(note)
            if raised_here:
                raise exc
            return False
        raise SagaQuarantined(
            f"saga {saga.saga_id} left its scope with {type(exc).__name__}: {exc}; it is quarantined, so it "
            f"was NOT rolled back: {standing} step(s) are left standing for a human (SAGA_QUARANTINED in the WAL)",
            reason="quarantined", saga_id=saga.saga_id,
        ) from exc


async def _shielded(coro: Any) -> None:
    """Run ``coro`` to its end even if the caller is cancelled meanwhile (the cancellation
    is re-raised once it finished): exit hooks release what the saga held."""
    task = asyncio.ensure_future(coro)
    cancelled = False
    while not task.done():
        try:
            await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                break
            cancelled = True
    if cancelled:
        raise asyncio.CancelledError("cancelled while the saga's exit hooks ran (they finished first)")


def saga_scope(
    wal: BaseWAL | None = None,
    gate: Gate | None = None,
    name: str | None = None,
    *,
    saga_id: str | None = None,
    tags: Iterable[str] = (),
    clock: Clock | None = None,
    lease_seconds: float | None = None,
) -> SagaScope:
    """Open a saga: ``async with saga_scope(...) as saga: await saga.execute(...)``.

    Args:
        wal: the write-ahead log (default: ``agent_saga.wal.get_default_wal()``).
        gate: the pre-flight gate consulted before every step; without one, IRREVERSIBLE
            steps are refused.
        name: a readable prefix for the generated saga id (``"{name}-{12 hex}"``).
        saga_id: an explicit id (for example to correlate with a request id).
        tags: strings shown to the gate and written in SAGA_STARTED.
        clock: the time seam for retry back-off (tests pass a fake one).
        lease_seconds: how long after this process's last sign of life a recovery daemon
            may take the saga over (default ``DEFAULT_LEASE_SECONDS``, 30). Renewed every
            third of it while the scope is open.

    Guarantees: any exception leaving the block rolls back every committed or unknown step
    LIFO, shielded from cancellation; the original exception propagates after a clean
    rollback, ``RollbackIncomplete`` (with ``.report``) after a partial one; normal exit
    writes a durable SAGA_COMPLETED. Raises ``ConfigurationError`` at once for invalid
    arguments (an id that is not ``[A-Za-z0-9._:@/+=-]``, a gate without ``decide``).
    """
    return SagaScope(wal, gate, name, saga_id, tags, clock, lease_seconds)

