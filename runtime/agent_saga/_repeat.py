"""Repeating a Redis request whose reply was lost, only when the repeat is safe.

A reply is lost when the request was sent and no answer came back: the server may or may
not have run it. Three things end a call that way (``lost_reply`` says which, and why):

- ``AttributeError`` ``'NoneType' object has no attribute 'writelines'`` / ``'readline'``:
  redis-py's asyncio Cluster client re-reads the topology (after ``MOVED`` replies while
  a slot migrates, a ``CLUSTERDOWN``) by closing every connection it holds, including
  those other calls are using at that moment;
- ``ConnectionError``: the connection closed before the reply came (a server restart,
  ``CLIENT KILL``, a failover, a network cut);
- ``TimeoutError``: no reply within the socket timeout.

The clients never repeat anything themselves (``agent_saga._redis``: no client retries).
A store repeats through ``repeating`` / ``repeating_sync`` and only requests that are
safe to repeat: reads, and writes that are idempotent by construction (a claim taken
with the caller's token finds its own claim; a ledger write carries a write id the
server remembers; a lock carries its owner; a compare-and-set whose repeat recognises
its own earlier success). The send function is told whether it is a repeat, so a
script can check whether an earlier attempt landed (the limit store's debit does).

The bound is ``retries`` repeats (``repeat_bound``): by default 3 on a Redis Cluster,
where every topology re-read during a reshard closes the connections in use again (two
losses in a row are expected under load), and 1 elsewhere. The first repeat is sent at
once (one closed connection is the usual case); each later one waits a little longer
(``repeat_delay``: 50 ms, doubling, at most 250 ms), so the repeats of one call span the
burst of re-reads a slot migration causes instead of all landing inside it. Once the bound is spent the
call raises ``ReplyLost`` (what was lost, why, after how many attempts), which the store
turns into its own ``StoreUnavailable`` with ``lost_text``: the store fails closed.

A caller that must get a write through a storm of closed connections (the CLI's
``halt``, the operator's projection) passes a larger ``retries`` and a ``deadline`` (a
``time.monotonic()`` instant after which no repeat is sent), and ``on_repeat`` to hear of
each repeat, so it can say that the write needed them.

Anything else is raised at once, never repeated: a server error, a configuration error,
and a failure to connect (``Error 111 connecting to ...``, ``Timeout connecting to
server``), which sent nothing (the store is unreachable, and says so).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .errors import ConfigurationError

__all__ = ["OnRepeat", "ReplyLost", "check_retries", "lost_reply", "lost_text", "repeat_after", "repeat_bound", "repeat_delay",
           "repeating", "repeating_sync"]

T = TypeVar("T")

#: Why a call failed with ``AttributeError`` on a Cluster client (see the module doc).
TOPOLOGY_REREAD = "the client closed it to re-read the cluster's topology"


class ReplyLost(Exception):  # noqa: N818 - the name says what happened, like the rest of the family
    """Every attempt of a request lost its reply. ``why`` says how the last one was lost,
    ``attempts`` counts the attempts sent, ``error`` is the last client error."""

    def __init__(self, why: str, attempts: int, error: BaseException) -> None:
        super().__init__(f"lost its connection ({why}) on each of {attempts} attempt(s)")
        self.why = why
        self.attempts = attempts
        self.error = error


def lost_reply(exc: BaseException) -> str | None:
    """Why ``exc`` ended a request whose reply was lost (it may have run), or ``None`` if
    it is not such a failure (a server error, a bug: never repeated)."""
    if isinstance(exc, AttributeError):
        # Only the socket-gone case of the cluster client (its reader/writer set to None).
        return TOPOLOGY_REREAD if "'NoneType' object has no attribute" in str(exc) else None
    try:
        import redis.exceptions as rex
    except ImportError:  # pragma: no cover - no client, no Redis call
        return None
    if "connecting to" in str(exc):
        return None  # no connection was made, nothing was sent: the store is unreachable
    if isinstance(exc, rex.TimeoutError | TimeoutError):  # asyncio's is the builtin one
        return "no reply within the socket timeout"
    if isinstance(exc, rex.ConnectionError):
        return "the connection closed before the reply came"
    return None


def check_retries(retries: int | None) -> int | None:
    """``retries`` if it is ``None`` (the default bound) or a count >= 0; otherwise
    ``ConfigurationError`` naming the field."""
    if retries is not None and (isinstance(retries, bool) or not isinstance(retries, int) or retries < 0):
        raise ConfigurationError(f"retries must be >= 0 (or None for the default), got {retries}")
    return retries


def repeat_bound(retries: int | None, client: Any) -> int:
    """How many times a request that lost its reply is sent again: ``retries``, or by
    default 3 on a Redis Cluster client and 1 on any other."""
    if retries is not None:
        return retries
    from ._redis import is_cluster  # here, not at the top: _redis stands on this module

    return 3 if is_cluster(client) else 1


def repeat_delay(attempt: int) -> float:
    """Seconds to wait before repeat number ``attempt`` (1 for the first): none, then 50 ms
    doubling up to 250 ms."""
    return 0.0 if attempt <= 1 else min(0.25, 0.05 * 2 ** (attempt - 2))


#: ``on_repeat(attempt, why)``: told before repeat number ``attempt`` why the last was lost.
OnRepeat = Callable[[int, str], None]


async def repeating(send: Callable[[bool], Awaitable[T]], *, retries: int | None, client: Any,
                    deadline: float | None = None, on_repeat: OnRepeat | None = None) -> T:
    """``await send(repeat)`` (``repeat`` is False the first time), sent again while its
    reply is lost, at most ``repeat_bound(retries, client)`` times and never after
    ``deadline`` (``time.monotonic()``); then ``ReplyLost``. Only for requests that are
    safe to repeat (see the module doc)."""
    try:
        return await send(False)
    except Exception as exc:
        return await repeat_after(exc, send, retries=retries, client=client, deadline=deadline,
                                  on_repeat=on_repeat)


async def repeat_after(first: Exception, send: Callable[[bool], Awaitable[T]], *, retries: int | None,
                       client: Any, deadline: float | None = None, on_repeat: OnRepeat | None = None) -> T:
    """``repeating`` once the first attempt failed with ``first`` (a hot path sends its
    first attempt itself, without the wrapper): ``first`` is raised again unless it lost
    a reply; otherwise ``await send(True)`` up to the bound, then ``ReplyLost``."""
    exc: Exception = first
    attempt = 0
    bound = -1
    while True:
        why = lost_reply(exc)
        if why is None:
            raise exc
        if bound < 0:
            bound = repeat_bound(retries, client)  # worked out only once a reply was lost
        delay = repeat_delay(attempt + 1)
        if attempt >= bound or _past(deadline, delay):
            raise ReplyLost(why, attempt + 1, exc) from exc
        attempt += 1
        if on_repeat is not None:
            on_repeat(attempt, why)
        if delay:
            await asyncio.sleep(delay)
        try:
            return await send(True)
        except Exception as again:  # noqa: PERF203 - a repeat is the rare path
            exc = again


def repeating_sync(send: Callable[[bool], T], *, retries: int | None, client: Any, deadline: float | None = None,
                   on_repeat: OnRepeat | None = None) -> T:
    """``repeating`` for a synchronous client."""
    attempt = 0
    bound = -1
    while True:
        try:
            return send(attempt > 0)
        except Exception as exc:
            why = lost_reply(exc)
            if why is None:
                raise
            if bound < 0:
                bound = repeat_bound(retries, client)
            delay = repeat_delay(attempt + 1)
            if attempt >= bound or _past(deadline, delay):
                raise ReplyLost(why, attempt + 1, exc) from exc
            attempt += 1
            if on_repeat is not None:
                on_repeat(attempt, why)
            if delay:
                time.sleep(delay)


def _past(deadline: float | None, delay: float) -> bool:
    """Would a repeat sent after ``delay`` seconds start after ``deadline``?"""
    return deadline is not None and time.monotonic() + delay >= deadline


def lost_text(store: str, what: str, lost: ReplyLost, after: str) -> str:
    """The refusal of a request whose every attempt lost its reply: ``<store> lost its
    connection during <what> (<why>; <n> attempts: <error>); <after>``. ``store`` must
    already be said without a password; the caller scrubs the whole text
    (``Target.unavailable``)."""
    return (f"{store} lost its connection during {what} ({lost.why}; {lost.attempts} attempt(s), the last "
            f"{type(lost.error).__name__}: {lost.error}); {after}")
