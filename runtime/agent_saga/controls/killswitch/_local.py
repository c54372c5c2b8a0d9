"""``FileSwitchStore``: kill-switch levers in this process, or in a JSON file on this host.

It logs a WARNING when created: a kill switch that stops one process is not a kill
switch for a fleet (``RedisSwitchStore`` is). See ``_store`` for the interface.

A switch file that is deleted, emptied, unreadable or damaged is a degraded store, never
"no halts": the last known levers are honoured for ``grace`` seconds, then the view is
unusable and the kill switch refuses everything, until a valid file is back. A file that
was written once leaves its lock file (``<path>.lock``) behind, so a deleted file is told
from a switch never written even by a process started after the deletion (which has no
known levers: it refuses at once). Writes refuse to re-create a deleted file: the levers
it held are unknown, and a new file with one lever would lift the others.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from ...clocks import SYSTEM_CLOCK, ControlClock
from ...errors import ConfigurationError
from ._model import Lever, LeverUnreadable
from ._store import SwitchStoreUnavailable, SwitchView, parse_levers, quarantined

__all__ = ["FileSwitchStore"]

log = logging.getLogger("agent_saga.controls")


class FileSwitchStore:
    """Levers in this process's memory, or in a JSON file on this host.

    ``path=None``: in memory only (``engage`` from this process is the only writer).
    With a ``path``, the file (``{"v": 1, "levers": {id: document}}``) is re-read at most
    every ``poll`` seconds when it changed, so ``agent-saga halt --store PATH`` on the
    same host reaches this process. Writes are atomic (lock file, temp file, rename).
    Logs a WARNING when created (``warn=False`` silences it): it stops this process (and
    others reading the same file), never a fleet. ``grace`` is how long the last known
    levers are honoured once the file is deleted or unreadable (0: refuse at once).
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        poll: float = 0.25,
        clock: ControlClock | None = None,
        warn: bool = True,
        grace: float = 30.0,
    ) -> None:
        if poll < 0:
            raise ConfigurationError(f"poll must be >= 0 seconds, got {poll!r}")
        if isinstance(grace, bool) or not isinstance(grace, int | float) or not 0 <= grace < math.inf:
            raise ConfigurationError(
                f"grace must be a number of seconds >= 0 (0: fail closed at once), got {grace!r}"
            )
        self.grace = float(grace)
        self._lost_since: float | None = None  # monotonic: when the file stopped being readable
        self._known = False  # levers were read from the file (or written here) at least once
        self.path = None if path is None else os.fspath(path)
        self._poll_every = poll
        self._clock = clock or SYSTEM_CLOCK
        self._lock = threading.Lock()
        self._docs: dict[str, Any] = {}
        self._stamp: tuple[int, int, int] | None = (-1, -1, -1)  # never polled: read at once
        self._next_poll = -math.inf
        self._version = 0
        self._view = SwitchView(0)
        if warn:
            where = f"and any other process on this host reading {self.path}" if self.path else "only"
            log.warning(
                "kill switch store %s stops this process %s: a kill switch that stops one pod is "
                "not a kill switch. Use RedisSwitchStore(url, grace=...) for a fleet, and name it "
                "in your runbook.", self.describe(), where,
            )

    def describe(self) -> str:
        return f"FileSwitchStore({self.path})" if self.path else "FileSwitchStore(in-memory)"

    def __repr__(self) -> str:
        return self.describe()

    def start(self) -> None:
        self._next_poll = -math.inf
        self.view()

    def close(self) -> None:
        pass

    # ------------------------------------------------------------------ reading
    def view(self) -> SwitchView:
        if self.path is not None and self._clock.monotonic() >= self._next_poll:
            self._poll()
        return self._view

    def _poll(self) -> None:
        assert self.path is not None
        self._next_poll = self._clock.monotonic() + self._poll_every
        try:
            st = os.stat(self.path)
            stamp: tuple[int, int, int] | None = (st.st_mtime_ns, st.st_size, st.st_ino)
        except FileNotFoundError:
            stamp = None
        except OSError as exc:
            self._lost(f"cannot be read ({exc})")
            return
        if stamp == self._stamp and self._view.usable and self._lost_since is None:
            return
        try:
            docs = self._read_file()
        except _Unreadable as exc:
            self._lost(exc.why)
            return
        self._stamp = stamp
        if self._lost_since is not None:
            log.warning("%s is readable again: the kill switch follows it", self.describe())
            self._lost_since = None
        self._known = self._known or stamp is not None  # levers were read from a real file
        self._publish(docs)

    def _lost(self, why: str) -> None:
        """The file cannot be trusted: honour the last known levers for ``grace``, then refuse."""
        now = self._clock.monotonic()
        if self._lost_since is None:
            self._lost_since = now
            log.error("%s %s: honouring the last known levers for %gs (grace), then refusing everything",
                      self.describe(), why, self.grace)
        if not self._known:
            self._fail(f"{self.describe()} {why} and no levers were ever read from it: the kill switch "
                       f"refuses everything until a valid file is back")
        elif now - self._lost_since >= self.grace:
            self._fail(f"{self.describe()} {why}, and the grace window of {self.grace:g}s has passed: the "
                       f"kill switch refuses everything until a valid file is back (restore it from a backup)")
        else:
            until = time.strftime("%H:%M:%S", time.localtime(self._clock.time() + self.grace - (now - self._lost_since)))
            self._degrade(f"{self.describe()} {why}: honouring the last known levers until {until} "
                          f"(grace {self.grace:g}s), then refusing everything")

    def _degrade(self, degraded: str) -> None:
        with self._lock:
            v = self._view
            if v.usable and v.degraded == degraded:
                return
            self._version += 1
            self._view = SwitchView(self._version, v.levers, v.unreadable, True, None, degraded)

    def _publish(self, docs: Mapping[str, Any]) -> None:
        with self._lock:
            levers, bad = parse_levers(iter(sorted(docs.items())))
            v = self._view
            if v.usable and v.degraded is None and (levers, bad) == (v.levers, v.unreadable):
                return
            self._version += 1
            self._view = SwitchView(self._version, levers, bad)

    def _fail(self, problem: str) -> None:
        with self._lock:
            v = self._view
            if not v.usable and v.problem == problem:
                return
            self._version += 1
            self._view = SwitchView(self._version, v.levers, v.unreadable, False, problem)

    def _written_before(self) -> bool:
        """A write leaves ``<path>.lock`` behind: the switch existed (or this process read it)."""
        assert self.path is not None
        return self._known or os.path.exists(self.path + ".lock")

    def _read_file(self, written: bool | None = None) -> dict[str, Any]:
        """The levers in the file; ``{}`` for a switch never written (``written``: whether it
        was, when the caller knows better). Raises ``_Unreadable`` for a file that was
        deleted, emptied, cannot be read or is damaged."""
        assert self.path is not None
        if written is None:
            written = self._written_before()
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            if written:
                raise _Unreadable(self, "was deleted (its lock file remains)") from None
            return {}
        except OSError as exc:
            raise _Unreadable(self, f"cannot be read ({exc})") from exc
        if not text.strip():
            if written:
                raise _Unreadable(self, "is empty") from None
            return {}
        try:
            data = json.loads(text)
            levers = data["levers"]
            if not isinstance(levers, dict):
                raise TypeError("levers is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise _Unreadable(self, f"is not a kill switch file ({exc}); restore it from a backup") from exc
        return dict(levers)

    def levers(self) -> list[Lever]:
        docs = self._read_file() if self.path is not None else dict(self._docs)
        levers, bad = parse_levers(iter(sorted(docs.items())))
        if bad:
            raise SwitchStoreUnavailable(
                f"{self.describe()}: unreadable lever(s): " + "; ".join(m for _, m in bad), store=self.describe()
            )
        return list(levers)

    def is_quarantined(self, saga_id: str) -> bool:
        return quarantined(self.view(), saga_id, self._clock.time())

    # ------------------------------------------------------------------ writing
    def engage(self, lever: Lever) -> None:
        def change(docs: dict[str, Any]) -> None:
            now = self._clock.time()
            for lid in [k for k, d in docs.items() if _doc_expired(d, now)]:
                del docs[lid]
            docs[lever.id] = lever.to_doc()

        self._change(change)

    def lift(self, lever_id: str) -> Lever | None:
        found: list[Lever] = []

        def change(docs: dict[str, Any]) -> None:
            doc = docs.pop(lever_id, None)
            if doc is not None:
                with contextlib.suppress(LeverUnreadable):
                    found.append(Lever.from_doc(lever_id, doc))

        self._change(change)
        return found[0] if found else None

    def _change(self, change: Callable[[dict[str, Any]], None]) -> None:
        if self.path is None:
            with self._lock:
                docs = dict(self._docs)
                change(docs)
                self._docs = docs
            self._publish(docs)
            return
        import fcntl

        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            written = self._written_before()  # before the lock file below is created
            with open(self.path + ".lock", "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                docs = self._read_file(written)
                change(docs)
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump({"v": 1, "levers": docs}, f, indent=2, sort_keys=True)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
        except _Unreadable as exc:
            raise SwitchStoreUnavailable(
                f"{exc.message}: nothing was written, because the levers it held are unknown and a new "
                f"file would lift them. Restore the file from a backup; to start an empty switch "
                f"deliberately, delete {self.path}.lock too",
                store=self.describe(),
            ) from exc
        except OSError as exc:
            raise SwitchStoreUnavailable(f"{self.describe()} cannot be written ({exc})", store=self.describe()) from exc
        self._known = True
        self._next_poll = -math.inf  # this process sees its own change on the next check


class _Unreadable(SwitchStoreUnavailable):
    """The switch file cannot be trusted; ``why`` says how (for the degraded view)."""

    def __init__(self, store: FileSwitchStore, why: str) -> None:
        super().__init__(f"{store.describe()} {why}", store=store.describe())
        self.why = why


def _doc_expired(doc: Any, now: float) -> bool:
    try:
        return Lever.from_doc("x/x", doc).expired(now)
    except LeverUnreadable:
        return False
