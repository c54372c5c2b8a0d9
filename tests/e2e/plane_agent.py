"""A test agent wired the way the chart's NOTES.txt says: environment only, public API only.

    AGENT_SAGA_REDIS_URL=... AGENT_SAGA_NAMESPACE=... AGENT_SAGA_AGENT=... AGENT_SAGA_WAL_PATH=... \
        python plane_agent.py

No store, gate or source is built here: ``AgentKit(name=...)`` picks every control up
from the environment (kill switch, limits, approvals, SagaPolicy, heartbeat). Commands
arrive as JSON lines on stdin and run concurrently; each answer is one JSON line
``{"id", "ok", "error", "kind", "decided_by"}`` on stdout:

    {"id": 1, "op": "call", "tool": "wire.send", "amount": 10}   one transaction, one call
    {"id": 2, "op": "status"}                                    kit.status()

Tools (what the code declares): ``wire.send`` and ``stripe__create_charge`` COMPENSABLE,
``search_docs`` and ``undeclared.tool`` REVERSIBLE, ``sms.send`` IRREVERSIBLE.
A failure to start (a half-configured agent) exits 3 with the message on stderr.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from agent_process import Answer, serve  # tests/e2e (this script's directory)
from agent_saga import AgentKit, compensator
from agent_saga.errors import ConfigurationError


@compensator("test.refund")
async def refund(charge: str) -> None:
    return None


def build() -> tuple[AgentKit, dict[str, Any]]:
    kit = AgentKit(name=os.environ.get("AGENT_SAGA_AGENT", "agent"))

    async def send(amount: float = 0, **_: Any) -> dict[str, Any]:
        return {"id": f"tx-{amount}", "amount": amount}

    async def look(**_: Any) -> dict[str, Any]:
        return {"hits": 1}

    comp = lambda r: {"handler": "test.refund", "kwargs": {"charge": r["id"]}}  # noqa: E731
    tools = {
        "wire.send": kit.safe_tool(send, semantics="COMPENSABLE", compensate=comp, name="wire.send"),
        "stripe__create_charge": kit.safe_tool(send, semantics="COMPENSABLE", compensate=comp,
                                               name="stripe__create_charge"),
        "search_docs": kit.safe_tool(look, semantics="REVERSIBLE", name="search_docs"),
        "undeclared.tool": kit.safe_tool(look, semantics="REVERSIBLE", name="undeclared.tool"),
        "sms.send": kit.safe_tool(send, semantics="IRREVERSIBLE", name="sms.send"),
    }
    return kit, tools


async def main() -> None:
    try:
        kit, tools = build()
    except ConfigurationError as e:
        print(f"agent refused to start: {e}", file=sys.stderr, flush=True)
        sys.exit(3)

    async def handle(cmd: dict[str, Any], answer: Answer) -> None:
        cid = cmd.get("id")
        try:
            if cmd["op"] == "call":
                async with kit.transaction(tags=tuple(cmd.get("tags", ()))):
                    await tools[cmd["tool"]](amount=cmd.get("amount", 1))
                await answer(cid, True)
            elif cmd["op"] == "status":
                await answer(cid, True, status=kit.status())
            else:
                await answer(cid, False, f"unknown op {cmd['op']!r}", "Usage")
        except Exception as e:  # noqa: BLE001 - reported to the test
            await answer(cid, False, str(e), type(e).__name__, decided_by=getattr(e, "decided_by", ""))

    await serve(handle)


if __name__ == "__main__":
    asyncio.run(main())
