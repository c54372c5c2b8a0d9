"""The bounded, resizable thread pool that runs blocking tool calls and compensations.

A synchronous forward (``lambda: ec2.run_instances(...)``) would block the event loop, so
it runs here instead of on asyncio's default executor, which queues silently and is shared
with everything else in the process. This pool is private to agent-saga and reports its
own saturation.

Invariants:
- At most ``max_workers`` threads run tool work; threads are started on demand and stay
  (after a shrink, surplus threads take no new work and exit).
- A call goes straight to an idle worker (the one freed last) through that worker's own
  mailbox: one ``SimpleQueue.put`` wakes exactly that thread. A worker that finishes a
  call takes the next queued one, or parks itself idle, before it wakes the caller, so a
  caller making calls one after another keeps one thread busy instead of two.
- Saturation (every worker running a call and work waiting) is counted once per episode
  and logged at WARNING once per episode; the episode ends when the queue drains. A
  worker is freed before its caller is woken, so a caller never sees a stale "busy".
- The caller's ``contextvars`` (saga_id/step_id for logging, tracing) are copied into the
  worker for the call.
- A call whose awaiting side gave up (timeout, cancellation) keeps running in its thread
  to completion: Python cannot stop a thread. Its result is discarded.
- Workers are daemon threads so a wedged tool call cannot hold the interpreter open at
  exit; the WAL still records what was acknowledged. At exit (``atexit``) idle workers
  are told to leave; ``shutdown()`` does the same on demand.
- After ``fork`` the child has none of the parent's threads: every pool forgets them
  (and the calls they held, which belong to the parent's loop) and starts afresh.
- A call is a plain tuple and its result goes back with one ``call_soon_threadsafe``:
  no ``concurrent.futures`` objects, no ``wrap_future`` (asyncio's default executor
  builds both and chains two futures).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import logging
import os
import queue
import threading
import weakref
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import ConfigurationError

__all__ = [
    "ToolExecutor",
    "ToolExecutorStats",
    "get_tool_executor",
    "set_tool_executor_size",
    "tool_executor_stats",
]

log = logging.getLogger("agent_saga.executor")
_Future = asyncio.Future
_running_loop = asyncio.get_running_loop
_copy_context = contextvars.copy_context

ENV_TOOL_THREADS = "AGENT_SAGA_TOOL_THREADS"


@dataclass(frozen=True, slots=True)
class ToolExecutorStats:
    """A snapshot of the tool pool.

    ``active``: calls running now; ``queued``: calls waiting for a worker; ``peak_queued``:
    the most calls ever waiting with no worker free; ``saturated_count``: saturation
    episodes so far (all workers busy and work queued).
    """

    max_workers: int
    threads: int
    active: int
    queued: int
    peak_queued: int
    saturated_count: int


# A call: (fn, kwargs, fut, ctx). A tuple: built in one step, read by unpacking.
_Item = tuple[Callable[..., Any], Mapping[str, Any], asyncio.Future[Any], contextvars.Context]


def _settle(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    if fut.done():
        return  # the awaiting side gave up (timeout or cancellation)
    if ok:
        fut.set_result(value)
    else:
        fut.set_exception(value)


class _Worker:
    """One pool thread's mailbox: the submitter hands it its next call directly."""

    __slots__ = ("box",)

    def __init__(self) -> None:
        self.box: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()


