"""An AgentLoop whose process is SIGKILLed between two model steps.

    python loop_worker.py WAL NOTES_DIR

The scripted host asks for ``notes.write(name=n<k>)`` at every step and SIGKILLs the
process when asked for the third step: two notes are written (committed saga steps, with
their named inverse ``chaos.notes.erase``), the goal is unfinished, nobody rolls back.
Importing this module registers the inverse (the recovery daemon imports it).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from agent_saga import AgentLoop, FileWAL, LoopTool, compensator
from agent_saga.routing import (
    CallableHost,
    Capabilities,
    HostAnswer,
    ModelRequest,
    Route,
    Router,
    ToolCall,
    Usage,
)


@compensator("chaos.notes.erase")
def erase(*, notes: str, name: str) -> None:
    Path(notes, name).unlink(missing_ok=True)


def main(wal_path: str, notes: str) -> None:
    steps = []

    def host(request: ModelRequest) -> HostAnswer:
        steps.append(1)
        if len(steps) == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        call = ToolCall(f"c{len(steps)}", "notes.write", json.dumps({"name": f"n{len(steps)}"}))
        return HostAnswer(tool_calls=(call,), usage=Usage(50, 10))

    def write(name: str) -> dict[str, str]:
        Path(notes, name).write_text("written by the agent\n")
        return {"notes": notes, "name": name}

    async def run() -> None:
        wal = FileWAL(wal_path)
        router = Router(Route([CallableHost("scripted", host, Capabilities(context_tokens=4000, tools=True))]), wal=wal)
        tool = LoopTool("notes.write", write, "COMPENSABLE", lambda r: {"handler": "chaos.notes.erase", "kwargs": r})
        await AgentLoop(router, tools=[tool], wal=wal, lease_seconds=0.05).run("write notes", saga_id="loop-1")

    asyncio.run(run())


if __name__ == "__main__":
    main(*sys.argv[1:3])
