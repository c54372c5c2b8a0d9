"""A package's public names, listed once and each loaded from its module when first used.

A package lists its public names by module in one table, ``_SOURCES``, and binds
``__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)``: the table is what
runs (PEP 562), and ``__all__`` is derived from it. Type checkers read the same names from
the package's imports under ``TYPE_CHECKING``, written ``from .m import Name as Name`` (an
explicit re-export: ``__all__`` is not a literal they can read);
``tests/unit/test_lazy_exports.py`` holds the two equal. Importing the package then runs
none of its modules: a process pays for the parts it uses, and a leaf module
(``agent_saga.wal.urls``) can be imported without its package's backends, which keeps
import order from mattering.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, sources: Mapping[str, Sequence[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """The ``__getattr__``, ``__dir__`` and ``__all__`` of ``package`` for ``sources``.

    ``sources`` maps a module relative to the package (``".engine"``) to the public names
    it defines. A name is imported on first access and stored in the package's namespace,
    so later lookups are plain attribute reads; any other name is the package's submodule
    of that name, if it has one. ``__all__`` is every name, sorted.
    """
    where = {name: module for module, names in sources.items() for name in names}
    public = sorted(where)
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            return _submodule(package, name)
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__, public


def _submodule(package: str, name: str) -> Any:
    """``package.name`` as an attribute (``agent_saga.wal`` after ``import agent_saga``),
    imported on first use, as an eager package would have had it; else AttributeError."""
    missing = AttributeError(f"module {package!r} has no attribute {name!r}")
    if name.startswith("__"):
        raise missing
    try:
        return importlib.import_module(f"{package}.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{package}.{name}":
            raise
        raise missing from None
