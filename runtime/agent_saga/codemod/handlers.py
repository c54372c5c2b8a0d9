"""The named handlers a recovery daemon needs to finish a codemod a crash interrupted.

Importing ``agent_saga.codemod`` registers them (the recovery daemon imports it when
told to: ``RecoveryDaemon(..., imports=["agent_saga.codemod"])``, or
``agent-saga recover --import agent_saga.codemod``):

    compensators   codemod.discard_shadow   remove the shadow worktree (idempotent)
                   codemod.restore          put the target back at its snapshot (idempotent)
    reconcilers    codemod.shadow / .edit / .verify   does the shadow still exist?
                   codemod.merge            did the target move off its snapshot?

A step whose process died inside it has no forward result, so recovery asks its
reconciler what is true in the repository, and undoes it with the compensation the
reconciler names: the shadow steps by discarding the shadow, the merge by restoring the
snapshot. Both handlers are safe to run twice and on a repository they never touched.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..compensation import Compensation, compensator
from ..recovery.reconcilers import Observation, reconciler
from . import _git

DISCARD = "codemod.discard_shadow"
RESTORE = "codemod.restore"
SHADOW_STEPS = ("codemod.shadow", "codemod.edit", "codemod.verify")
MERGE_STEP = "codemod.merge"


@compensator(DISCARD)
def discard_shadow(*, repo: str, shadow: str) -> dict[str, Any]:
    """Remove the codemod's shadow worktree (nothing in the target repository changes)."""
    return {"removed": _git.discard_shadow(repo, shadow)}


@compensator(RESTORE)
def restore(*, repo: str, branch: str | None, snapshot: str, commit: str, paths: Sequence[str],
            shadow: str | None = None) -> dict[str, Any]:
    """Put the target repository back at its snapshot, then remove the shadow (if named)."""
    _git.restore(repo, branch, snapshot, commit, paths)
    if shadow is not None:
        _git.discard_shadow(repo, shadow)
    return {"restored": snapshot}


def discard_of(repo: str, shadow: str) -> Compensation:
    """The compensation that removes ``shadow``."""
    return Compensation(handler=DISCARD, kwargs={"repo": repo, "shadow": shadow},
                        description=f"remove the shadow worktree {shadow}")


def restore_of(merge: dict[str, Any]) -> Compensation:
    """The compensation that restores the target named by a merge step's arguments."""
    return Compensation(handler=RESTORE, kwargs=merge,
                        description=f"restore {merge['repo']} to {merge['snapshot'][:12]}")


def _observe_shadow(*, repo: str, shadow: str, **_: Any) -> Observation:
    if _git.shadow_exists(repo, shadow):
        return Observation(exists=True, reversed_=False, detail=f"the shadow worktree {shadow} exists",
                           compensation=discard_of(repo, shadow))
    return Observation(exists=True, reversed_=True, detail=f"no shadow worktree at {shadow}")


for _name in SHADOW_STEPS:
    reconciler(_name)(_observe_shadow)


@reconciler(MERGE_STEP)
def observe_merge(*, repo: str, branch: str | None, snapshot: str, commit: str, paths: Sequence[str], shadow: str) -> Observation:
    """Whether the target moved off its snapshot (a file, the branch or the index)."""
    merge = {"repo": repo, "branch": branch, "snapshot": snapshot, "commit": commit, "paths": list(paths), "shadow": shadow}
    if _git.is_untouched(repo, branch, snapshot):
        # Nothing reached the target (the shadow, if left, is discarded by the steps before).
        return Observation(exists=False, detail="the target is at its snapshot and clean")
    return Observation(exists=True, reversed_=False, detail=f"{repo} moved off {snapshot[:12]}",
                       compensation=restore_of(merge))
