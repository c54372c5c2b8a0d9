"""The exception tree of agent-saga: one root, the meaning carried by the type.

    SagaError                        every error this library raises on purpose
    ├── SagaRefused                  a control refused the step; nothing happened
    │   ├── GateBlocked              the pre-flight gate said BLOCK (or approval was denied)
    │   │   └── SagaQuarantined      a kill-switch QUARANTINE froze the saga: no rollback
    │   ├── PasskeyRefused           a passkey does not approve this action (controls.approvals)
    │   └── SpeculationRefused       a speculation may not run, or a lease not redeem (speculation)
    ├── StepOutcomeUnknown           the step may or may not have happened (timeout)
    ├── RollbackIncomplete           a rollback left at least one step not restored
    ├── CompensationError            a compensation could not be built or run
    │   └── HandlerNotRegistered     a named handler is not in this process's registry
    ├── ConfigurationError           misuse of the API; the message says what to do
    │   ├── NotSerializable          a value that must cross a process boundary is not JSON
    │   └── SecretDetected           a value that looks like a secret would enter the WAL
    ├── StoreUnavailable             a store behind a control could not be read or written;
    │   │                            ``store`` names it (never with a password)
    │   ├── LimitStoreUnavailable    limit windows (controls.limits): budgets fail closed
    │   ├── SwitchStoreUnavailable   kill-switch levers (controls.killswitch)
    │   ├── ApprovalStoreUnavailable approval requests (controls.approvals): denies
    │   ├── RoutingUnavailable       no model route has been read yet (routing): refuses calls
    │   ├── ClaimStoreUnavailable    recovery claims or ledger (recovery); also a RecoveryError
    │   └── LockStoreUnavailable     semantic locks (isolation): nothing claimed or freed
    ├── SemanticLockTimeout          a lock wait ran out; ``holder`` names the saga (isolation)
    ├── SemanticLockNotHeld          a release by a saga that does not hold it (isolation)
    ├── SnapshotMissing              a snapshot cannot be read back (isolation)
    ├── ApprovalRefused              a decision that cannot be recorded (controls.approvals)
    ├── NotifierError                an approval notifier failed (controls.approvals)
    ├── CodemodError                 a repository edit could not be made or undone (codemod)
    │   ├── CodemodRefused           the target repository is not clean, or moved: nothing changed
    │   └── VerifyFailed             the verify command failed in the shadow: target untouched
    ├── RoutingRefused               no model host answered a call: every candidate's reason (routing)
    ├── ModelActionRefused           a model's answer was still malformed after one repair (routing)
    ├── DriftedSource                a source no longer hashes to its receipt (contextbroker)
    ├── RecoveryError                recovery could not do what it was asked (recovery)
    │   ├── RecoveryHalted           fail-closed: unreadable log or journal; a human must look
    │   │   └── LedgerCorrupt        the recovery journal itself cannot be read
    │   ├── ClaimStoreUnavailable    (see StoreUnavailable)
    │   ├── LocationUnavailable      a file or directory recovery needs cannot be read or written
    │   ├── ClaimLost                a claim expired or was taken while a saga was in hand
    │   └── WriterBusy               another process holds the log's writer lock
    └── WALError                     the write-ahead log failed; nothing was silently dropped
        ├── WALStalled               a durability fence did not complete within its bound
        ├── WALBackpressure          too many records are waiting to be written (RAISE policy)
        ├── WALClosed                the log is closed
        ├── WALCorrupt               a record cannot be read; names the line and the fix
        ├── WALKeyMissing            a record is encrypted and this reader has no key for it
        ├── WALDecryptFailed         an encrypted record did not authenticate (wrong key, altered)
        └── CompactionAborted        a compaction stopped before changing anything (wal)

Signals that never leave a control: the gate turns each into a BLOCK verdict naming what
could not be read (they are public so a custom scope, rule or reader can raise them):

    ValueError
    └── LeverUnreadable              a kill-switch document or scope (controls.killswitch)
    Exception
    ├── LimitUnreadable              a limit cannot price a call (controls.limits)
    ├── ScopeUnreadable              a scope cannot read its key (controls.limits)
    └── RuleUnreadable               a rule cannot read a call's arguments (controls.gate)

The classes drawn without a package are defined here; the others in the package named,
each re-exported by that package's ``__init__`` (a test keeps this drawing and the
public exceptions in step). Every error carries the typed fields that apply
(``saga_id``, ``step_id``, ``tool``) and a message that says what was refused, why, and
what to do. Backend errors are chained with ``raise ... from``.
"""

from __future__ import annotations

import keyword
import re
from collections.abc import Iterable
from typing import Any


