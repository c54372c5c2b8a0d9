"""What the connectors share: the indeterminate outcome, the credential lookup, and the
plans that let one connector's logic run over a sync client and an async one.

A *plan* is a generator holding a connector call's logic without its I/O: it yields each
request (a statement, an HTTP call) and receives the answer, or has the client's error
thrown into it; its return value is the call's result. ``run_plan`` answers it with a
blocking client (on the tool pool), ``arun_plan`` with an async one (on the event loop),
so the compensations and reconcilers are written once and run either way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, TypeVar

from ..credentials import resolve_credential
from ..errors import ConfigurationError

__all__ = ["Indeterminate", "Plan", "arun_plan", "credential_fields", "first_request", "run_plan"]

T = TypeVar("T")
#: A connector call's logic: yields requests, receives their answers, returns the result.
Plan = Generator[Any, Any, T]


class Indeterminate(RuntimeError):
    """The connector cannot safely decide: it did nothing, and a human must look.

    Raised by a compensation that finds the system in a state it did not leave it in (a
    concurrent writer touched the row, the record was modified since the step): the
    rollback escalates the step with this message instead of overwriting someone's work.
    """


def credential_fields(ref: str, connector: str, required: tuple[str, ...], *, plain: str | None = None) -> dict[str, Any]:
    """Resolve ``ref`` to a mapping holding ``required`` keys.

    A resolver may return the mapping, or (when ``plain`` names the key) a bare string for
    that key. Raises ``ConfigurationError`` naming what is missing, never the values.
    """
    secret = resolve_credential(ref)
    if isinstance(secret, str) and plain is not None:
        secret = {plain: secret}
    if not isinstance(secret, Mapping):
        raise ConfigurationError(
            f"the credential resolver returned a {type(secret).__name__} for credential_ref={ref!r}; "
            f"the {connector} connector needs a mapping with {', '.join(required)}"
            + (f" (or a string: the {plain})" if plain else "")
        )
    missing = [k for k in required if not secret.get(k)]
    if missing:
        raise ConfigurationError(
            f"the credential credential_ref={ref!r} has no {', '.join(missing)}: the {connector} "
            f"connector needs {', '.join(required)}"
        )
    return dict(secret)


def first_request(plan: Plan[T]) -> tuple[bool, Any]:
    """Run ``plan`` to its first request: ``(False, request)``, or ``(True, result)`` when it
    needs none. Its argument checks run here, before any connection is opened."""
    return _advance(plan, True, None)


def _advance(plan: Plan[T], ok: bool, value: Any) -> tuple[bool, Any]:
    """Hand ``plan`` an answer (``ok``) or an error: ``(False, next request)`` or ``(True, result)``."""
    try:
        return False, plan.send(value) if ok else plan.throw(value)
    except StopIteration as stop:
        return True, stop.value


def run_plan(plan: Plan[T], first: Any, answer: Callable[[Any], Any]) -> T:
    """Answer ``plan``'s requests (from ``first``) with the blocking ``answer``; return its result.
    A request's error is thrown into the plan, which re-raises what it does not handle."""
    done, out = False, first
    while not done:
        try:
            ok, value = True, answer(out)
        except Exception as exc:  # noqa: BLE001 - handed to the plan
            ok, value = False, exc
        done, out = _advance(plan, ok, value)
    return out  # type: ignore[no-any-return]


async def arun_plan(plan: Plan[T], first: Any, answer: Callable[[Any], Awaitable[Any]]) -> T:
    """``run_plan`` with an awaited ``answer``: every request is answered on the event loop."""
    done, out = False, first
    while not done:
        try:
            ok, value = True, await answer(out)
        except Exception as exc:  # noqa: BLE001 - handed to the plan
            ok, value = False, exc
        done, out = _advance(plan, ok, value)
    return out  # type: ignore[no-any-return]
