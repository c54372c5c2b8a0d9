"""An agent built with the OpenAI Agents SDK, in the effector shape
(examples/k8s/effector/agent.yaml): its only way to the payments system is the SDK's own
MCP client pointed at the agent-saga proxy, `MCP_SERVER_URL` (the sidecar's
http://127.0.0.1:8931/mcp). It holds no token: the proxy injects the payments server's, gates
every call (kill switch, budgets, approvals, the SagaPolicy) and logs it as a saga step.

    MCP_SERVER_URL=http://127.0.0.1:8931/mcp OPENAI_API_KEY=... \
        python examples/mcp/openai_agents_effector.py "charge customer cus_42 12 dollars"

Nothing here is agent-saga code: the same agent runs unchanged against any MCP server.
A refused call (-32001) reaches the model as the tool's failure, in the proxy's words (which
control refused it and why: written for a model, and never carrying a credential), not the
SDK's default "An error occurred while running the tool".
(tests/integration/mcp_proxy/test_mcp_effector_agents_sdk.py drives it with a scripted model.)
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Any

from agents import Agent, ModelSettings, Runner
from agents.mcp import MCPServerStreamableHttp

INSTRUCTIONS = ("You operate the payments system through its tools. Amounts are in cents. "
                "If a tool is refused, say so and why; never retry a refused call.")


def tell_the_model(ctx: Any, error: Exception) -> str:
    """The SDK's failure_error_function: hand the proxy's refusal to the model as it is."""
    return f"The tool call failed: {error}"


async def run(prompt: str, model: Any = None, url: str | None = None, max_turns: int = 8) -> Any:
    """One run of the agent against the MCP server at `url` (default $MCP_SERVER_URL)."""
    url = url or os.environ.get("MCP_SERVER_URL", "http://127.0.0.1:8931/mcp")
    # A call that waits for a human's approval keeps the request open: give it time.
    async with MCPServerStreamableHttp(name="payments", params={"url": url, "timeout": 30, "sse_read_timeout": 900},
                                       client_session_timeout_seconds=900,
                                       failure_error_function=tell_the_model) as payments:
        agent = Agent(name="payments-agent", instructions=INSTRUCTIONS, mcp_servers=[payments],
                      model=model if model is not None else os.environ.get("OPENAI_MODEL", "gpt-4.1-mini"),
                      model_settings=ModelSettings(parallel_tool_calls=False))
        return await Runner.run(agent, prompt, max_turns=max_turns)


def main() -> None:
    result = asyncio.run(run(" ".join(sys.argv[1:]) or "What is the open balance?"))
    print(result.final_output)


if __name__ == "__main__":
    main()
