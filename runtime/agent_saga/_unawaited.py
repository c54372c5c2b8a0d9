"""Coroutine methods a script may call without ``await`` (``wal.compact()``).

``@runs_if_discarded`` wraps an ``async def`` method. Awaited, passed on
(``asyncio.run(wal.compact())``, ``create_task``) or stored, the call returns the
coroutine exactly as before. Called as a bare statement, whose result would be thrown
away (the caller's next instruction is ``POP_TOP``), the work would silently not happen,
so instead:

- with no event loop running in this thread (a script), it runs to completion there and
  then (``asyncio.run``), raising what the coroutine raises;
- inside a running loop (async code, a notebook cell) it raises ``ConfigurationError``
  naming the ``await`` to write: the loop cannot be blocked, and the call must not be lost.

Invariant: a call whose result is used is never changed; the check reads the caller's
bytecode once per call (``dis``), so it is only for rare, heavy methods like compaction.
"""

from __future__ import annotations

import asyncio
import dis
import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import ConfigurationError

__all__ = ["runs_if_discarded"]

F = TypeVar("F", bound=Callable[..., Any])


def _discarded(depth: int) -> bool:
    """True if the caller ``depth`` frames up throws the call's result away."""
    try:
        frame = sys._getframe(depth + 1)
    except ValueError:
        return False
    lasti = frame.f_lasti  # the call (or, from 3.11, its last inline cache entry)
    for ins in dis.get_instructions(frame.f_code):
        if ins.offset > lasti:
            return ins.opname == "POP_TOP"
    return False


def runs_if_discarded(method: F) -> F:
    """See the module doc. ``method`` must be an ``async def``."""
    if getattr(method, "__runs_if_discarded__", False):
        return method
    what = method.__qualname__

    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        coro = method(*args, **kwargs)
        if not _discarded(1):
            return coro
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(coro)  # a script: do the work now, raise what it raises
        coro.close()
        raise ConfigurationError(
            f"{what}() was called without await inside a running event loop, so it would do nothing: "
            f"write `await ...{method.__name__}(...)`"
        )

    call.__runs_if_discarded__ = True  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]
