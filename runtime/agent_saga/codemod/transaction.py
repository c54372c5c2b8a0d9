"""``Codemod``: a repository edit as a transaction.

    mod = Codemod("path/to/repo", verify=["python", "-m", "compileall", "-q", "."])
    result = await mod.run({"src/app.py": new_text}, message="rename fetch -> load")

One run is four saga steps, each written to the WAL before it acts:

    codemod.shadow   check the snapshot (HEAD) out in a detached shadow worktree
    codemod.edit     apply the edit there and commit it (in the shadow only)
    codemod.verify   run the verify command in the shadow; a failure stops here
    codemod.merge    write the verified commit's files into the target, move the
                     branch, refresh the index, remove the shadow

Until ``codemod.merge`` the target repository is never written. Leaving the run with
any failure rolls the saga back: the shadow is discarded and, once the merge has
started, the target is restored to its snapshot (branch, index, every tracked file, the
files the edit added). A process killed at any point leaves a saga with no terminal
record, which the recovery daemon rolls back the same way from the WAL (the handlers are
in ``agent_saga.codemod.handlers``). So afterwards the repository is either exactly the
snapshot or exactly the verified commit, never a mix.

Invariants:
- The target must be clean (no uncommitted change, no untracked file, no merge in
  progress): restoring a snapshot can then never discard someone's work. Anything else is
  refused with ``CodemodRefused`` before a record is written.
- The merge checks again that the target is still at its snapshot and clean: a branch
  moved under the codemod is refused, never overwritten.
- Run inside a caller's saga (``saga=``) the four steps join it, so an unfinished goal
  later in that saga restores the repository too.
- What is not restored: git objects the shadow wrote stay as unreachable objects (until
  ``git gc``) and the branch's reflog keeps the move and its restore; ignored files are
  never touched; a file the edit creates that ``.gitignore`` matches is not part of the
  change.
"""

from __future__ import annotations

import asyncio
import inspect as _inspect
import logging
import os
import re
import secrets
import shlex
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from ..credentials import redact_secrets
from ..engine import Saga
from ..errors import ConfigurationError
from ..faults import fault_point
from ..gates import Gate
from ..scope import saga_scope
from ..semantics import ActionSemantics
from ..wal.base import BaseWAL
from . import _git
from .errors import CodemodError, CodemodRefused, VerifyFailed
from .handlers import discard_of, restore_of

__all__ = ["Codemod", "CodemodResult", "Edit"]

log = logging.getLogger("agent_saga.codemod")

Edit = Mapping[str, "str | bytes | None"] | Callable[[Path], Any]
_COMP = ActionSemantics.COMPENSABLE
_OUTPUT_TAIL = 4000
_SAFE = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True, slots=True)
class CodemodResult:
    """What a codemod did: the snapshot it started from, the verified commit now checked
    out (equal to ``snapshot`` when the edit changed nothing), the paths it changed as
    ``(status, path)`` with status A/M/D/T, and the verify command's output tail."""

    saga_id: str
    repo: str
    branch: str | None
    snapshot: str
    commit: str
    changed: tuple[tuple[str, str], ...]
    verify_output: str


