"""Deterministic idempotency keys, and the one place that inspects user callables.

    idempotency_key(saga_id, step_id, scope)
        = SHA-256( "agent-saga/idempotency/v1" framed, then each part framed ) in hex
    where a part is framed as  <decimal byte length> ":" <UTF-8 bytes> ","   (a netstring)

Framing makes the join unambiguous: ("a:b", "c") and ("a", "b:c") never collide.

Invariants:
- The key depends on exactly (saga_id, step_id, scope): identical across retries,
  processes, hosts and restarts, and deliberately not on the attempt number (a key that
  varied per retry would make attempt 2 look like a fresh refund to the payment network).
- The engine uses scope ``FORWARD_SCOPE`` for the forward call (and its retries and
  fallback) and ``COMPENSATION_SCOPE`` for the compensation; a recovery process computes
  the same keys from the same ids, so a compensation replayed after a crash carries the
  key the dead process would have used.
- ``callable_info`` caches its answer per code object, so a ``lambda`` written inline in a
  loop is inspected once, not once per call; callables without a code object (partials,
  callable instances) are inspected each time with ``inspect.signature``.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = [
    "COMPENSATION_SCOPE",
    "FORWARD_SCOPE",
    "IDEMPOTENCY_KWARG",
    "CallableInfo",
    "callable_info",
    "idempotency_key",
]

FORWARD_SCOPE = "forward"
COMPENSATION_SCOPE = "compensate"
IDEMPOTENCY_KWARG = "idempotency_key"

_DOMAIN = b"25:agent-saga/idempotency/v1,"
_sha256 = hashlib.sha256


def _frame(part: str) -> bytes:
    data = part.encode("utf-8")
    return b"%d:%s," % (len(data), data)


def idempotency_key(saga_id: str, step_id: str, scope: str) -> str:
    """The deterministic idempotency key of ``(saga_id, step_id, scope)``: 64 hex chars.

    Guarantee: the same three strings give the same key in every process, forever
    (the framing is documented in the module docstring so other languages can compute it).
    Raises ``TypeError`` if a part is not a string.
    """
    if saga_id.__class__ is str and step_id.__class__ is str and scope.__class__ is str:
        a, b, c = saga_id.encode(), step_id.encode(), scope.encode()  # one frame per part, inline
        return _sha256(b"%s%d:%s,%d:%s,%d:%s," % (_DOMAIN, len(a), a, len(b), b, len(c), c)).hexdigest()
    for part in (saga_id, step_id, scope):
        if not isinstance(part, str):
            raise TypeError(f"idempotency_key() parts must be str, got {type(part).__name__}")
    return hashlib.sha256(_DOMAIN + _frame(saga_id) + _frame(step_id) + _frame(scope)).hexdigest()


def key_prefix(saga_id: str) -> bytes:
    """The framed domain and ``saga_id``: what every key of that saga starts with (the
    engine keeps one per saga, for ``forward_key``)."""
    return _DOMAIN + _frame(saga_id)


_FORWARD_FRAME = _frame(FORWARD_SCOPE)


def forward_key(prefix: bytes, step_id: str) -> str:
    """``idempotency_key(saga_id, step_id, FORWARD_SCOPE)`` from ``key_prefix(saga_id)``:
    the same key, without framing the saga id and the scope again."""
    b = step_id.encode()
    return _sha256(b"%s%d:%s,%s" % (prefix, len(b), b, _FORWARD_FRAME)).hexdigest()


class CallableInfo(NamedTuple):
    """What the engine needs to know about a user callable before calling it."""

    is_async: bool  # calling it returns a coroutine: run it on the event loop
    accepts_key: bool  # it has an ``idempotency_key`` parameter or ``**kwargs``


_CO_COROUTINE = inspect.CO_COROUTINE
_CO_VARKEYWORDS = inspect.CO_VARKEYWORDS
_CACHE: dict[Any, CallableInfo] = {}
_CACHE_MAX = 8192


def callable_info(fn: Callable[..., Any]) -> CallableInfo:
    """Return ``CallableInfo`` for ``fn``, cached per code object (see the module doc)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        func = getattr(fn, "__func__", None)  # a bound method
        code = getattr(func, "__code__", None)
    if code is not None and getattr(fn, "__wrapped__", None) is None:
        info = _CACHE.get(code)
        if info is None:
            info = _from_code(code)
            if len(_CACHE) >= _CACHE_MAX:
                _CACHE.clear()  # code objects made by exec() in a loop must not grow this
            _CACHE[code] = info
        return info
    return _from_signature(fn)


def _from_code(code: Any) -> CallableInfo:
    flags = code.co_flags
    named = code.co_varnames[code.co_posonlyargcount : code.co_argcount + code.co_kwonlyargcount]
    return CallableInfo(
        is_async=bool(flags & _CO_COROUTINE),
        accepts_key=bool(flags & _CO_VARKEYWORDS) or IDEMPOTENCY_KWARG in named,
    )


def _from_signature(fn: Callable[..., Any]) -> CallableInfo:
    call = None if inspect.isroutine(fn) else getattr(type(fn), "__call__", None)  # noqa: B004
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(call)
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return CallableInfo(is_async, False)  # a builtin without a signature: inject nothing
    accepts = any(
        p.kind is p.VAR_KEYWORD
        or (p.name == IDEMPOTENCY_KWARG and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
        for p in params
    )
    return CallableInfo(is_async, accepts)
