"""The exception tree of agent-saga: one root, the meaning carried by the type.

    SagaError                      every error this library raises on purpose
    ├── SagaRefused                a control refused the step; nothing happened
    │   └── GateBlocked            the pre-flight gate said BLOCK (or approval was denied)
    │       └── SagaQuarantined    a kill-switch QUARANTINE froze the saga: no rollback
    ├── StepOutcomeUnknown         the step may or may not have happened (timeout)
    ├── RollbackIncomplete         a rollback left at least one step not restored
    ├── CompensationError          a compensation could not be built or run
    │   └── HandlerNotRegistered   a named handler is not in this process's registry
    ├── ConfigurationError         misuse of the API; the message says what to do
    │   ├── NotSerializable        a value that must cross a process boundary is not JSON
    │   └── SecretDetected         a value that looks like a secret would enter the WAL
    └── WALError                   the write-ahead log failed; nothing was silently dropped
        ├── WALStalled             a durability fence did not complete within its bound
        ├── WALBackpressure        too many records are waiting to be written (RAISE policy)
        ├── WALClosed              the log is closed
        ├── WALCorrupt             a record cannot be read; names the line and the fix
        ├── WALKeyMissing          a record is encrypted and this reader has no key for it
        └── WALDecryptFailed       an encrypted record did not authenticate (wrong key, altered)

Every error carries the typed fields that apply (``saga_id``, ``step_id``, ``tool``) and a
message that says what was refused, why, and what to do. Backend errors are chained with
``raise ... from``.
"""

from __future__ import annotations

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
    """The pre-flight gate refused the step (BLOCK verdict or a denied approval)."""

    def __init__(self, message: str, *, reason: str = "", decided_by: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.reason = reason
        self.decided_by = decided_by


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

    def __init__(self, handler: str, **kw: Any) -> None:
        super().__init__(
            f"compensation handler {handler!r} is not registered in this process: import the "
            f"module that declares @compensator({handler!r}) before running or recovering "
            f"this saga",
            **kw,
        )
        self.handler = handler


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
