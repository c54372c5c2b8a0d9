"""The git operations a codemod is made of, each one small and checked.

Every function takes the repository (or the shadow) as a path and runs ``git`` with a
fixed environment (no prompts, C locale). A failing git command raises ``CodemodError``
naming the command and git's own message.

Invariants:
- Nothing here writes to the target repository except ``write_changes`` (the files a
  verified commit changes, plus the branch and the index) and ``restore`` (back to the
  snapshot). Both are safe to run again: the compensation and the recovery daemon call
  them after a crash that may have interrupted either one at any file.
- A shadow is only ever deleted inside a directory whose name starts with
  ``SHADOW_PREFIX``: a path read back from a log is never trusted to be removable.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ..faults import fault_point
from .errors import CodemodError, CodemodRefused

SHADOW_PREFIX = "agent-saga-codemod-"
_ENV_DROP = ("GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")
_IN_PROGRESS = ("MERGE_HEAD", "CHERRY_PICK_HEAD", "REVERT_HEAD", "rebase-merge", "rebase-apply", "BISECT_LOG")
_IDENTITY = ("-c", "user.name=agent-saga codemod", "-c", "user.email=codemod@agent-saga.invalid")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ENV_DROP}
    env.update(GIT_TERMINAL_PROMPT="0", LC_ALL="C", LANG="C")
    return env


def git(cwd: str | Path, *args: str, input_: bytes | None = None, check: bool = True) -> subprocess.CompletedProcess[bytes]:
    """Run ``git args`` in ``cwd``; raises ``CodemodError`` when it fails and ``check``."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, input=input_, capture_output=True, env=_env(), check=False
        )
    except FileNotFoundError as exc:
        raise CodemodError("git is not installed (or not on PATH): codemod needs the git command") from exc
    if check and done.returncode != 0:
        err = done.stderr.decode(errors="replace").strip() or done.stdout.decode(errors="replace").strip()
        raise CodemodError(f"`git {' '.join(args[:3])}` failed in {cwd} (exit {done.returncode}): {err}")
    return done


def out(cwd: str | Path, *args: str) -> str:
    return git(cwd, *args).stdout.decode().strip()


@dataclass(frozen=True, slots=True)
class RepoState:
    """Where a clean repository stands: its top level, HEAD commit and branch (None: detached)."""

    top: str
    snapshot: str
    branch: str | None


def inspect(repo: str | Path) -> RepoState:
    """The state of ``repo``; raises ``CodemodRefused`` unless it is a clean git work tree."""
    path = Path(repo)
    if not path.is_dir():
        raise CodemodRefused(f"repo {str(repo)!r} is not a directory: pass the path of a git work tree")
    probe = git(path, "rev-parse", "--show-toplevel", check=False)
    if probe.returncode != 0:
        raise CodemodRefused(f"repo {str(repo)!r} is not inside a git work tree: run `git init` there, or pass the right path")
    top = probe.stdout.decode().strip()
    head = git(top, "rev-parse", "--verify", "-q", "HEAD^{commit}", check=False)
    if head.returncode != 0:
        raise CodemodRefused(f"repo {top!r} has no commit yet: commit its current state first (the snapshot a codemod restores)")
    for name in _IN_PROGRESS:
        if Path(top, out(top, "rev-parse", "--git-path", name)).exists():
            raise CodemodRefused(f"repo {top!r} is in the middle of a git operation ({name} exists): finish or abort it first")
    dirty = dirty_paths(top)
    if dirty:
        shown = ", ".join(dirty[:5]) + (f" and {len(dirty) - 5} more" if len(dirty) > 5 else "")
        raise CodemodRefused(
            f"repo {top!r} has uncommitted changes ({shown}): a codemod starts from a clean tree so "
            f"that restoring it can never discard your work. Commit or stash them first"
        )
    ref = git(top, "symbolic-ref", "-q", "HEAD", check=False)
    branch = ref.stdout.decode().strip() if ref.returncode == 0 else None
    return RepoState(top, head.stdout.decode().strip(), branch)


def dirty_paths(top: str | Path) -> list[str]:
    """Tracked changes and untracked (not ignored) files, as git reports them."""
    raw = git(top, "status", "--porcelain=v1", "-z", "--untracked-files=all").stdout.decode(errors="replace")
    return [entry[3:] for entry in raw.split("\0") if len(entry) > 3]