class Codemod:
    """Repository edits as transactions (see the module doc).

    Args:
        repo: a path inside the git work tree to edit (its top level is used).
        verify: the command that must succeed in the shadow before anything reaches the
            target: an argv list (``["python", "-m", "pytest", "-q"]``) or a string split
            like a shell would (no shell runs it). Required: an unverified edit is not a
            codemod.
        verify_timeout: seconds the verify command may run (a timeout fails it).
        wal: the write-ahead log (default: the process default WAL).
        gate: the pre-flight gate consulted before each step.
        shadow_root: where shadow worktrees are created (default: the temp directory).
        lease_seconds: how long after this process's last sign of life recovery may take
            its saga over (default 30).

    Raises ``ConfigurationError`` for a bad argument, naming it.
    """

    def __init__(
        self,
        repo: str | Path,
        *,
        verify: Sequence[str] | str,
        verify_timeout: float = 600.0,
        wal: BaseWAL | None = None,
        gate: Gate | None = None,
        shadow_root: str | Path | None = None,
        lease_seconds: float | None = None,
        name: str = "codemod",
    ) -> None:
        if not isinstance(repo, str | Path) or not str(repo):
            raise ConfigurationError(f"repo must be the path of a git work tree, got {repo!r}")
        argv = shlex.split(verify) if isinstance(verify, str) else list(verify) if verify is not None else []
        if not argv or not all(isinstance(a, str) and a for a in argv):
            raise ConfigurationError(
                f"verify must be a non-empty command (argv list or string), got {verify!r}: for example "
                f"verify=['python', '-m', 'compileall', '-q', '.'] or verify='make test'"
            )
        if isinstance(verify_timeout, bool) or not isinstance(verify_timeout, int | float) or verify_timeout <= 0:
            raise ConfigurationError(f"verify_timeout must be a positive number of seconds, got {verify_timeout!r}")
        self.repo = Path(repo)
        self.verify = argv
        self.verify_timeout = float(verify_timeout)
        self.wal = wal
        self.gate = gate
        # resolved: git lists worktrees by their real path
        self.shadow_root = Path(os.path.realpath(shadow_root if shadow_root is not None else tempfile.gettempdir()))
        self.lease_seconds = lease_seconds
        self.name = name

    async def run(self, edit: Edit, *, message: str, saga: Saga | None = None, saga_id: str | None = None) -> CodemodResult:
        """Apply ``edit`` as one transaction and return what it changed.

        ``edit`` is a mapping ``{relative path: new text | bytes | None (delete)}`` or a
        callable ``edit(shadow_path)`` (sync or async) that edits the files under the path
        it is given. ``message`` is the commit message. With ``saga=`` the steps join that
        saga (its rollback restores the repository); otherwise the run is its own saga.

        Raises ``CodemodRefused`` (the target is not clean, or moved), ``VerifyFailed``
        (the target was not touched), ``ConfigurationError`` (a bad edit path), or what
        the edit raised; in each case after the rollback restored the repository.
        """
        if not isinstance(message, str) or not message.strip():
            raise ConfigurationError("message must be a non-empty commit message for the codemod")
        if not callable(edit):
            edit = _checked_files(edit)
        state = _git.inspect(self.repo)  # refused before anything is written
        if saga is not None:
            return await self._steps(saga, state, edit, message)
        async with saga_scope(self.wal, self.gate, self.name, saga_id=saga_id, lease_seconds=self.lease_seconds) as own:
            result = await self._steps(own, state, edit, message)
        fault_point("codemod.after_complete")
        return result

    async def _steps(self, saga: Saga, state: _git.RepoState, edit: Edit, message: str) -> CodemodResult:
        top = state.top
        shadow = str((self.shadow_root / f"{_git.SHADOW_PREFIX}{_SAFE.sub('_', saga.saga_id)}-{secrets.token_hex(4)}").absolute())
        base = {"repo": top, "shadow": shadow}
        discard = discard_of(top, shadow)

        def undo(_: object) -> Any:
            return discard

        await saga.execute(
            "codemod.shadow", _COMP, lambda: _git.add_shadow(top, shadow, state.snapshot), undo,
            policy_args={**base, "snapshot": state.snapshot, "branch": state.branch},
        )
        commit = await saga.execute(
            "codemod.edit", _COMP, lambda: _edit_and_commit(shadow, edit, message), undo,
            policy_args={**base, "message": message[:200]},
        )
        found = _git.changes(top, state.snapshot, commit)
        _git.check_plain(shadow, found)
        output = await saga.execute(
            "codemod.verify", _COMP, lambda: self._verify(shadow), undo,
            policy_args={**base, "command": self.verify},
        )
        fault_point("codemod.before_merge")
        merge = {
            **base, "branch": state.branch, "snapshot": state.snapshot, "commit": commit,
            "paths": [c.path for c in found],
        }
        await saga.execute(
            "codemod.merge", _COMP, lambda: _merge(top, shadow, found, state, commit), lambda _: restore_of(merge),
            policy_args=merge,
        )
        return CodemodResult(
            saga.saga_id, top, state.branch, state.snapshot, commit,
            tuple((c.status, c.path) for c in found), output,
        )

    def _verify(self, shadow: str) -> str:
        try:
            done = subprocess.run(
                self.verify, cwd=shadow, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                timeout=self.verify_timeout, check=False,
            )
        except FileNotFoundError as exc:
            raise VerifyFailed(
                f"the verify command {self.verify[0]!r} was not found: install it or fix verify=",
                exit_code=None, output="", command=self.verify,
            ) from exc
        except subprocess.TimeoutExpired as exc:
            tail = _tail(exc.stdout)
            raise VerifyFailed(
                f"the verify command {shlex.join(self.verify)} did not finish within {self.verify_timeout}s; "
                f"the repository was not changed",
                exit_code=None, output=tail, command=self.verify,
            ) from None
        tail = _tail(done.stdout)
        if done.returncode != 0:
            raise VerifyFailed(
                f"the verify command {shlex.join(self.verify)} failed with exit code {done.returncode} in the "
                f"shadow worktree; the repository was not changed. Its output ends:\n{tail[-800:]}",
                exit_code=done.returncode, output=tail, command=self.verify,
            )
        return tail


