"""A package's public names, each loaded from its module when first used (PEP 562).

A package lists its names by module in ``_SOURCES`` and binds
``__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)``; its imports under
``TYPE_CHECKING`` are what type checkers read, and ``tests/unit/test_lazy_exports.py``
holds the two equal. Importing the package then runs none of its modules: a process pays
for the parts it uses, and a leaf module (``agent_saga.wal.urls``) can be imported without
its package's backends, which keeps import order from mattering.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(
    package: str, sources: Mapping[str, Sequence[str]], public: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of ``package`` for the names in ``sources``.

    ``sources`` maps a module relative to the package (``".engine"``) to the names it
    defines. A name is imported on first access and stored in the package's namespace, so
    later lookups are plain attribute reads. ``public`` is the package's ``__all__``.
    """
    where = {name: module for module, names in sources.items() for name in names}
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module, package), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *public})

    return __getattr__, __dir__
