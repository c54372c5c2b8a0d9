"""``FileApprovalStore``: approval requests and decisions as JSON files in a directory.

One machine: the CLI on that machine (``--store DIR``) can answer. See ``_store`` for the
interface and its invariants (a decision is written once; requests change by
compare-and-set under a lock file).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator

from ._model import ApprovalRequest, Decision
from ._store import ApprovalRefused, ApprovalStoreUnavailable, Change

__all__ = ["FileApprovalStore"]


class FileApprovalStore:
    """Requests and decisions as JSON files in a directory (default
    ``./agent-saga-approvals``): ``<id>.json``, ``<id>.decision.json`` and, once its
    approval was used, ``<id>.consumed``. One machine;
    the CLI on that machine (``--store DIR``) can answer."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = os.fspath(directory or "agent-saga-approvals")
        self._tlock = threading.Lock()

    def describe(self) -> str:
        """``FileApprovalStore(<directory>)``."""
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
        """Store ``request`` unless one with its id exists; return (the stored one, created)."""
        with self._locked():
            existing = self._read(request.id)
            if existing is not None:
                return existing, False
            self._write(self._path(request.id), request.to_doc())
            return request.with_decision(None), True

    def get(self, request_id: str) -> ApprovalRequest | None:
        """The request with its decision, if any."""
        return self._read(request_id)

    def update(self, request_id: str, change: Change) -> ApprovalRequest | None:
        """Apply ``change`` to the request under the directory's lock; the request afterwards."""
        with self._locked():
            current = self._read(request_id)
            if current is None:
                return None
            new = change(current)
            if new is None:
                return current
            self._write(self._path(request_id), new.to_doc())
            return new.with_decision(current.decision)

    def decide(self, request_id: str, decision: Decision, *,
               replaces: Decision | None = None) -> ApprovalRequest | None:
        """Write ``decision`` unless the request has one, or in place of exactly
        ``replaces`` (an approval the caller judged unproven); the request as stored now."""
        with self._locked():
            current = self._read(request_id)
            if current is None:
                return None
            if current.decision is not None and (replaces is None or not replaces.same_as(current.decision)
                                                 or replaces.signed != current.decision.signed):
                return current
            self._write(self._path(request_id, ".decision.json"), decision.to_doc(request_id, current.namespace))
            return current.with_decision(decision)

    def mark_consumed(self, request: ApprovalRequest, by: str, now: float) -> str | None:
        """Record, once, that ``request``'s approval was used (``<id>.consumed``): ``None``
        when this call recorded it, else the earlier record."""
        from ...clocks import format_instant

        path = self._path(request.id, ".consumed")
        mine = json.dumps({"requestId": request.id, "by": by, "at": format_instant(now)})
        with self._locked():
            try:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return self._load(path) or "(an empty record)"
            except OSError as exc:
                raise self._unavailable(exc) from exc
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(mine + "\n")
                f.flush()
                os.fsync(f.fileno())
        return None

    def list(self, *, pending_only: bool = False) -> list[ApprovalRequest]:
        """Requests, newest first (``pending_only``: those without a decision)."""
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
        """Nothing to release."""
        pass
