"""Routing: one IR over every model host, and a Router that says why it chose each one.

    from agent_saga.routing import (Capabilities, Constraints, Message, ModelRequest,
                                    OpenAIHost, Route, Router)

    router = Router(Route([
        OpenAIHost("local-7b", "http://127.0.0.1:8080/v1", "llama-3.1-8b-instruct",
                   Capabilities(context_tokens=8192, cost_class="Free")),
        OpenAIHost("frontier", "https://api.example.com/v1", "big-model",
                   Capabilities(context_tokens=200_000, tools=True, json_mode=True, cost_class="High"),
                   credential_ref="frontier-api-key"),
    ]))
    response = router.complete(ModelRequest((Message("user", "Hello"),), max_tokens=64))
    print(response.content, response.usage.total_tokens)
    print(response.decision.explain())     # every candidate, and why

The public API (docs/agent-runtime.md, "Routing"):

    IR          Message, Tool, ToolCall, ModelRequest, HostAnswer, Usage, estimate_tokens
    hosts       Host (the base), OpenAIHost (HTTP, chat completions), CallableHost (a
                Python callable), Capabilities, HostError
    routes      Route (hosts, preference, Constraints), RedisRouteSource (ModelRoutes from
                the policy plane, live), RouteSource (the protocol)
    the router  Router.complete(request, constraints=, context=, timeout=) -> ModelResponse
                Router.plan(request) -> the candidates before any call
    decisions   RoutingDecision (every Candidate with its outcome and reasons)
    refusals    RoutingRefused (no host answered), ModelActionRefused (malformed twice),
                RoutingUnavailable (no route)
    records     ROUTING_DECISION, ROUTING_REFUSED, MODEL_ACTION_REPAIRED, MODEL_ACTION_REFUSED

    _ir.py        the request / answer value objects
    _hosts.py     hosts and capabilities
    _route.py     Route and Constraints
    _decision.py  Candidate, RoutingDecision, ModelResponse, the refusals
    _router.py    Router
    _source.py    RedisRouteSource
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._decision import Candidate as Candidate
    from ._decision import ModelActionRefused as ModelActionRefused
    from ._decision import ModelResponse as ModelResponse
    from ._decision import RoutingDecision as RoutingDecision
    from ._decision import RoutingRefused as RoutingRefused
    from ._hosts import COST_CLASSES as COST_CLASSES
    from ._hosts import CallableHost as CallableHost
    from ._hosts import Capabilities as Capabilities
    from ._hosts import Host as Host
    from ._hosts import HostError as HostError
    from ._hosts import OpenAIHost as OpenAIHost
    from ._ir import HostAnswer as HostAnswer
    from ._ir import Message as Message
    from ._ir import ModelRequest as ModelRequest
    from ._ir import Tool as Tool
    from ._ir import ToolCall as ToolCall
    from ._ir import Usage as Usage
    from ._ir import estimate_tokens as estimate_tokens
    from ._route import Constraints as Constraints
    from ._route import Route as Route
    from ._router import ACTION_REFUSED as ACTION_REFUSED
    from ._router import DECISION as DECISION
    from ._router import REFUSED as REFUSED
    from ._router import REPAIRED as REPAIRED
    from ._router import Router as Router
    from ._router import RouteSource as RouteSource
    from ._router import action_problem as action_problem
    from ._source import RedisRouteSource as RedisRouteSource
    from ._source import RoutingUnavailable as RoutingUnavailable

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._decision": (
        "Candidate", "ModelActionRefused", "ModelResponse", "RoutingDecision",
        "RoutingRefused",
    ),
    "._hosts": ("COST_CLASSES", "CallableHost", "Capabilities", "Host", "HostError", "OpenAIHost"),
    "._ir": (
        "HostAnswer", "Message", "ModelRequest", "Tool", "ToolCall", "Usage",
        "estimate_tokens",
    ),
    "._route": ("Constraints", "Route"),
    "._router": (
        "ACTION_REFUSED", "DECISION", "REFUSED", "REPAIRED", "Router", "RouteSource",
        "action_problem",
    ),
    "._source": ("RedisRouteSource", "RoutingUnavailable"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
