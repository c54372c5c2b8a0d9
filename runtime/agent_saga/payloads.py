"""Payload snapshots: the caller-side check on every user value bound for the WAL.

The WAL encodes records on its own flusher thread, after ``append`` returned, so a value
that cannot be encoded would only fail there, far from the code that produced it (and a
REVERSIBLE step never waits to hear). Every user-supplied value that enters a record
(compensation kwargs, policy arguments) therefore goes through ``snapshot`` first.

Invariants:
- ``snapshot`` returns a fresh structure made only of ``dict`` (with ``str`` keys),
  ``list``, ``str``, ``int``, ``float`` (finite), ``bool`` and ``None``; the caller's
  objects are never shared with the flusher thread, so mutating them later cannot change
  or break a record already appended.
- It raises ``NotSerializable`` naming the first offending key path
  (``kwargs['refund']['at']``) and ``SecretDetected`` for anything ``assert_no_secrets``
  would flag; the value itself is never put in the message for a secret.
- Exception text bound for a record (``describe_error``) has well-known credential
  formats redacted and is cut at 2,000 characters.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .credentials import check_value, key_detected, redact_secrets, secret_under
from .errors import NotSerializable
from .scrubber import _MIN_SHAPE, _key_class, key_is_reference, key_secret, shown_key, why_secret

__all__ = ["describe_error", "error_text", "snapshot", "snapshot_mapping"]

_MAX_DEPTH = 64
_MAX_MESSAGE = 2000
# ``why_secret(key, value)`` is None for a value this short under a key that does not name
# a credential: no credential shape matches a string under ``_MIN_SHAPE`` characters, and
# a key naming key material flags only values that look random, 20 characters or more.
# ``_flat_copy`` answers those without the call (tests/unit/test_payload_short_values.py
# compares the two over every key class and length).
_SHORT = min(_MIN_SHAPE, 20)


def snapshot_mapping(value: object, path: str) -> dict[str, Any]:
    """``snapshot`` for a value that must be a JSON object (kwargs, policy arguments)."""
    if value.__class__ is not dict and not isinstance(value, Mapping):
        raise NotSerializable(
            f"{path} must be a mapping of JSON values (a dict with str keys), got "
            f"{type(value).__name__}",
            key=path,
        )
    if value.__class__ is dict:
        flat = _flat_copy(value)
        if flat is not None:
            return flat
    out = _copy(value, path, None, 0)
    assert isinstance(out, dict)
    return out


def _flat_copy(value: dict[Any, Any]) -> dict[str, Any] | None:
    """A dict of str keys and plain scalars (the usual compensation kwargs), checked as
    ``_copy`` checks it, copied in one C call; None if anything needs ``_copy`` (a nested
    value, a subclass, a non-str key, a non-finite float or a secret, whose error
    ``_copy`` raises with its key path)."""
    for k, v in value.items():
        if k.__class__ is not str or (len(k) >= _MIN_SHAPE and key_secret(k) is not None):
            return None
        t = v.__class__
        if t is str:
            if v and (len(v) >= _SHORT or _key_class(k) == 2) and why_secret(k, v) is not None:
                return None
        elif not (t is int or v is None or t is bool or (t is float and math.isfinite(v))):
            return None
    return dict(value)


def snapshot(value: object, path: str) -> Any:
    """Return a JSON-safe deep copy of ``value``; raise naming ``path`` if it has none."""
    return _copy(value, path, None, 0)


# A key path is built only when an error names it (formatting one per value was most of
# a snapshot's cost): ``path`` is the root's name (a str) or a ``(parent, key)`` pair,
# rendered as ``parent[key!r]`` by ``_render``.


# A key that is itself a secret is rendered ``[REDACTED]``.


def _render(path: Any) -> str:
    if path.__class__ is str:
        return str(path)
    parent, k = path
    return f"{_render(parent)}[{k!r}]"


def _copy(value: Any, path: Any, key: object, depth: int, inside: bool = False) -> Any:
    """``snapshot``'s walk; ``inside``: ``value`` sits under a credential's key, where every
    string is a secret (``agent_saga.scrubber``), except under a reference's key."""
    t = value.__class__
    if t is str:
        if value and (inside or why_secret(key, value) is not None):
            if inside:
                raise secret_under(_render(path))
            check_value(_render(path), key, value)  # raises, naming the path
        return value
    if value is None or value is True or value is False or t is int:
        return value
    if t is float:
        if not math.isfinite(value):
            raise _unserialisable(_render(path), value, "NaN and infinities are not JSON")
        return value
    if depth >= _MAX_DEPTH:
        raise _unserialisable(_render(path), value, f"nested more than {_MAX_DEPTH} levels deep")
    if t is dict or isinstance(value, Mapping):
        out: dict[str, Any] = {}
        secret = inside or (isinstance(key, str) and _key_class(key) == 2)
        for k, v in value.items():
            if k.__class__ is not str and not isinstance(k, str):
                sub = _render((path, k))
                raise NotSerializable(
                    f"{sub} has a {type(k).__name__} key; JSON object keys are strings: "
                    f"convert the key with str() before passing it",
                    key=sub,
                )
            why = key_secret(k, key, secret)
            if why is not None:
                raise key_detected(_render((path, shown_key(k, key, secret))), why)
            out[str(k)] = _copy(v, (path, k), k, depth + 1, secret and not key_is_reference(k))
        return out
    if t is list or t is tuple or isinstance(value, list | tuple):
        return [_copy(v, (path, i), key, depth + 1, inside) for i, v in enumerate(value)]
    # Subclasses of the JSON scalars (str/int enums, numpy-free bool-likes) keep their value.
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, str):
        check_value(_render(path), key, value)
        return str(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return _copy(float(value), path, key, depth)
    raise _unserialisable(_render(path), value, None)


def _unserialisable(path: str, value: object, why: str | None) -> NotSerializable:
    detail = why or f"a {type(value).__name__} is not a JSON value"
    return NotSerializable(
        f"{path} is not JSON-serialisable ({detail}): values written to the WAL are replayed "
        f"by another process, so pass plain JSON (str, int, float, bool, None, list, dict "
        f"with str keys), e.g. an ISO-8601 string for a datetime or str() of a Decimal",
        key=path,
    )


def describe_error(exc: BaseException) -> dict[str, str]:
    """``{"error_type", "message"}`` for a record: secrets redacted, length bounded."""
    message = redact_secrets(str(exc))
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "...[truncated]"
    return {"error_type": type(exc).__name__, "message": message}


def error_text(exc: BaseException) -> str:
    """``"ErrorType: message"`` with secrets redacted and the length bounded."""
    d = describe_error(exc)
    return f"{d['error_type']}: {d['message']}"