def _tail(raw: bytes | str | None) -> str:
    if raw is None:
        return ""
    text = raw.decode(errors="replace") if isinstance(raw, bytes) else raw
    return redact_secrets(text[-_OUTPUT_TAIL:])


def _checked_files(files: object) -> dict[str, str | bytes | None]:
    if not isinstance(files, Mapping) or not files:
        raise ConfigurationError(
            f"edit must be a callable edit(shadow_path) or a non-empty mapping {{path: text | bytes | None}}, got {files!r}"
        )
    checked: dict[str, str | bytes | None] = {}
    for path, content in files.items():
        pure = PurePosixPath(path) if isinstance(path, str) else None
        if pure is None or pure.is_absolute() or not pure.parts or ".." in pure.parts or pure.parts[0] == ".git":
            raise ConfigurationError(
                f"edit path {path!r} must be relative to the repository, without '..' and outside .git"
            )
        if content is not None and not isinstance(content, str | bytes):
            raise ConfigurationError(f"edit[{path!r}] must be text, bytes or None (delete), got {type(content).__name__}")
        checked[str(pure)] = content
    return checked


def _edit_and_commit(shadow: str, edit: Edit, message: str) -> str:
    if callable(edit):
        result = edit(Path(shadow))
        if _inspect.isawaitable(result):
            asyncio.run(_await(result))  # runs on the tool executor's thread: no loop here
    else:
        for rel, content in edit.items():
            target = Path(shadow, rel)
            if content is None:
                target.unlink(missing_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, bytes):
                target.write_bytes(content)
            else:
                target.write_text(content)
    return _git.commit_shadow(shadow, message)


async def _await(awaitable: Any) -> Any:
    return await awaitable


def _merge(top: str, shadow: str, found: Sequence[_git.Change], state: _git.RepoState, commit: str) -> str:
    if _git.head_of(top, state.branch) != state.snapshot or _git.dirty_paths(top):
        raise CodemodRefused(
            f"{top} changed while the codemod ran ({state.branch or 'HEAD'} is no longer at "
            f"{state.snapshot[:12]}, or the tree is dirty): the verified edit was not merged"
        )
    try:
        _git.write_changes(top, found, state.branch, state.snapshot, commit)
    except Exception as exc:
        # A step that raises did not happen: make that true before saying it.
        try:
            _git.restore(top, state.branch, state.snapshot, commit, [c.path for c in found])
        except Exception as undo:  # noqa: BLE001 - reported in the error below
            raise CodemodError(
                f"writing the verified commit into {top} failed ({type(exc).__name__}: {exc}) and restoring "
                f"the snapshot failed too ({type(undo).__name__}: {undo}): the work tree is partly written. "
                f"Restore it by hand: git -C {top} reset --hard {state.snapshot}"
            ) from exc
        exc.add_note(f"agent-saga: the codemod's partial merge into {top} was restored to {state.snapshot[:12]}")
        raise
    fault_point("codemod.after_merge")
    try:
        _git.discard_shadow(top, shadow)
    except CodemodError as exc:  # the change is merged: a leftover shadow must not undo that
        log.warning("codemod: the merge into %s is done but its shadow was not removed: %s", top, exc)
    return commit
