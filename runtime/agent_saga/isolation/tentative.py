"""Tentative resources: a business entity stays PENDING for the saga's life, then is
resolved to COMMITTED or ROLLED_BACK at the saga boundary, crash or no crash.

    @compensator("orders.cancel")            # the rollback handler, by name: replayable
    def cancel(order_id, idempotency_key): ...

    async with saga_scope(wal) as saga:
        order = TentativeResource("order-42", rollback="orders.cancel", commit="orders.confirm",
                                  mark=lambda: db.mark_pending("order-42"), kwargs={"order_id": "order-42"})
        await order.register(saga)           # durable: PENDING
        ...                                  # leaving: COMMITTED, or ROLLED_BACK on rollback

How it stands on the engine (no special case): ``register`` runs one COMPENSABLE step,
tool ``tentative.<kind>``, whose forward is ``mark`` and whose compensation is the
rollback handler. So the registration is a chained, durable STEP_COMMITTED record naming
the handler; the saga's own rollback runs it (LIFO, with the other steps); and a saga
whose process was SIGKILLed is rolled back by the recovery daemon, which runs the same
named handler with the same idempotency key: the stranded PENDING entity is settled.
A rollback given as a callable (in-process only) cannot be replayed: recovery escalates
it (NOT_REPLAYABLE) to a human rather than guess. The commit handler runs at the commit
point (``Saga.on_commit``), before SAGA_COMPLETED is written.

Invariants:
- ``status`` is PENDING from ``register`` until the boundary; then COMMITTED (the commit
  handler, if any, returned before SAGA_COMPLETED), ROLLED_BACK (the rollback handler
  ran), or ESCALATED (the rollback failed or could not run: a human must settle it; the
  saga's ``RollbackIncomplete`` says which). A quarantined saga leaves it PENDING.
- A commit handler that raises rolls the saga back: every tentative resource of the
  saga, committed ones included, is then rolled back. So a rollback handler must accept
  an entity in either state (and is called with its idempotency key to make it safe).
- ``kwargs`` are JSON, checked for secrets before anything is written.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Mapping
from typing import Any

from ..compensation import Compensation, get_compensator
from ..context import step_id_var
from ..errors import ConfigurationError, StepOutcomeUnknown
from ..executor import get_tool_executor
from ..idempotency import idempotency_key
from ..invoke import call
from ..payloads import snapshot_mapping
from ..records import validate_id
from ..rollback import RollbackOutcome
from ..semantics import ActionSemantics

__all__ = ["COMMIT_SCOPE", "TentativeResource", "TentativeStatus"]

#: The idempotency scope of a commit handler's key (``idempotency_key(saga, step, scope)``).
COMMIT_SCOPE = "commit"

_KIND = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,63}$")


class TentativeStatus(enum.StrEnum):
    """Where a tentative resource stands (see the module doc)."""

    NEW = "NEW"  # not registered yet
    PENDING = "PENDING"
    COMMITTED = "COMMITTED"
    ROLLED_BACK = "ROLLED_BACK"
    ESCALATED = "ESCALATED"


Handler = str | Callable[..., Any]


def _check_handler(value: object, what: str, *, required: bool) -> None:
    if value is None and not required:
        return
    if isinstance(value, str):
        Compensation(handler=value)  # validates the name, naming the fix
        return
    if not callable(value):
        raise ConfigurationError(
            f"TentativeResource {what}= must be a handler name registered with @compensator "
            f"(replayable after a crash) or a callable (in-process only), got {value!r}"
        )


class TentativeResource:
    """One business entity held PENDING by a saga (see the module doc).

    Args:
        resource_id: the entity's id (``"order-42"``), as in every record header.
        rollback: the handler that undoes it: a name registered with ``@compensator``
            (the recovery daemon can run it after a crash) or a callable (in-process
            only: after a crash it is escalated, never guessed). Called with ``kwargs``.
        commit: the handler that makes it final at the commit point (name or callable),
            or ``None`` when nothing is needed beyond the saga completing.
        mark: called (sync or async, no arguments; ``idempotency_key=`` if it takes
            one) when registering, to mark the entity PENDING in its own system.
        kwargs: JSON arguments for ``rollback`` and ``commit``.
        kind: a lower-case word naming the entity kind; the step's tool is
            ``tentative.<kind>``.

    Raises ``ConfigurationError`` (naming the argument and the fix) for bad input,
    ``NotSerializable`` / ``SecretDetected`` for kwargs that cannot be written.
    """

    __slots__ = ("_commit", "_kwargs", "_mark", "_rollback", "error", "kind", "resource_id", "saga_id",
                 "status", "step_id")

    def __init__(
        self,
        resource_id: str,
        *,
        rollback: Handler,
        commit: Handler | None = None,
        mark: Callable[..., Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        kind: str = "resource",
    ) -> None:
        self.resource_id = validate_id(resource_id, "resource_id")
        _check_handler(rollback, "rollback", required=True)
        _check_handler(commit, "commit", required=False)
        if mark is not None and not callable(mark):
            raise ConfigurationError(f"TentativeResource mark= must be callable (it marks the entity PENDING), "
                                     f"got {mark!r}")
        if not isinstance(kind, str) or not _KIND.match(kind):
            raise ConfigurationError(
                f"TentativeResource kind= must be a lower-case word such as 'order' (1-64 characters "
                f"from [a-z0-9_.-]), got {kind!r}"
            )
        self._kwargs = snapshot_mapping({} if kwargs is None else kwargs, "kwargs")
        self._rollback = rollback
        self._commit = commit
        self._mark = mark
        self.kind = kind
        self.status = TentativeStatus.NEW
        self.saga_id: str | None = None
        self.step_id: str | None = None
        self.error: str | None = None

    @property
    def replayable(self) -> bool:
        """True if the rollback is a named handler a recovery daemon can run."""
        return isinstance(self._rollback, str)

    def __repr__(self) -> str:
        return f"<TentativeResource {self.kind} {self.resource_id} {self.status.value}>"

    async def register(self, saga: Any, *, timeout: float | None = None) -> TentativeResource:
        """Mark the resource PENDING in ``saga``, durably, and resolve it at its boundary.

        Returns ``self``. Raises ``ConfigurationError`` if it was registered before or
        ``saga`` is not a running saga; whatever ``mark`` raised (STEP_FAILED: it stays
        NEW and nothing is rolled back for it); ``StepOutcomeUnknown`` after ``timeout``
        (it may be marked: the rollback handler runs on rollback)."""
        if self.status is not TentativeStatus.NEW:
            raise ConfigurationError(
                f"tentative resource {self.resource_id!r} is already {self.status.value} in saga "
                f"{self.saga_id}: make a new TentativeResource for another saga"
            )
        if not callable(getattr(saga, "execute", None)) or not callable(getattr(saga, "on_exit", None)):
            raise ConfigurationError(
                f"register() takes the Saga of a saga_scope (async with saga_scope(...) as saga), got {saga!r}"
            )
        if isinstance(self._rollback, str):
            comp = Compensation(handler=self._rollback, kwargs=self._kwargs,
                                description=f"roll back tentative {self.kind} {self.resource_id}")
        else:
            comp = Compensation(fn=self._rollback, kwargs=self._kwargs,
                                description=f"roll back tentative {self.kind} {self.resource_id} (in-process only)")
        mark = self._mark

        async def forward(idempotency_key: str) -> None:
            self.step_id = step_id_var.get()
            if mark is not None:
                await call(mark, {}, idempotency_key, get_tool_executor())

        saga.on_exit(self._settle)
        saga.on_commit(self._commit_now)
        self.saga_id = saga.saga_id
        try:
            await saga.execute(
                f"tentative.{self.kind}", ActionSemantics.COMPENSABLE, forward,
                compensate=lambda _result: comp, timeout=timeout,
                policy_args={"resource_id": self.resource_id, "replayable": self.replayable},
            )
        except BaseException as exc:
            if isinstance(exc, StepOutcomeUnknown) or not isinstance(exc, Exception):
                self.status = TentativeStatus.PENDING  # it may be marked: rolled back like one
            raise
        self.status = TentativeStatus.PENDING
        return self

    async def _commit_now(self) -> None:
        if self.status is not TentativeStatus.PENDING:
            return
        handler = self._commit
        if handler is not None:
            fn = get_compensator(handler) if isinstance(handler, str) else handler
            assert self.saga_id is not None and self.step_id is not None
            key = idempotency_key(self.saga_id, self.step_id, COMMIT_SCOPE)
            try:
                await call(fn, self._kwargs, key, get_tool_executor())
            except Exception as exc:
                exc.add_note(f"agent-saga: committing tentative {self.kind} {self.resource_id!r} failed: "
                             f"the saga rolls back instead")
                raise
        self.status = TentativeStatus.COMMITTED

    def _settle(self, saga: Any) -> None:
        """At the boundary: read what the rollback did for the registration step."""
        report = getattr(saga, "rollback_report", None)
        if report is None or self.status is TentativeStatus.NEW or self.step_id is None:
            return  # completed (already COMMITTED), quarantined, or never registered
        for step in report.steps:
            if step.step_id == self.step_id:
                if step.outcome is RollbackOutcome.COMPENSATED:
                    self.status, self.error = TentativeStatus.ROLLED_BACK, None
                else:
                    self.status, self.error = TentativeStatus.ESCALATED, step.error
                return