def head_of(top: str | Path, branch: str | None) -> str:
    """The commit ``branch`` (or a detached HEAD) points at."""
    return out(top, "rev-parse", "--verify", branch or "HEAD")


# ---------------------------------------------------------------------------- the shadow


def add_shadow(top: str, shadow: str, snapshot: str) -> str:
    """Check the snapshot out in a new detached worktree at ``shadow``; returns its path."""
    Path(shadow).parent.mkdir(parents=True, exist_ok=True)
    git(top, "worktree", "add", "--detach", "-q", shadow, snapshot)
    return shadow


def commit_shadow(shadow: str, message: str) -> str:
    """Stage everything in the shadow and commit it; returns the commit (HEAD if unchanged)."""
    git(shadow, "add", "-A")
    if git(shadow, "diff", "--cached", "--quiet", check=False).returncode == 0:
        return out(shadow, "rev-parse", "HEAD")
    identity: Sequence[str] = () if git(shadow, "config", "user.email", check=False).returncode == 0 else _IDENTITY
    git(shadow, *identity, "commit", "-q", "--no-verify", "-m", message)
    return out(shadow, "rev-parse", "HEAD")


def discard_shadow(top: str, shadow: str) -> bool:
    """Remove the shadow worktree and its registration; True if there was anything to remove."""
    path = Path(shadow)
    if not path.name.startswith(SHADOW_PREFIX) or not path.is_absolute():
        raise CodemodError(f"refusing to remove {shadow!r}: not a codemod shadow ({SHADOW_PREFIX}* absolute path)")
    listed = shadow in _worktrees(top)
    existed = path.exists() or listed
    if listed:
        git(top, "worktree", "unlock", shadow, check=False)
        git(top, "worktree", "remove", "--force", "--force", shadow, check=False)
    if path.exists():
        shutil.rmtree(path)
    git(top, "worktree", "prune")
    if shadow in _worktrees(top) or path.exists():
        raise CodemodError(f"the shadow worktree {shadow} could not be removed: run `git worktree remove --force {shadow}`")
    return existed


def shadow_exists(top: str, shadow: str) -> bool:
    return Path(shadow).exists() or shadow in _worktrees(top)


def _worktrees(top: str) -> set[str]:
    raw = out(top, "worktree", "list", "--porcelain")
    return {line[9:] for line in raw.splitlines() if line.startswith("worktree ")}


# ---------------------------------------------------------------------------- the change


@dataclass(frozen=True, slots=True)
class Change:
    """One path a commit changes: status A (added), M (modified), D (deleted), T (type)."""

    status: str
    path: str
    mode: str
    blob: str


def changes(top: str, snapshot: str, commit: str) -> list[Change]:
    """What ``commit`` changes relative to ``snapshot``, sorted by path."""
    if snapshot == commit:
        return []
    raw = git(top, "diff", "--raw", "-z", "--no-renames", "--no-abbrev", snapshot, commit).stdout.decode()
    fields = raw.split("\0")
    found: list[Change] = []
    for i in range(0, len(fields) - 1, 2):
        meta, path = fields[i], fields[i + 1]
        if not meta.startswith(":"):
            continue
        _, new_mode, _, new_blob, status = meta[1:].split(" ")
        if "160000" in (new_mode, meta[1:7]):
            raise CodemodRefused(f"the edit changes the submodule {path!r}: codemod edits files, not submodules")
        found.append(Change(status[0], path, new_mode, new_blob))
    return sorted(found, key=lambda c: c.path)


_CONVERTING = ("filter", "eol", "ident", "working-tree-encoding")


def check_plain(shadow: str, found: Sequence[Change]) -> None:
    """Refuse (``CodemodRefused``) a change whose files git converts on checkout (a clean /
    smudge filter such as git-lfs, CRLF line endings, ``ident``, a working-tree encoding):
    the merge writes each file as git stores it, so it would not be what a checkout writes."""
    autocrlf = git(shadow, "config", "core.autocrlf", check=False).stdout.decode().strip().lower()
    if autocrlf in ("true", "input"):
        raise CodemodRefused(f"core.autocrlf={autocrlf} in {shadow}: codemod writes files as git stores them, "
                             f"so it refuses repositories that convert line endings on checkout")
    paths = [c.path for c in found if c.status != "D"]
    if not paths:
        return
    raw = git(shadow, "check-attr", "-z", *_CONVERTING, "--", *paths).stdout.decode(errors="replace").split("\0")
    for i in range(0, len(raw) - 2, 3):
        path, attr, value = raw[i], raw[i + 1], raw[i + 2]
        if value in ("unspecified", "unset") or (attr == "eol" and value == "lf"):
            continue
        raise CodemodRefused(
            f"{path} has the git attribute {attr}={value}: git converts it on checkout, and codemod writes "
            f"files as git stores them, so the edit was not merged (edit such files without codemod)"
        )