class SagaError(Exception):
    """Root of every error agent-saga raises on purpose."""

    def __init__(
        self,
        message: str,
        *,
        saga_id: str | None = None,
        step_id: str | None = None,
        tool: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.saga_id = saga_id
        self.step_id = step_id
        self.tool = tool


class SagaRefused(SagaError):
    """A control refused the step before any side effect: the effect did not happen."""


class GateBlocked(SagaRefused):
    """The pre-flight gate refused the step (BLOCK verdict or a denied approval).

    ``decided_by`` is who decided (a person, a lever's author, the gate); ``control`` is
    which control refused (the PreFlightGate's stage: ``kill_switch``, ``limits``,
    ``breaker``, ``approval``, ``policy``, ``rules``...; else who decided)."""

    def __init__(
        self, message: str, *, reason: str = "", decided_by: str = "", control: str = "", **kw: Any
    ) -> None:
        super().__init__(message, **kw)
        self.reason = reason
        self.decided_by = decided_by
        self.control = control or decided_by


class SagaQuarantined(GateBlocked):
    """A QUARANTINE lever froze the saga: its next step was refused and, leaving its
    scope, the saga is NOT rolled back (SAGA_QUARANTINED): its completed steps stay as
    they are, the recovery daemon skips it, and a human decides. ``lever`` is the
    quarantine (JSON) when known."""

    def __init__(self, message: str, *, lever: dict[str, Any] | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.lever = lever


class StepOutcomeUnknown(SagaError):
    """The step timed out: it may have happened. Never assumed not to have happened."""


class RollbackIncomplete(SagaError):
    """A rollback finished with at least one step not restored; ``report`` says which."""

    def __init__(self, message: str, *, report: Any, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.report = report


class CompensationError(SagaError):
    """A compensation could not be derived, built or run."""


class HandlerNotRegistered(CompensationError):
    """A compensation names a handler this process has not registered (``@compensator``)."""

    def __init__(self, handler: str, params: Iterable[str] = (), **kw: Any) -> None:
        name = re.sub(r"\W", "_", handler.rsplit(".", 1)[-1]) or "undo"
        if not name.isidentifier() or keyword.iskeyword(name):
            name = f"undo_{name}"
        args = [p for p in params if isinstance(p, str) and p.isidentifier() and p != "idempotency_key"]
        signature = ", ".join(["*", *args, "idempotency_key=None"]) if args else "*, idempotency_key=None"
        super().__init__(
            f"compensation handler {handler!r} is not registered in this process, so nothing undid this "
            f"step. Register it before the saga runs, in every process that may roll it back or recover "
            f"it: `@compensator({handler!r})` on `def {name}({signature}): ...` (from agent_saga import "
            f"compensator), or import the module that declares it",
            **kw,
        )
        self.handler = handler
        #: The decorator line that registers the handler (what to add).
        self.fix = f"@compensator({handler!r})"


class ConfigurationError(SagaError):
    """The API was used in a way that cannot work; the message says what to do instead."""


class NotSerializable(ConfigurationError):
    """A value that must cross a process boundary (WAL, Redis) is not JSON-serialisable."""

    def __init__(self, message: str, *, key: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.key = key


class SecretDetected(ConfigurationError):
    """A value that looks like a credential would be written to the WAL."""

    def __init__(self, message: str, *, key: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.key = key


class StoreUnavailable(SagaError):
    """A store behind a control (limit windows, kill-switch levers, approval requests,
    recovery claims) could not be read or written.

    ``store`` names the store, without a password (``RedisLimitStore(redis://host:6379/0)``).
    Each control decides what that means (budgets and approvals fail closed, the kill
    switch honours its last known state for a grace window): catch the subclass of the
    control you called, or this base to handle every store the same way.
    """

    def __init__(self, message: str, *, store: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.store = store


class WALError(SagaError):
    """The write-ahead log failed. Records are never dropped silently."""


class WALStalled(WALError):
    """A durability fence did not complete within its bound (wedged or failing device)."""


class WALBackpressure(WALError):
    """More records are waiting to be written than the WAL accepts (RAISE policy)."""


class WALClosed(WALError):
    """The WAL was closed; no further appends or fences are possible."""


class WALCorrupt(WALError):
    """A stored record cannot be read. Names the location and the way forward."""

    def __init__(self, message: str, *, location: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.location = location


class WALKeyMissing(WALError):
    """A record is encrypted and this reader has no key for it (``kid``): nothing is guessed.

    Set ``AGENT_SAGA_WAL_KEY`` (with every key id still in the log) or pass the encryptor.
    """

    def __init__(self, message: str, *, kid: str | None = None, seq: int | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.kid = kid
        self.seq = seq


class WALDecryptFailed(WALError):
    """An envelope did not authenticate: the key is wrong for its id, or it was altered."""

    def __init__(self, message: str, *, kid: str | None = None, seq: int | None = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.kid = kid
        self.seq = seq
