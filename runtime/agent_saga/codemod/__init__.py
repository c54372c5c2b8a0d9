"""Repository edits as transactions: shadow-verified, snapshot-restored, kill -9-recoverable.

    from agent_saga import Codemod

    mod = Codemod(".", verify=["python", "-m", "pytest", "-q"])
    result = await mod.run({"app/config.py": new_text}, message="raise the pool size")

See ``agent_saga.codemod.transaction`` for the protocol and ``...handlers`` for what the
recovery daemon runs after a crash (import this package there).
"""

from __future__ import annotations

from . import handlers as _handlers  # noqa: F401 - registers the compensators and reconcilers
from .errors import CodemodError, CodemodRefused, VerifyFailed
from .transaction import Codemod, CodemodResult

__all__ = ["Codemod", "CodemodError", "CodemodRefused", "CodemodResult", "VerifyFailed"]
