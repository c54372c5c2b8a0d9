"""The loop: drive a model toward a goal with a deadline, a token budget, a step budget
and stall detection; an unfinished goal unwinds its side effects through the saga.

    from agent_saga import AgentLoop, LoopTool

    loop = AgentLoop(router, tools=[LoopTool("notes.write", write_note)], token_budget=8000)
    result = await loop.run("File the incident summary")
    print(result.stop, result.detail)       # why it stopped, also in the WAL (LOOP_STOPPED)

See ``agent_saga.loop._loop`` for the stop rules and the records.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._loop import LOOP_STEP as LOOP_STEP
    from ._loop import LOOP_STOPPED as LOOP_STOPPED
    from ._loop import AgentLoop as AgentLoop
    from ._loop import LoopResult as LoopResult
    from ._loop import StopReason as StopReason
    from ._tools import LoopTool as LoopTool
    from ._tools import codemod_tool as codemod_tool

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._loop": ("LOOP_STEP", "LOOP_STOPPED", "AgentLoop", "LoopResult", "StopReason"),
    "._tools": ("LoopTool", "codemod_tool"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
