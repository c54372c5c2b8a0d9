"""Importing agent_saga (or agent_saga.adapters) never imports a framework."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("langchain_core", "langgraph", "agents", "llama_index", "autogen_core",
              "autogen_agentchat", "autogen_ext", "crewai", "openai", "pydantic")

PROBE = f"""
import sys
import agent_saga, agent_saga.adapters, agent_saga.adapters._common, agent_saga.kit
loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({FRAMEWORKS!r}))
print(','.join(loaded))
"""


def test_importing_agent_saga_imports_no_framework() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


def test_an_adapter_without_its_framework_names_the_extra() -> None:
    probe = (
        "import sys; sys.modules['langchain_core'] = None; sys.modules['langchain_core.tools'] = None\n"
        "try:\n    import agent_saga.adapters.langgraph\nexcept ImportError as e:\n    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "pip install 'agent-saga[langgraph]'" in out.stdout
