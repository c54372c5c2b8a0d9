"""``FileSwitchStore``: kill-switch levers in this process, or in a JSON file on this host.

It logs a WARNING when created: a kill switch that stops one process is not a kill
switch for a fleet (``RedisSwitchStore`` is). See ``_store`` for the interface.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import threading
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
    others reading the same file), never a fleet.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        poll: float = 0.25,
        clock: ControlClock | None = None,
        warn: bool = True,
    ) -> None:
        if poll < 0:
            raise ConfigurationError(f"poll must be >= 0 seconds, got {poll!r}")
        self.path = None if path is None else os.fspath(path)
        self._poll_every = poll
        self._clock = clock or SYSTEM_CLOCK
        self._lock = threading.Lock()
        self._docs: dict[str, Any] = {}
        self._stamp: tuple[int, int, int] | None = None
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
        """``FileSwitchStore(<path>)`` or ``FileSwitchStore(in-memory)``."""
        return f"FileSwitchStore({self.path})" if self.path else "FileSwitchStore(in-memory)"

    def __repr__(self) -> str:
        return self.describe()

    def start(self) -> None:
        """Read the file now (the next ``view`` polls it)."""
        self._next_poll = -math.inf
        self.view()

    def close(self) -> None:
        """Nothing to release."""
        pass

    # ------------------------------------------------------------------ reading
    def view(self) -> SwitchView:
        """The levers last read (the file is re-read at most every ``poll`` seconds)."""
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
            self._fail(f"{self.describe()} cannot be read ({exc}): the kill switch refuses everything")
            return
        if stamp == self._stamp and self._view.usable:
            return
        try:
            docs = self._read_file()
        except SwitchStoreUnavailable as exc:
            self._fail(f"{exc.message}: the kill switch refuses everything")
            return
        self._stamp = stamp
        self._publish(docs)

    def _publish(self, docs: Mapping[str, Any]) -> None:
        with self._lock:
            levers, bad = parse_levers(iter(sorted(docs.items())))
            if self._view.usable and (levers, bad) == (self._view.levers, self._view.unreadable):
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

    def _read_file(self) -> dict[str, Any]:
        assert self.path is not None
        try:
            with open(self.path, encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return {}
        except OSError as exc:
            raise SwitchStoreUnavailable(f"{self.describe()} cannot be read ({exc})", store=self.describe()) from exc
        if not text.strip():
            return {}
        try:
            data = json.loads(text)
            levers = data["levers"]
            if not isinstance(levers, dict):
                raise TypeError("levers is not an object")
        except (ValueError, KeyError, TypeError) as exc:
            raise SwitchStoreUnavailable(
                f"{self.describe()} is not a kill switch file ({exc}); fix or remove it",
                store=self.describe(),
            ) from exc
        return dict(levers)

    def levers(self) -> list[Lever]:
        """A fresh read of every stored lever; raises ``SwitchStoreUnavailable``."""
        docs = self._read_file() if self.path is not None else dict(self._docs)
        levers, bad = parse_levers(iter(sorted(docs.items())))
        if bad:
            raise SwitchStoreUnavailable(
                f"{self.describe()}: unreadable lever(s): " + "; ".join(m for _, m in bad), store=self.describe()
            )
        return list(levers)

    def is_quarantined(self, saga_id: str) -> bool:
        """True if ``saga_id`` is quarantined (or the file cannot be read)."""
        return quarantined(self.view(), saga_id, self._clock.time())

    # ------------------------------------------------------------------ writing
    def engage(self, lever: Lever) -> None:
        """Store ``lever`` (dropping expired ones); raises ``SwitchStoreUnavailable``."""
        def change(docs: dict[str, Any]) -> None:
            now = self._clock.time()
            for lid in [k for k, d in docs.items() if _doc_expired(d, now)]:
                del docs[lid]
            docs[lever.id] = lever.to_doc()

        self._change(change)

    def lift(self, lever_id: str) -> Lever | None:
        """Remove the lever ``lever_id``; return it (``None`` if it was not engaged)."""
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
            with open(self.path + ".lock", "a+") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)
                docs = self._read_file()
                change(docs)
                tmp = f"{self.path}.{os.getpid()}.tmp"
                with open(tmp, "w", encoding="utf-8") as f:
                    json.dump({"v": 1, "levers": docs}, f, indent=2, sort_keys=True)
                    f.write("\n")
                    f.flush()
                    os.fsync(f.fileno())
                os.replace(tmp, self.path)
        except OSError as exc:
            raise SwitchStoreUnavailable(f"{self.describe()} cannot be written ({exc})", store=self.describe()) from exc
        self._next_poll = -math.inf  # this process sees its own change on the next check


def _doc_expired(doc: Any, now: float) -> bool:
    try:
        return Lever.from_doc("x/x", doc).expired(now)
    except LeverUnreadable:
        return False