def _blobs(top: str, wanted: Sequence[str]) -> dict[str, bytes]:
    if not wanted:
        return {}
    data = git(top, "cat-file", "--batch", input_="".join(f"{b}\n" for b in wanted).encode()).stdout
    blobs: dict[str, bytes] = {}
    pos = 0
    for sha in wanted:
        end = data.index(b"\n", pos)
        header = data[pos:end].split()
        size = int(header[2])
        blobs[sha] = data[end + 1 : end + 1 + size]
        pos = end + 1 + size + 1
    return blobs


def write_changes(top: str, found: Sequence[Change], branch: str | None, snapshot: str, commit: str) -> None:
    """Make the target repository ``commit``: each changed file, then the branch, then the index."""
    blobs = _blobs(top, sorted({c.blob for c in found if c.status != "D"}))
    for change in found:
        fault_point("codemod.mid_merge")
        target = Path(top, change.path)
        if change.status == "D":
            _unlink(target)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.agent-saga-tmp")
        _unlink(tmp)
        content = blobs[change.blob]
        if change.mode == "120000":
            os.symlink(content.decode(), tmp)
        else:
            tmp.write_bytes(content)
            tmp.chmod(0o755 if change.mode == "100755" else 0o644)
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        os.replace(tmp, target)
    if commit != snapshot:
        git(top, "update-ref", "-m", "agent-saga codemod", *_ref_args(branch), commit, snapshot)
    git(top, "reset", "-q", commit, "--")


def restore(top: str, branch: str | None, snapshot: str, commit: str, paths: Sequence[str]) -> None:
    """Put the target back at ``snapshot``: branch, index, every tracked file; remove the
    files the codemod added (``paths`` not in the snapshot) and any half-written temporary.
    Refuses (``CodemodError``) if the branch moved to a commit that is neither."""
    if branch is not None and out(top, "symbolic-ref", "-q", "HEAD") != branch:
        raise CodemodError(f"{top}: HEAD is no longer on {branch} (someone switched branches): restore it by hand "
                           f"with `git checkout {branch} && git reset --hard {snapshot}`")
    current = head_of(top, branch)
    if current not in (snapshot, commit):
        raise CodemodError(f"{top}: {branch or 'HEAD'} moved to {current} since the codemod (expected {snapshot} or "
                           f"{commit}); not restoring over someone else's commit. Decide by hand "
                           f"(the snapshot was {snapshot})")
    if current != snapshot:
        git(top, "update-ref", "-m", "agent-saga codemod restore", *_ref_args(branch), snapshot, current)
    git(top, "reset", "-q", "--hard", snapshot)
    for rel in paths:
        path = Path(top, rel)
        _unlink(path.with_name(f".{path.name}.agent-saga-tmp"))
        if git(top, "cat-file", "-e", f"{snapshot}:{rel}", check=False).returncode == 0:
            continue  # tracked in the snapshot: the reset restored it
        _unlink(path)
        _prune_empty(Path(top), path.parent)


def is_untouched(top: str, branch: str | None, snapshot: str) -> bool:
    """True if the target shows no trace of a change: at the snapshot and clean (an added
    or half-written file would be untracked, so it shows)."""
    return head_of(top, branch) == snapshot and not dirty_paths(top)


def _ref_args(branch: str | None) -> list[str]:
    return [branch] if branch is not None else ["--no-deref", "HEAD"]


def _unlink(path: Path) -> None:
    if path.is_symlink() or path.is_file():
        path.unlink()


def _prune_empty(top: Path, directory: Path) -> None:
    while directory != top and top in directory.parents:
        try:
            directory.rmdir()
        except OSError:
            return
        directory = directory.parent
