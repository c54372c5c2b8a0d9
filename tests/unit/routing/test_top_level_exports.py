"""The router, its IR and the context broker are importable from ``agent_saga`` itself;
the broker's module is loaded on first use, not by ``import agent_saga``."""

from __future__ import annotations

import subprocess
import sys

import agent_saga
import agent_saga.contextbroker as contextbroker
import agent_saga.routing as routing


def test_the_top_level_names_are_the_subpackages_objects() -> None:
    for name in ("Router", "Route", "Constraints", "ModelRequest", "Message", "Tool", "ModelResponse",
                 "RoutingDecision", "RoutingRefused", "OpenAIHost", "CallableHost", "RedisRouteSource"):
        assert getattr(agent_saga, name) is getattr(routing, name), name
    for name in ("ContextBroker", "Tier", "Receipt", "ServedContext", "DriftedSource"):
        assert getattr(agent_saga, name) is getattr(contextbroker, name), name


def test_import_agent_saga_loads_the_context_broker_only_when_it_is_used() -> None:
    code = ("import sys, agent_saga; before = 'agent_saga.contextbroker' in sys.modules; "
            "from agent_saga import ContextBroker; "
            "print(before, 'agent_saga.contextbroker' in sys.modules, ContextBroker.__name__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True", "ContextBroker"]
