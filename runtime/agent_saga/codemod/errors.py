"""The errors of codemod (drawn in ``agent_saga.errors``)."""

from __future__ import annotations

from ..errors import SagaError

__all__ = ["CodemodError", "CodemodRefused", "VerifyFailed"]


class CodemodError(SagaError):
    """A repository edit could not be made or undone; the message names the git command."""


class CodemodRefused(CodemodError):
    """The target repository is not in a state a codemod may start from (not a git work
    tree, no commit, uncommitted changes, a merge in progress, moved under it); nothing
    was changed."""


class VerifyFailed(CodemodError):
    """The verify command failed (or timed out) in the shadow worktree: the target
    repository was never touched. ``exit_code`` (None on timeout) and ``output`` (its
    last lines, credentials redacted) say why."""

    def __init__(self, message: str, *, exit_code: int | None, output: str, command: list[str]) -> None:
        super().__init__(message, tool="codemod.verify")
        self.exit_code = exit_code
        self.output = output
        self.command = command
