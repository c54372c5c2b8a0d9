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
    from .errors import CodemodError, CodemodRefused, VerifyFailed
    from .transaction import Codemod, CodemodResult

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    ".errors": ("CodemodError", "CodemodRefused", "VerifyFailed"),
    ".transaction": ("Codemod", "CodemodResult"),
}

__all__ = ["Codemod", "CodemodError", "CodemodRefused", "CodemodResult", "VerifyFailed"]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
