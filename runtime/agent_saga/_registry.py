"""Named-handler registries: a stable name -> the function a decorator registered under it.

``@compensator("stripe.refund")`` (``compensation``) and ``@reconciler("stripe.refund")``
(``recovery.reconcilers``) are two ``Registry`` instances; each declares its own wording.

Invariants:
- A name is 1-128 characters from ``[A-Za-z0-9._:/-]``, starting with a letter or digit
  (``NAME_PATTERN``); it is checked when the decorator is built, before any function.
- The decorator returns the function unchanged, and refuses a non-callable.
- One name, one function: registering another function under a taken name raises
  ``ConfigurationError``. Registering the same function again, or a reloaded module's
  function with the same qualified name, replaces it silently.
- A registry is process-local and thread-safe; lookups take no lock.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from .errors import ConfigurationError

__all__ = ["NAME_PATTERN", "Registry", "qualname"]

F = TypeVar("F", bound=Callable[..., Any])

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


def qualname(fn: Callable[..., Any]) -> str:
    """``module.qualified.name`` of ``fn``: how errors name a registered function."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class Registry:
    """Functions registered under stable names by the decorator ``@<decorator>(name)``.

    Args:
        decorator: the decorator's name, for errors (``"compensator"``).
        bad_name: the message for an invalid name; ``{name!r}`` is filled in.
        taken: the message for a name registered to another function; ``{name!r}``,
            ``{prev}`` and ``{new}`` (the two functions' qualified names) are filled in.
    """

    def __init__(self, *, decorator: str, bad_name: str, taken: str) -> None:
        self.decorator = decorator
        self._bad_name = bad_name
        self._taken = taken
        self._lock = threading.Lock()
        self._functions: dict[str, Callable[..., Any]] = {}
        #: The function registered as a name, or ``None`` (the dict's own ``get``: a
        #: lookup on a rollback path costs one call).
        self.get: Callable[[str], Callable[..., Any] | None] = self._functions.get

    def check_name(self, name: object) -> str:
        """``name`` if it is a valid name; ``ConfigurationError`` saying what one is otherwise."""
        if not isinstance(name, str) or not NAME_PATTERN.match(name):
            raise ConfigurationError(self._bad_name.format(name=name))
        return name

    def register(self, name: str) -> Callable[[F], F]:
        """The decorator that registers a function as ``name`` and returns it unchanged.

        Raises ``ConfigurationError`` for an invalid name (at once), a non-callable, or a
        name already registered to a different function.
        """
        self.check_name(name)

        def register(fn: F) -> F:
            if not callable(fn):
                raise ConfigurationError(f"@{self.decorator}({name!r}) must decorate a callable, got {fn!r}")
            with self._lock:
                prev = self._functions.get(name)
                if prev is not None and prev is not fn and qualname(prev) != qualname(fn):
                    raise ConfigurationError(self._taken.format(name=name, prev=qualname(prev), new=qualname(fn)))
                self._functions[name] = fn
            return fn

        return register

    def snapshot(self) -> dict[str, Callable[..., Any]]:
        """A copy of the registry: name -> function."""
        with self._lock:
            return dict(self._functions)

    def unregister(self, name: str) -> bool:
        """Remove ``name`` (tests, plugin unloading); True if it was registered."""
        with self._lock:
            return self._functions.pop(name, None) is not None
