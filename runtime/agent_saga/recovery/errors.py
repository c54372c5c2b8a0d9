"""The errors recovery raises, under the library's one root (``SagaError``).

    SagaError
    └── RecoveryError              recovery could not do what it was asked
        ├── RecoveryHalted         fail-closed: unreadable log or journal; a human must look
        │   └── LedgerCorrupt      the recovery journal itself cannot be read
        ├── ClaimStoreUnavailable  the claim/ledger server cannot be reached (transient);
        │                          also a ``StoreUnavailable`` (agent_saga.errors)
        ├── LocationUnavailable    a file or directory recovery needs (the log, its journal,
        │                          its claims) cannot be read or written: it names the path
        └── ClaimLost              a claim expired or was taken while a saga was in hand

``RecoveryHalted`` is sticky: a daemon that raised it sweeps no more until it is rebuilt,
because an unparseable record or a missing decryption key means the state it would act
on is unknown, and acting on unknown state is how money goes missing.
"""

from __future__ import annotations

from typing import Any

from ..errors import SagaError, StoreUnavailable

__all__ = [
    "ClaimLost",
    "ClaimStoreUnavailable",
    "LedgerCorrupt",
    "LocationUnavailable",
    "RecoveryError",
    "RecoveryHalted",
    "location_error",
]


class RecoveryError(SagaError):
    """Recovery could not do what it was asked; the message says what and what to do."""


class RecoveryHalted(RecoveryError):
    """A sweep met state it cannot read and stopped without acting (fail-closed).

    ``location`` names the record or journal line; the daemon stays halted until it is
    rebuilt after a human has repaired or explained the damage.
    """

    def __init__(self, message: str, *, location: str = "", **kw: Any) -> None:
        super().__init__(message, **kw)
        self.location = location


class LedgerCorrupt(RecoveryHalted):
    """A complete line of the recovery journal cannot be read."""


class ClaimStoreUnavailable(RecoveryError, StoreUnavailable):
    """The store behind claims or the ledger could not be reached, refused a request or
    lost its reply. The message says what is true for that request: a claim or a read
    that fails claimed or acted on nothing; a write made after acting says what ran and
    was not recorded (a compensation whose done entry was not written is called again by
    the next sweep, with the same idempotency key)."""


class ClaimLost(RecoveryError):
    """The claim on a saga expired or was taken by another daemon mid-resolution; the
    saga was left for whoever holds it now."""


class LocationUnavailable(RecoveryError):
    """A file or directory recovery needs cannot be read or written (a read-only mount, a
    missing directory, a full disk). ``path`` names it; the message says how to fix it.
    Not a halt: the saga at hand stops where it is and the next sweep resumes it from the
    log (a compensation that ran but whose done entry could not be written is called
    again, with the same idempotency key)."""

    def __init__(self, message: str, *, path: str, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.path = path


def location_error(exc: OSError, path: str, what: str, fix: str, *, verb: str = "write") -> LocationUnavailable:
    """A ``LocationUnavailable`` for ``exc`` met on ``path`` (``what`` it is, ``fix``: what to do)."""
    reason = exc.strerror or str(exc) or type(exc).__name__
    return LocationUnavailable(f"recovery cannot {verb} {what} {path!r}: {reason}. {fix}", path=path)
