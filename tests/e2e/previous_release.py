"""The previous release of the chart and the operator, rendered from git.

This repository has no release tags. The "previous release" is the commit named by
``PREVIOUS``: the last merge on main's first-parent history that changed charts/ before
the current chart. It is a meaningful upgrade: the SagaPolicy CRD gains
``compensate.callArgs`` and ``compensate.values`` (a CRD change Helm does not apply by
itself), and the operator's projection and status code changed since.

``git archive PREVIOUS charts/agent-saga operator runtime`` unpacks the old chart, the old
operator and the runtime it imports into a directory of the test's; the old operator runs
from there as a process (PYTHONPATH pointing at the old sources only).

The tests run in a clone with full history (CI's clone of main on this machine): a clone
without the commit fails with how to get it, never a skip.
"""

from __future__ import annotations

import io
import subprocess
import tarfile
from pathlib import Path

from fixtures.binaries import REPO_ROOT

#: The last chart change on main before the current one (``git log --first-parent -- charts/``).
PREVIOUS = "a07a9ffa1db1fd6c068238dedc0ee62774416f44"
PATHS = ("charts/agent-saga", "operator", "runtime")


def unpack(into: Path, commit: str = PREVIOUS) -> Path:
    """``git archive`` of ``commit``'s chart, operator and runtime, unpacked under ``into``."""
    known = subprocess.run(["git", "-C", str(REPO_ROOT), "cat-file", "-e", f"{commit}^{{commit}}"],
                           capture_output=True, text=True, check=False)
    if known.returncode != 0:
        raise AssertionError(
            f"commit {commit} (the previous release of the chart) is not in this clone's history "
            f"({known.stderr.strip() or 'git cat-file failed'}): the upgrade drill renders it from git. "
            "Fetch the full history: git fetch --unshallow (or clone without --depth).")
    archive = subprocess.run(["git", "-C", str(REPO_ROOT), "archive", "--format=tar", commit, *PATHS],
                             capture_output=True, check=True)
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into


def pythonpath(old: Path) -> str:
    """The PYTHONPATH that imports the old operator and runtime, nothing of this tree."""
    return f"{old / 'operator'}:{old / 'runtime'}"
