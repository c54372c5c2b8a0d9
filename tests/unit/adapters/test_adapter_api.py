"""Every adapter module offers the same two documented names, and checks declarations when wrapping."""

from __future__ import annotations

import importlib
import inspect

import pytest
from agent_saga import ConfigurationError

ADAPTERS = ["langgraph", "openai_agents", "llamaindex", "autogen"]  # crewai: crewai_cases.py


@pytest.mark.parametrize("name", ADAPTERS)
def test_each_adapter_exports_a_documented_wrap_tool_and_async_saga_run(name: str) -> None:
    module = importlib.import_module(f"agent_saga.adapters.{name}")
    assert {"saga_run", "wrap_tool"} <= set(module.__all__)
    assert module.__doc__ and module.wrap_tool.__doc__ and module.saga_run.__doc__
    assert inspect.iscoroutinefunction(module.saga_run)


@pytest.mark.parametrize("name", ADAPTERS)
def test_a_declaration_that_can_never_run_is_refused_when_wrapping(name: str) -> None:
    module = importlib.import_module(f"agent_saga.adapters.{name}")

    def refund(charge_id: str) -> str:
        """Refund a charge."""
        return charge_id

    with pytest.raises(ConfigurationError, match="COMPENSABLE needs compensate="):
        module.wrap_tool(refund, semantics="COMPENSABLE")
