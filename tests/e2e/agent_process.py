"""A test agent process driven by JSON lines: both sides of the protocol.

Test side: ``AgentProcess(argv, env, stderr_path)`` starts the process, ``submit`` a
command, ``wait`` for its answer (with a deadline; the agent's stderr is in the error),
``send`` both. Agent side (``serve``): read commands from stdin, run each concurrently
with ``handle(cmd, answer)``, write one JSON line per answer ``{"id", "ok", "error",
"kind", ...}``; the first line is ``{"id": 0, "kind": "ready"}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

Answer = Callable[..., Awaitable[None]]


class AgentProcess:
    """One agent process; ``send`` a command and wait for its answer."""

    def __init__(self, argv: list[str], env: dict[str, str], stderr: Path, *, cwd: Path | None = None,
                 ready_timeout: float | None = 30.0) -> None:
        self.stderr = stderr
        stderr.parent.mkdir(parents=True, exist_ok=True)
        self._err = open(stderr, "wb")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err,
                                     text=True, bufsize=1, env=env, cwd=cwd)
        self.answers: dict[int, dict[str, Any]] = {}
        self.cond = threading.Condition()
        self.ids = iter(range(1, 1 << 30))
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()
        if ready_timeout is not None:
            self.wait(0, timeout=ready_timeout)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            doc = json.loads(line)
            with self.cond:
                self.answers[int(doc["id"])] = doc
                self.cond.notify_all()

    def submit(self, op: str, **kw: Any) -> int:
        cid = next(self.ids)
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"id": cid, "op": op, **kw}) + "\n")
        self.proc.stdin.flush()
        return cid

    def wait(self, cid: int, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self.cond:
            while cid not in self.answers:
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"agent gave no answer to {cid} within {timeout}s:\n"
                                         f"{self.stderr.read_text(errors='replace')[-3000:]}")
                self.cond.wait(min(left, 0.2))
            return self.answers.pop(cid)

    def send(self, op: str, timeout: float = 30.0, **kw: Any) -> dict[str, Any]:
        return self.wait(self.submit(op, **kw), timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        self.reader.join(5)
        for f in (self.proc.stdin, self.proc.stdout, self._err):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()


async def serve(handle: Callable[[dict[str, Any], Answer], Awaitable[None]]) -> None:
    """The agent side: answer ready, then run every command line with ``handle``."""
    lock = asyncio.Lock()

    async def answer(cid: Any, ok: bool, error: str = "", kind: str = "", **extra: Any) -> None:
        async with lock:
            sys.stdout.write(json.dumps({"id": cid, "ok": ok, "error": error, "kind": kind, **extra}) + "\n")
            sys.stdout.flush()

    await answer(0, True, kind="ready")
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    tasks: set[asyncio.Task[None]] = set()
    while line := await reader.readline():
        if line.strip():
            t = asyncio.create_task(handle(json.loads(line), answer))
            tasks.add(t)
            t.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks, return_exceptions=True)
