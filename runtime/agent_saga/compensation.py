"""Compensations: the runtime-derived inverse of a step, and the registry of named handlers.

A compensation is built *after* the forward call returns, by a factory over its result
(``compensate=lambda r: Compensation(handler="stripe.refund", kwargs={"charge": r["id"]})``)
because you cannot refund a charge id you have not seen yet. The factory may also return
the AgentKit dict form ``{"handler": name, "kwargs": {...}}``.

A compensation names up to two ways to run it:

- ``fn``: a callable, run in-process by the engine on rollback (it cannot cross a process
  boundary);
- ``handler``: a stable name registered with ``@compensator(name)``, which the recovery
  daemon resolves after a crash. With no ``fn``, the engine resolves it too.

Invariants:
- ``@compensator`` validates eagerly (name format, callable, no second function under a
  taken name) and returns the function unchanged.
- The registry is process-local and thread-safe; re-registering the same function (or a
  reloaded module's function with the same qualified name) is allowed.
- What the WAL stores is the ``descriptor``: ``{"handler", "kwargs", "description"}``,
  with kwargs snapshotted to plain JSON and checked for secrets. ``fn`` never enters it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from ._registry import NAME_PATTERN, Registry
from .errors import CompensationError, ConfigurationError, HandlerNotRegistered
from .payloads import _flat_copy, snapshot_mapping

__all__ = [
    "Compensation",
    "compensator",
    "get_compensator",
    "registered_compensators",
]

F = TypeVar("F", bound=Callable[..., Any])

HANDLER_PATTERN = NAME_PATTERN

_DICT_KEYS = frozenset({"handler", "kwargs", "description"})


_handlers = Registry(
    decorator="compensator",
    bad_name="compensation handler name {name!r} is not valid: use a stable dotted name such as "
             "'stripe.refund' (1-128 characters from [A-Za-z0-9._:/-])",
    taken="compensation handler {name!r} is already registered to {prev}; cannot register {new} under the "
          "same name. Handler names are global and stable: choose another name",
)

_VALID_NAMES: set[str] = set()  # handler names already checked (a set of str: no lock needed)
_VALID_NAMES_MAX = 4096


def _check_handler_name(name: object) -> str:
    if name.__class__ is str and name in _VALID_NAMES:
        return name
    valid = _handlers.check_name(name)
    if valid.__class__ is str:
        if len(_VALID_NAMES) >= _VALID_NAMES_MAX:
            _VALID_NAMES.clear()  # names made up per call must not grow this
        _VALID_NAMES.add(valid)
    return valid


class _Factory:
    """The default of ``Compensation.kwargs``: a new empty dict for each compensation."""

    def __repr__(self) -> str:
        return "<factory>"


_FACTORY: Any = _Factory()


@dataclass(frozen=True, slots=True, init=False)
class Compensation:
    """The inverse of one step, derived from its forward result.

    Args:
        fn: a callable run in-process on rollback as ``fn(**kwargs)`` (sync or async).
        handler: a name registered with ``@compensator``; replayable by another process.
        kwargs: JSON-serialisable arguments (checked when the step commits: a value that
            is not JSON raises ``NotSerializable`` naming its key path, a value that looks
            like a secret raises ``SecretDetected``). ``idempotency_key`` is injected
            automatically into a callable that accepts it.
        description: free text for the audit log (a credential in it is written as
            ``[REDACTED]``: see ``agent_saga.scrubber``).

    Guarantee: at least one of ``fn`` / ``handler`` is set, ``fn`` is callable and
    ``handler`` is a valid name. Raises ``ConfigurationError`` otherwise.
    """

    fn: Callable[..., Any] | None = None
    handler: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __init__(
        self,
        fn: Callable[..., Any] | None = None,
        handler: str | None = None,
        kwargs: Mapping[str, Any] = _FACTORY,  # a new dict
        description: str = "",
    ) -> None:
        # What the dataclass's generated ``__init__`` and its checks did, with each frozen
        # slot set through its descriptor (one is built per step: no object.__setattr__
        # lookups, no second frame). Pinned by tests/unit/engine/test_compensation_class.py.
        if kwargs is _FACTORY:
            kwargs = {}
        if fn is None and handler is None:
            raise ConfigurationError(
                "Compensation needs fn= (run in-process) or handler= (a name registered with "
                "@compensator, replayable after a crash), or both"
            )
        if fn is not None and not callable(fn):
            raise ConfigurationError(f"Compensation.fn must be callable, got {fn!r}")
        if handler is not None and (handler.__class__ is not str or handler not in _VALID_NAMES):
            _check_handler_name(handler)  # (a name checked before is valid: no frame)
        if kwargs.__class__ is not dict and not isinstance(kwargs, Mapping):
            raise ConfigurationError(
                f"Compensation.kwargs must be a mapping of JSON values, got {type(kwargs).__name__}"
            )
        if description.__class__ is not str and not isinstance(description, str):
            raise ConfigurationError("Compensation.description must be a string")
        _SET_FN(self, fn)
        _SET_HANDLER(self, handler)
        _SET_KWARGS(self, kwargs)
        _SET_DESCRIPTION(self, description)

    def descriptor(self, path: str = "kwargs") -> dict[str, Any]:
        """The WAL form ``{"handler", "kwargs", "description"}`` with kwargs snapshotted.

        Raises ``NotSerializable`` / ``SecretDetected`` naming the offending key path.
        """
        kwargs = self.kwargs
        # = snapshot_mapping(kwargs, path); a plain flat dict is copied here, one frame less.
        snap = _flat_copy(kwargs) if kwargs.__class__ is dict else None
        return {
            "handler": self.handler,
            "kwargs": snapshot_mapping(kwargs, path) if snap is None else snap,
            "description": self.description,
        }


_FIELDS = ("fn", "handler", "kwargs", "description")
if tuple(f.name for f in fields(Compensation)) != _FIELDS:
    raise TypeError("Compensation's fields changed: update its __init__")
_SET_FN, _SET_HANDLER, _SET_KWARGS, _SET_DESCRIPTION = (getattr(Compensation, n).__set__ for n in _FIELDS)


def coerce_compensation(value: object, tool: str) -> Compensation | None:
    """Turn a factory's return value into a ``Compensation`` (or ``None``: nothing to undo).

    Accepts a ``Compensation``, the dict form ``{"handler", "kwargs"[, "description"]}`` or
    ``None``. Raises ``CompensationError`` for anything else.
    """
    if value is None or isinstance(value, Compensation):
        return value
    if isinstance(value, Mapping):
        extra = set(value) - _DICT_KEYS
        if extra or "handler" not in value:
            raise CompensationError(
                f"the compensation factory of {tool!r} returned a dict with keys "
                f"{sorted(map(str, value))}; the dict form is {{'handler': name, 'kwargs': "
                f"{{...}}, 'description': text}} (handler required)",
                tool=tool,
            )
        try:
            return Compensation(
                handler=value["handler"],
                kwargs=value.get("kwargs") or {},
                description=value.get("description") or "",
            )
        except ConfigurationError as exc:
            raise CompensationError(
                f"the compensation factory of {tool!r} returned an invalid dict: {exc.message}",
                tool=tool,
            ) from exc
    raise CompensationError(
        f"the compensation factory of {tool!r} returned {type(value).__name__}; it must "
        f"return a Compensation(...) or {{'handler': name, 'kwargs': {{...}}}}",
        tool=tool,
    )


# ---------------------------------------------------------------------------- registry

#: Handlers the runtime ships, by name prefix -> the module that registers them (the
#: compensators and reconcilers of ``agent_saga.codemod``). Named, not imported (those
#: modules sit above this one): a lookup imports them, and so does registering a name
#: under their prefix, so every process resolves them, a clash is still refused at
#: decoration time, and ``import agent_saga`` loads none of them.
_SHIPPED = {"codemod.": "agent_saga.codemod.handlers"}
_shipped_loaded = False


def load_shipped_handlers(name: str | None = None) -> None:
    """Register the handlers the runtime ships: all of them, or those sharing ``name``'s
    prefix (idempotent; every registry lookup calls it)."""
    global _shipped_loaded
    if _shipped_loaded:
        return
    if name is not None:
        for prefix, module in _SHIPPED.items():
            if name.startswith(prefix):
                importlib.import_module(module)
        return
    for module in _SHIPPED.values():
        importlib.import_module(module)
    _shipped_loaded = True


def compensator(name: str) -> Callable[[F], F]:
    """Register the decorated function as the compensation handler ``name``.

    Usage: ``@compensator("stripe.refund")`` on a sync or async function taking the
    compensation's kwargs (plus ``idempotency_key`` if it declares it). The function is
    returned unchanged. Import the module that declares it in every process that may run
    it (the agent and the recovery daemon), or rollback escalates with
    ``HandlerNotRegistered``.

    Raises ``ConfigurationError`` at decoration time for an invalid name, a non-callable,
    or a name already registered to a different function.
    """
    _check_handler_name(name)
    load_shipped_handlers(name)
    return _handlers.register(name)


def get_compensator(name: str, kwargs: Mapping[str, Any] | None = None) -> Callable[..., Any]:
    """The function registered as ``name``; raises ``HandlerNotRegistered`` if none is
    (its message shows the ``@compensator`` line to add, with ``kwargs``' names as the
    handler's parameters)."""
    load_shipped_handlers()
    fn = _handlers.get(name)
    if fn is None:
        raise HandlerNotRegistered(name, tuple(kwargs or ()))
    return fn


def registered_compensators() -> dict[str, Callable[..., Any]]:
    """A snapshot of the registry: handler name -> function."""
    load_shipped_handlers()
    return _handlers.snapshot()


def unregister_compensator(name: str) -> bool:
    """Remove ``name`` from the registry (tests, plugin unloading); True if it was there."""
    return _handlers.unregister(name)
