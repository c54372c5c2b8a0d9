"""One codemod run in a fresh process, killed with SIGKILL where the test says.

    python codemod_worker.py REPO WAL SHADOWS KILL

KILL is where the process dies: ``none``; ``in_edit_start`` / ``in_edit_mid`` (the edit
sends itself SIGKILL before / after its first file); ``in_verify`` (the verify command
SIGKILLs its parent, this process); the ``codemod.*`` fault points are set by the test
through ``AGENT_SAGA_FAULT=<point>:<n>:sigkill``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path

from agent_saga import Codemod, FileWAL
from fixtures.gitrepo import EDIT


def main(repo: str, wal_path: str, shadows: str, kill: str) -> None:
    def edit(shadow: Path) -> None:
        if kill == "in_edit_start":
            os.kill(os.getpid(), signal.SIGKILL)
        for n, (rel, content) in enumerate(EDIT.items()):
            if content is None:
                (shadow / rel).unlink()
            else:
                (shadow / rel).parent.mkdir(parents=True, exist_ok=True)
                (shadow / rel).write_text(content)
            if kill == "in_edit_mid" and n == 0:
                os.kill(os.getpid(), signal.SIGKILL)

    verify = ["sh", "-c", "kill -9 $PPID"] if kill == "in_verify" else [
        sys.executable, "-m", "compileall", "-q", "pkg"]

    async def run() -> None:
        wal = FileWAL(wal_path)
        mod = Codemod(repo, verify=verify, wal=wal, shadow_root=shadows, lease_seconds=0.05)
        await mod.run(edit, message="rename fetch to load", saga_id="codemod-1")
        wal.close()

    asyncio.run(run())


if __name__ == "__main__":
    main(*sys.argv[1:5])
