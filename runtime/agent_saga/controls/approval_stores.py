"""Where approval requests and decisions live while a human decides.

``FileApprovalStore`` (one machine: a directory) and ``RedisApprovalStore`` (the policy
plane, ``agent_saga.controls.approval_redis``) hold the two documents of
``agent_saga.controls.approval_docs``: the request, written and updated by agents, and
the decision, written once by whoever decides. The agent that asked waits for the
decision to land in the store; no connection into the agent is ever needed.

Invariants:
- ``decide`` writes a decision only if there is none: a decision, once made, is never
  overwritten, whoever tries (the CLI, the operator, an agent giving up).
- ``update`` changes the request document by compare-and-set (a lock file on disk, a
  Lua script in Redis): two agents never both use one approval.
- A store that cannot be reached raises ``ApprovalStoreUnavailable`` naming it; the
  gateway then denies (approvals fail closed).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Callable, Iterator
from typing import Protocol, runtime_checkable

from ..errors import SagaError
from .approval_docs import ApprovalRequest, Decision, action_digest, request_id_for
from .clocks import format_instant

__all__ = [
    "ApprovalRefused",
    "ApprovalRequest",
    "ApprovalStore",
    "ApprovalStoreUnavailable",
    "Decision",
    "FileApprovalStore",
    "action_digest",
    "decide_request",
    "open_approval_store",
    "request_id_for",
    "resolve_id",
]


class ApprovalStoreUnavailable(SagaError):
    """The approval store could not be read or written; ``store`` names it."""

    def __init__(self, message: str, *, store: str) -> None:
        super().__init__(message)
        self.store = store


class ApprovalRefused(SagaError):
    """A decision that cannot be recorded: unknown id, already decided, expired, no
    approver. The message says which and what to do."""


Change = Callable[[ApprovalRequest], "ApprovalRequest | None"]


@runtime_checkable
class ApprovalStore(Protocol):
    """Blocking primitives (the gateway calls them in a worker thread). Each raises
    ``ApprovalStoreUnavailable`` when the store cannot be reached."""

    def describe(self) -> str: ...

    def create(self, request: ApprovalRequest) -> tuple[ApprovalRequest, bool]:
        """Store ``request`` unless one with its id exists; return (the stored one, created)."""
        ...

    def get(self, request_id: str) -> ApprovalRequest | None:
        """The request with its decision, if any."""
        ...

    def update(self, request_id: str, change: Change) -> ApprovalRequest | None:
        """Apply ``change`` to the request document atomically (compare-and-set, retried on
        a concurrent write); ``change`` returns the new request or ``None`` (no change).
        Returns the request afterwards (``None`` if there is none)."""
        ...

    def decide(self, request_id: str, decision: Decision) -> ApprovalRequest | None:
        """Write ``decision`` unless the request already has one; return the request with
        the decision that is stored now (``None`` if there is no such request)."""
        ...

    def list(self, *, pending_only: bool = False) -> list[ApprovalRequest]:
        """Requests, newest first (``pending_only``: those without a decision)."""
        ...

    def close(self) -> None: ...


def decide_request(
    store: ApprovalStore,
    request_id: str,
    *,
    approved: bool,
    approver: str,
    now: float,
    note: str | None = None,
    break_glass: bool = False,
    source: str = "",
) -> ApprovalRequest:
    """Record a human's decision on a pending request (the CLI, ``ApprovalGateway.decide``).

    ``request_id`` may be a unique prefix. Raises ``ApprovalRefused`` for no approver, an
    unknown or ambiguous id, a request already decided or past its deadline;
    ``ApprovalStoreUnavailable`` if the store cannot be reached."""
    approver = (approver or "").strip()
    if not approver:
        raise ApprovalRefused("an approval needs --approver NAME: an anonymous approval is an audit trail "
                              "that proves nothing")
    if break_glass and not (note or "").strip():
        raise ApprovalRefused("a break-glass approval needs --note: why the normal chain was bypassed is what "
                              "the review will ask")
    full = resolve_id(store, request_id)
    current = store.get(full)
    if current is None:
        raise ApprovalRefused(f"approval request {full} disappeared from {store.describe()}")
    if current.decided:
        raise ApprovalRefused(_already(current))
    if now >= current.deadline:
        raise ApprovalRefused(f"approval request {full} expired at {format_instant(current.deadline)} (expiry "
                              f"denies); the agent must ask again")
    mine = Decision("Approved" if approved else "Denied", approver, now, current.arguments_digest,
                    (note or "").strip() or None, source or _source(), bool(break_glass and approved))
    after = store.decide(full, mine)
    if after is None or not mine.same_as(after.decision):
        raise ApprovalRefused(_already(after or current))
    return after


def _already(r: ApprovalRequest) -> str:
    who = f" by {r.approver}" if r.approver else ""
    return f"approval request {r.id} was already {r.state.lower()}{who}; a decision cannot be changed"


def _source() -> str:
    import socket

    return f"cli:{socket.gethostname()}:{os.getpid()}"


def resolve_id(store: ApprovalStore, request_id: str) -> str:
    """The full id of the request ``request_id`` names (a unique prefix is enough)."""
    text = (request_id or "").strip().rstrip(".")
    if not text:
        raise ApprovalRefused("name the approval request: agent-saga approvals list shows the ids")
    if store.get(text) is not None:
        return text
    matches = [r.id for r in store.list() if r.id.startswith(text)]
    if not matches:
        raise ApprovalRefused(f"no approval request {text!r} in {store.describe()} (see agent-saga approvals list)")
    if len(matches) > 1:
        raise ApprovalRefused(f"{text!r} matches {len(matches)} approval requests; give more of the id")
    return matches[0]


# ============================================================================ file
class FileApprovalStore:
    """Requests and decisions as JSON files in a directory (default
    ``./agent-saga-approvals``): ``<id>.json`` and ``<id>.decision.json``. One machine;
    the CLI on that machine (``--store DIR``) can answer."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = os.fspath(directory or "agent-saga-approvals")
        self._tlock = threading.Lock()

    def describe(self) -> str:
        return f"FileApprovalStore({self.directory})"

    def __repr__(self) -> str:
        return self.describe()

    def _path(self, request_id: str, suffix: str = ".json") -> str:
        if not request_id or "/" in request_id or request_id.startswith(".") or request_id.endswith(".decision"):
            raise ApprovalRefused(f"{request_id!r} is not an approval request id")
        return os.path.join(self.directory, request_id + suffix)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        import fcntl

        with self._tlock:
            try:
                os.makedirs(self.directory, exist_ok=True)
                lock = open(os.path.join(self.directory, ".lock"), "a+")  # noqa: SIM115
            except OSError as exc:
                raise self._unavailable(exc) from exc
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                yield
            finally:
                lock.close()

    def _unavailable(self, exc: BaseException) -> ApprovalStoreUnavailable:
        return ApprovalStoreUnavailable(f"{self.describe()} failed ({type(exc).__name__}: {exc})",
                                        store=self.describe())

    def _load(self, path: str) -> str | None:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self._unavailable(exc) from exc

    def _read(self, request_id: str) -> ApprovalRequest | None:
        raw = self._load(self._path(request_id))
        if raw is None:
            return None
        raw_decision = self._load(self._path(request_id, ".decision.json"))
        try:
            request = ApprovalRequest.from_json(raw)
            return request.with_decision(None if raw_decision is None else Decision.from_doc(json.loads(raw_decision)))
        except ValueError as exc:
            raise self._unavailable(exc) from exc

    def _write(self, path: str, doc: object) -> None:
        tmp = f"{path}.{os.getpid()}.tmp"
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(doc, indent=2, sort_keys=True) + "\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            raise self._unavailable(exc) from exc

    def create(self, request: ApprovalRequest) -> tuple[ApprovalRequest, bool]:
        with self._locked():
            existing = self._read(request.id)
            if existing is not None:
                return existing, False
            self._write(self._path(request.id), request.to_doc())
            return request.with_decision(None), True

    def get(self, request_id: str) -> ApprovalRequest | None:
        return self._read(request_id)

    def update(self, request_id: str, change: Change) -> ApprovalRequest | None:
        with self._locked():
            current = self._read(request_id)
            if current is None:
                return None
            new = change(current)
            if new is None:
                return current
            self._write(self._path(request_id), new.to_doc())
            return new.with_decision(current.decision)

    def decide(self, request_id: str, decision: Decision) -> ApprovalRequest | None:
        with self._locked():
            current = self._read(request_id)
            if current is None or current.decided:
                return current
            self._write(self._path(request_id, ".decision.json"), decision.to_doc(request_id, current.namespace))
            return current.with_decision(decision)

    def list(self, *, pending_only: bool = False) -> list[ApprovalRequest]:
        try:
            names = sorted(n for n in os.listdir(self.directory)
                           if n.endswith(".json") and not n.endswith(".decision.json"))
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise self._unavailable(exc) from exc
        out = [r for r in (self._read(n[:-5]) for n in names) if r is not None]
        if pending_only:
            out = [r for r in out if not r.decided]
        return sorted(out, key=lambda r: r.requested_at, reverse=True)

    def close(self) -> None:
        pass


def open_approval_store(target: str) -> ApprovalStore:
    """A store from a ``redis://`` URL or a directory path."""
    if target.startswith(("redis://", "rediss://", "unix://")):
        from .approval_redis import RedisApprovalStore

        return RedisApprovalStore(target)
    return FileApprovalStore(target)
