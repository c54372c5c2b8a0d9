"""Repository edits as transactions: shadow-verified, snapshot-restored, kill -9-recoverable.

    from agent_saga import Codemod

    mod = Codemod(".", verify=["python", "-m", "pytest", "-q"])
    result = await mod.run({"app/config.py": new_text}, message="raise the pool size")

See ``agent_saga.codemod.transaction`` for the protocol and ``...handlers`` for what the
recovery daemon runs after a crash (import this package there).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from . import handlers as _handlers  # noqa: F401 - registers the compensators and reconcilers

if TYPE_CHECKING:
    from .errors import CodemodError as CodemodError
    from .errors import CodemodRefused as CodemodRefused
    from .errors import VerifyFailed as VerifyFailed
    from .transaction import Codemod as Codemod
    from .transaction import CodemodResult as CodemodResult

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".errors": ("CodemodError", "CodemodRefused", "VerifyFailed"),
    ".transaction": ("Codemod", "CodemodResult"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