class ToolExecutor:
    """A bounded pool of daemon threads for blocking tool work (see the module doc).

    A call goes straight to an idle worker's mailbox (one ``SimpleQueue.put``, which
    wakes that thread and nothing else); with none idle it starts a worker (under the
    bound) or waits in the queue, which a worker drains before it goes idle again.

    Raises ``ConfigurationError`` for ``max_workers`` < 1.
    """

    def __init__(self, max_workers: int, *, name: str = "agent-saga-tool") -> None:
        _check_size(max_workers)
        self._name = name
        self._max = max_workers
        self._seq = 0
        self._forget()
        _POOLS.add(self)

    def _forget(self) -> None:
        """Start with no threads (a new pool, or the child after ``fork``)."""
        self._lock = threading.Lock()
        self._queue: deque[_Item] = deque()  # calls waiting for a worker
        self._idle: list[_Worker] = []  # workers waiting for a call (most recent last)
        self._threads = 0
        self._active = 0
        self._peak_queued = 0
        self._saturated_count = 0
        self._saturated = False

    def submit(self, fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> asyncio.Future[Any]:
        """Run ``fn(**kwargs)`` on a worker; return a future of the running loop for it.

        Guarantee: the call starts no earlier than now and no later than when a worker is
        free; its result or exception lands in the returned future. Must be called from a
        coroutine (a running event loop is required).
        """
        fut: asyncio.Future[Any] = _Future(loop=_running_loop())  # as create_future, one frame less
        item: _Item = (fn, kwargs, fut, _copy_context())
        with self._lock:
            if self._idle:  # the usual case: straight to the worker freed last
                worker = self._idle.pop()
                self._active += 1
            else:
                worker = None
                spawn = self._threads < self._max
                if spawn:
                    self._threads += 1
                    self._active += 1
                else:
                    self._queue.append(item)
                    warn = self._check_saturation()
        if worker is not None:
            worker.box.put(item)
        elif spawn:
            self._spawn(item)
        elif warn:
            self._warn(warn)
        return fut

    def _check_saturation(self) -> int:
        """With the lock held: count a new episode if every worker is running a call and
        work is waiting. Returns the queue length to warn about (0: nothing to say)."""
        waiting = len(self._queue)
        if not waiting or self._active < self._max:
            return 0
        if waiting > self._peak_queued:
            self._peak_queued = waiting
        if self._saturated:
            return 0
        self._saturated = True
        self._saturated_count += 1
        return waiting

    def _warn(self, waiting: int) -> None:
        log.warning(
            "agent-saga tool executor saturated: all %d workers busy, %d call(s) queued; "
            "raise it with set_tool_executor_size(n) or make slow tools async",
            self._max,
            waiting,
        )

    def _spawn(self, first: _Item) -> None:
        """Start a worker whose first call is ``first`` (counted in threads and active)."""
        self._seq += 1
        t = threading.Thread(target=self._work, args=(first,), name=f"{self._name}-{self._seq}", daemon=True)
        try:
            t.start()
        except BaseException:
            with self._lock:
                self._threads -= 1
                self._active -= 1
            _settle_threadsafe(first[2], False, RuntimeError("agent-saga could not start a tool worker thread"))
            raise

    def _done_then_next(self, me: _Worker) -> tuple[_Item | None, bool]:
        """After a call (with the lock not held): free this worker and pick what it does
        next: a queued call, or park in the idle list (``None, True``), or exit as surplus
        after a shrink (``None, False``). Done before the caller is woken, so the caller
        never sees a stale "busy" and its next call can come straight here."""
        warn = 0
        with self._lock:
            self._active -= 1
            if self._threads > self._max:
                self._threads -= 1  # shrunk: this thread is surplus
                return None, False
            if self._queue:
                item: _Item | None = self._queue.popleft()
                self._active += 1
                if not self._queue:
                    self._saturated = False  # the episode ends when the queue drains
                else:
                    warn = self._check_saturation()
            else:
                self._idle.append(me)
                item = None
        if warn:
            self._warn(warn)
        return item, True

    def _work(self, first: _Item) -> None:
        me = _Worker()
        item: _Item | None = first
        while item is not None:
            fn, kwargs, fut, ctx = item
            del item
            value: Any = None
            ok = True
            skipped = fut.cancelled()  # nobody waits any more and it has not started
            if not skipped:
                try:
                    value = ctx.run(fn, **kwargs)
                except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
                    value, ok = exc, False
            nxt, stay = self._done_then_next(me)
            if not skipped:  # = _settle_threadsafe, inline
                try:
                    fut.get_loop().call_soon_threadsafe(_settle, fut, ok, value)
                except RuntimeError:
                    pass  # the loop is closed: nobody can be waiting
            del fn, kwargs, fut, ctx, value
            if nxt is None and stay:
                nxt = me.box.get()  # None: told to exit by a shrink or a shutdown
            item = nxt

    def shutdown(self) -> None:
        """Let every idle worker exit now; busy ones exit when their call returns.
        The pool stays usable: a later call starts a worker again. Run at exit."""
        with self._lock:
            leave, self._idle = self._idle, []
            self._threads -= len(leave)
        for w in leave:
            w.box.put(None)

    def resize(self, max_workers: int) -> None:
        """Change the worker bound. Growing starts workers for queued calls at once;
        shrinking lets surplus workers exit (idle ones at once, busy ones when they finish
        their current call)."""
        _check_size(max_workers)
        starts: list[_Item] = []
        leave: list[_Worker] = []
        with self._lock:
            self._max = max_workers
            while self._queue and self._threads < max_workers:
                starts.append(self._queue.popleft())
                self._threads += 1
                self._active += 1
            if not self._queue:
                self._saturated = False
            while self._threads > max_workers and self._idle:
                leave.append(self._idle.pop(0))
                self._threads -= 1
        for w in leave:
            w.box.put(None)
        for item in starts:
            self._spawn(item)

    def stats(self) -> ToolExecutorStats:
        """The pool's current state (see ``ToolExecutorStats``)."""
        with self._lock:
            return ToolExecutorStats(
                max_workers=self._max,
                threads=self._threads,
                active=self._active,
                queued=len(self._queue),
                peak_queued=self._peak_queued,
                saturated_count=self._saturated_count,
            )


def _settle_threadsafe(fut: asyncio.Future[Any], ok: bool, value: Any) -> None:
    try:
        fut.get_loop().call_soon_threadsafe(_settle, fut, ok, value)
    except RuntimeError:
        pass  # the loop is closed: nobody can be waiting


def _check_size(n: object) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ConfigurationError(f"the tool executor size must be an int >= 1, got {n!r}")


def _default_size() -> int:
    env = os.environ.get(ENV_TOOL_THREADS)
    if env:
        try:
            n = int(env)
        except ValueError:
            n = 0
        if n < 1:
            raise ConfigurationError(f"{ENV_TOOL_THREADS}={env!r} must be an integer >= 1")
        return n
    return min(32, (os.cpu_count() or 1) + 4)


_lock = threading.Lock()
_executor: ToolExecutor | None = None
_POOLS: weakref.WeakSet[ToolExecutor] = weakref.WeakSet()


def _after_fork_in_child() -> None:
    global _lock
    _lock = threading.Lock()
    for pool in list(_POOLS):
        pool._forget()  # noqa: SLF001 - the parent's threads do not exist here


def _at_exit() -> None:
    for pool in list(_POOLS):
        pool.shutdown()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


def get_tool_executor() -> ToolExecutor:
    """The process-wide tool pool, created on first use (size: ``$AGENT_SAGA_TOOL_THREADS``
    or ``min(32, cpu_count + 4)``). Raises ``ConfigurationError`` for a bad env value."""
    global _executor
    ex = _executor
    if ex is None:
        with _lock:
            if _executor is None:
                _executor = ToolExecutor(_default_size())
            ex = _executor
    return ex


def tool_executor_stats() -> ToolExecutorStats:
    """A snapshot of the process-wide tool pool (size, active, queued, saturation)."""
    return get_tool_executor().stats()


def set_tool_executor_size(n: int) -> None:
    """Bound the process-wide tool pool to ``n`` threads (takes effect at once).

    Raises ``ConfigurationError`` for ``n`` < 1.
    """
    get_tool_executor().resize(n)
