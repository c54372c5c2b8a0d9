"""``Router``: one call, the best host that can serve it, and a record of why.

    router = Router(Route([local, api], constraints=Constraints(max_cost_class="Medium")))
    router = Router(RedisRouteSource(url, agent="payments-agent", namespaces=["payments"]))
    response = router.complete(ModelRequest((Message("user", "Summarise the ticket"),)))
    response.decision.explain()      # every candidate and why

For one call the router:
1. measures what the call needs (estimated tokens of the prompt plus ``max_tokens``,
   tools, JSON mode) and merges the route's constraints with the call's;
2. refuses every host that falls short, naming every shortfall (context window, tool
   calling, JSON mode, cost class); skips a host whose circuit breaker is open;
3. tries the rest in preference order, failing over on any host error (429, 5xx, a
   timeout, a slow stream, an unreachable endpoint), feeding each host's breaker;
4. records the decision (``ROUTING_DECISION``) or the refusal (``ROUTING_REFUSED``) as one
   chained WAL record naming every candidate and why, and returns it on the response
   (or on the ``RoutingRefused`` it raises);
5. checks the model's action: an answer that is not the JSON object JSON mode asked for,
   a call of a tool that was not offered, or arguments that are not a JSON object is
   repaired once (``MODEL_ACTION_REPAIRED``: the model is told what was wrong and asked
   again, routed afresh) and then refused (``MODEL_ACTION_REFUSED``, ``ModelActionRefused``).

Invariants:
- The decision lists every host of the route, in preference order, with its outcome:
  the log alone answers "why this model, and why not the others".
- A refusal is an exception carrying the decision; nothing is guessed and no answer is
  invented. A failed WAL append is logged and raised (an unrecorded decision is not one).
- Records are in the reserved saga ``wal`` and carry the saga the call was made in.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import time
from collections.abc import Callable
from hashlib import sha256 as _sha256
from json.encoder import encode_basestring
from typing import Any, Protocol, runtime_checkable

from ..chain import RESERVED_SAGA
from ..context import current_saga_id
from ..controls.breaker import BreakerPolicy, CircuitBreaker
from ..errors import ConfigurationError
from ..gates import StepRequest
from ..records import ExtensionType
from ..semantics import ActionSemantics
from ..wal.base import BaseWAL
from ..wal.default import DEFAULT_WAL
from ._decision import (
    Candidate,
    ModelActionRefused,
    ModelResponse,
    RoutingDecision,
    RoutingRefused,
    new_candidate,
    new_decision,
    new_response,
)
from ._hosts import Host, HostError
from ._ir import HostAnswer, Message, ModelRequest, Usage, estimate_tokens
from ._record import SCRUB, Part, chosen_part, record_payload
from ._route import Constraints, Route

__all__ = ["DECISION", "REFUSED", "REPAIRED", "ACTION_REFUSED", "RouteSource", "Router", "action_problem"]

log = logging.getLogger("agent_saga.routing")

#: Call ids: this process's random prefix and a counter (unique in the log, cheap to make).
_PROCESS = os.urandom(5).hex()
_SEQ = itertools.count(1)

DECISION = ExtensionType.ROUTING_DECISION.value
REFUSED = ExtensionType.ROUTING_REFUSED.value
REPAIRED = ExtensionType.MODEL_ACTION_REPAIRED.value
ACTION_REFUSED = ExtensionType.MODEL_ACTION_REFUSED.value


@runtime_checkable
class RouteSource(Protocol):
    """Where a router reads its route on every call (``RedisRouteSource``: ModelRoutes)."""

    def route(self) -> Route:
        """The route in force now; raises ``StoreUnavailable`` when there is none."""
        ...


class _Static:
    __slots__ = ("_route",)

    def __init__(self, route: Route) -> None:
        self._route = route

    def route(self) -> Route:
        return self._route


def action_problem(request: ModelRequest, answer: HostAnswer) -> str | None:
    """What makes ``answer`` unusable for ``request`` (``None``: nothing)."""
    if answer.tool_calls:
        names = {t.name for t in request.tools}
        for c in answer.tool_calls:
            if c.name not in names:
                offered = ", ".join(sorted(names)) or "none were offered"
                return f"it called the tool {c.name!r}, which is not one of the tools offered ({offered})"
            if c.arguments is None:
                return f"the arguments of its call of {c.name} are not a JSON object: {c.arguments_raw[:120]!r}"
        return None
    if request.json_mode:
        try:
            value = _json_value(answer.content)
        except ValueError as exc:
            return f"JSON mode was asked for and the answer is not JSON ({exc}): {answer.content[:120]!r}"
        if not isinstance(value, dict):
            return f"JSON mode was asked for and the answer is JSON but not an object: {answer.content[:120]!r}"
    return None


_SCAN = json.JSONDecoder().scan_once  # type: ignore[attr-defined]  # json.loads' scanner, without its two frames


def _json_value(text: str) -> Any:
    """``json.loads(text)``: the scanner alone for a text that is one JSON value and
    nothing else, ``json.loads`` itself (its errors, its whitespace rules) for the rest."""
    try:
        value, end = _SCAN(text, 0)
    except (StopIteration, ValueError):
        end = -1
    if end != len(text):
        return json.loads(text)
    return value


def _repair_request(request: ModelRequest, answer: HostAnswer, problem: str) -> ModelRequest:
    said = answer.content
    if answer.tool_calls:
        said += "".join(f"\n[called {c.name} with {c.arguments_raw}]" for c in answer.tool_calls)
    fix = ("call only the tools offered, with arguments that are one JSON object" if answer.tool_calls
           else "one JSON object and nothing else")
    return request.with_messages(Message("assistant", said),
                                 Message("user", f"Your last answer could not be used: {problem}. Answer again "
                                                 f"with {fix}."))


class Router:
    """Routes calls over a route's hosts (see the module doc).

    ``route``: a ``Route``, or a ``RouteSource`` read on every call (``RedisRouteSource``).
    ``wal``: where decisions are recorded (default: the process-wide WAL; ``None`` records
    nothing and is for tests only). ``breaker``: a ``BreakerPolicy`` for the per-host
    circuit breakers (or a ``CircuitBreaker`` to share). ``timeout``: seconds one host may
    take for one call. ``count_tokens``: request -> tokens (default: ``estimate_tokens``
    over the messages and tools). ``durable``: every record of a call is fdatasync'ed
    (``barrier_sync``) before ``complete`` returns or raises; by default a decision is
    appended (its place in the chain fixed) and made durable by the next fence of the
    WAL — a COMPENSABLE or IRREVERSIBLE step's intent, which covers every earlier record
    — or the flusher's linger (see docs/agent-runtime.md, "Durability").
    """

    def __init__(self, route: Route | RouteSource, *, wal: BaseWAL | None = DEFAULT_WAL,
                 breaker: BreakerPolicy | CircuitBreaker | None = None, timeout: float = 60.0,
                 count_tokens: Callable[[ModelRequest], int] | None = None, durable: bool = False) -> None:
        if isinstance(route, Route):
            self._source: RouteSource = _Static(route)
        elif isinstance(route, RouteSource):
            self._source = route
        else:
            raise ConfigurationError(f"Router needs a Route(...) or a route source such as RedisRouteSource, got "
                                     f"{route!r}")
        if wal is not None and not isinstance(wal, BaseWAL):
            raise ConfigurationError(f"wal must be a BaseWAL (or None), got {wal!r}")
        if not 0 < timeout < float("inf"):
            raise ConfigurationError(f"timeout must be a positive number of seconds, got {timeout!r}")
        self._wal = wal
        self.durable = bool(durable)
        if isinstance(breaker, CircuitBreaker):
            self.breaker = breaker
        else:
            self.breaker = CircuitBreaker(breaker or BreakerPolicy(failure_threshold=3, cool_down=30.0), wal=wal,
                                          name="router")
        self.timeout = float(timeout)
        self._count = count_tokens or ModelRequest.needed_tokens
        self._closed: dict[str, StepRequest] = {}  # host name -> the step its calls report
        self.calls = 0

    @property
    def source(self) -> RouteSource:
        """Where the route is read."""
        return self._source

    # ------------------------------------------------------------------ the call
    def complete(self, request: ModelRequest, *, constraints: Constraints | None = None,
                 context: Any = None, timeout: float | None = None) -> ModelResponse:
        """Route ``request``; return the answer and its decision. Raises ``RoutingRefused``
        (no host answered) or ``ModelActionRefused`` (malformed twice), both carrying the
        decision; ``StoreUnavailable`` when the route cannot be read."""
        if not isinstance(request, ModelRequest):
            raise ConfigurationError(f"Router.complete needs a ModelRequest(...), got {type(request).__name__}")
        context_id = context if isinstance(context, str) or context is None else str(getattr(context, "id", context))
        call = f"{_PROCESS}{next(_SEQ):06x}"
        decision, answer = self._route_once(request, constraints, context_id, call, 1, timeout)
        problem = action_problem(request, answer)
        if problem is None:
            return new_response(answer.content, answer.tool_calls, answer.finish_reason, answer.usage,
                                decision.chosen or "", answer.model, decision, (decision,), None)
        self._append(REPAIRED, {"call": call, "host": decision.chosen, "problem": problem, "saga": current_saga_id()})
        log.warning("router: the answer of %s could not be used (%s); asking once more", decision.chosen, problem)
        second, answer2 = self._route_once(_repair_request(request, answer, problem), constraints, context_id, call,
                                           2, timeout)
        problem2 = action_problem(request, answer2)
        if problem2 is None:
            return self._response(answer2, second, (decision, second), problem)
        self._append(ACTION_REFUSED, {"call": call, "host": second.chosen, "problem": problem2,
                                      "first_problem": problem, "saga": current_saga_id()})
        raise ModelActionRefused(problem2, second, problem)

    def plan(self, request: ModelRequest, *, constraints: Constraints | None = None) -> tuple[Candidate, ...]:
        """The candidates for ``request`` before any call: refused ones with every reason,
        breaker-open ones, and the rest ``untried`` in the order they would be tried."""
        route = self._source.route()
        _, verdicts, _, _ = self._screen(route, request, constraints, False)
        return tuple(c if c is not None else Candidate(h.name, h.model, i + 1, "untried", ("eligible",))
                     for i, (h, c) in enumerate(zip(route.hosts, verdicts, strict=True)))

    # ------------------------------------------------------------------ internals
    def _screen(self, route: Route, request: ModelRequest, constraints: Constraints | None,
                record: bool) -> tuple[dict[str, Any], list[Candidate | None], list[Part | None],
                                       tuple[tuple[int, Host], ...]]:
        """What the call needs, the verdict on every host that cannot serve it (``None``:
        eligible), when ``record`` each verdict's part of the record (``_record``), and
        the hosts the call's shape does not refuse (index, host), in preference order."""
        c = route.constraints.merged(constraints)
        tokens = self._count(request)
        need_ctx = max(tokens, c.min_context_tokens or 0)
        tools = bool(request.tools) or c.require_tools
        json_mode = request.json_mode or c.require_json_mode
        needs = {"tokens": tokens, "context_tokens": need_ctx, "tools": tools, "json_mode": json_mode,
                 "max_cost_class": c.max_cost_class}
        # None: eligible (an open breaker is decided at try time: a trial call may be due)
        screen = route.screen(c, tools, json_mode, bool(request.tools), request.json_mode)
        out: list[Candidate | None] = screen.verdicts.copy()
        parts: list[Part | None] = screen.parts.copy() if record else []  # type: ignore[assignment]
        heads = route.refusal_heads
        last, reason, encoded = -1, "", ""
        for ctx, i, h, static, tail in screen.by_context:  # smallest window first
            if ctx >= need_ctx:
                break
            if ctx != last:  # hosts with the same window share the reason's text
                what = "the call needs" if need_ctx == tokens else "the route requires"
                last, reason = ctx, f"context window {ctx} tokens < {need_ctx} {what}"
                encoded = encode_basestring(reason)
            out[i] = new_candidate(h.name, h.model, i + 1, "refused", (reason, *static) if static else (reason,))
            if record:  # the route's texts around the router's words and numbers: one string kept
                parts[i] = heads[i] + encoded + tail
        return needs, out, parts, screen.eligible

    def _route_once(self, request: ModelRequest, constraints: Constraints | None, context: str | None,
                    call: str, attempt: int, timeout: float | None) -> tuple[RoutingDecision, HostAnswer]:
        route = self._source.route()
        record = self._wal is not None and route.screened
        needs, verdicts, parts, eligible = self._screen(route, request, constraints, record)
        budget = self.timeout if timeout is None else float(timeout)
        chosen: Host | None = None
        answer: HostAnswer | None = None
        untried: tuple[tuple[Candidate, str], ...] = ()
        for i, h in eligible:
            if verdicts[i] is not None:  # refused for its context window
                continue
            if chosen is not None:
                verdicts[i], text = untried[i]
                if record:
                    parts[i] = text
                continue
            v, answer = self._try(h, i + 1, request, call, budget)
            verdicts[i] = v
            if answer is not None:
                chosen = h
                untried = route.untried_row(h.name)
            if record:  # else a host's or a breaker's words, or a usage not integers: scrubbed
                parts[i] = (answer is not None and chosen_part(route.chosen_mids[i], v)) or (SCRUB, v.to_doc())
        # every host has its verdict now: refused, tried, or untried
        decision = new_decision(call, {"id": route.id, "uid": route.uid or None, "generation": route.generation},
                                needs, tuple(verdicts),  # type: ignore[arg-type]
                                None if chosen is None else chosen.name,
                                _sha256(request.canonical_text().encode()).hexdigest(), context, attempt)
        self.calls += 1
        if chosen is None or answer is None:
            self._append(REFUSED, decision, route if record else None, parts)  # type: ignore[arg-type]
            log.warning("router: %s", decision.explain())
            raise RoutingRefused(decision)
        self._append(DECISION, decision, route if record else None, parts)  # type: ignore[arg-type]
        return decision, answer

    def _try(self, h: Host, rank: int, request: ModelRequest, call: str,
             budget: float) -> tuple[Candidate, HostAnswer | None]:
        closed = self._closed.get(h.name)
        if closed is None:
            closed = self._closed[h.name] = StepRequest(RESERVED_SAGA, f"closed/{h.name}", _tool(h),
                                                        ActionSemantics.REVERSIBLE)
        tool = closed.tool
        step: StepRequest | None = None
        if self.breaker.state(tool) != "closed":
            step = StepRequest(RESERVED_SAGA, f"{call}/{h.name}", tool, ActionSemantics.REVERSIBLE)
            why = self.breaker.allow(step)
            if why is not None:
                return Candidate(h.name, h.model, rank, "breaker", (why,)), None
        started = time.perf_counter()
        try:
            answer = h.complete(request, timeout=budget)
        except HostError as exc:
            elapsed = (time.perf_counter() - started) * 1000
            step = step or StepRequest(RESERVED_SAGA, f"{call}/{h.name}", tool, ActionSemantics.REVERSIBLE)
            self.breaker.on_outcome(step, False, exc)
            return Candidate(h.name, h.model, rank, "failed", (f"{exc.kind}: {exc}",), elapsed_ms=elapsed), None
        elapsed = (time.perf_counter() - started) * 1000
        # Successes count too: a failure rate needs the volume. A call made while the
        # circuit was closed is no trial call: its step (one per host, never a call's id)
        # matches no trial in flight, so it is counted, exactly as a step of its own would be.
        self.breaker.on_outcome(step or closed, True, None)
        usage = answer.usage
        if not usage.reported:
            usage = Usage(request.prompt_tokens(), estimate_tokens(answer.content), reported=False)
            answer = HostAnswer(answer.content, answer.tool_calls, answer.finish_reason, usage, answer.model)
        return new_candidate(h.name, h.model, rank, "chosen", (), usage, elapsed), answer

    def _response(self, answer: HostAnswer, decision: RoutingDecision, decisions: tuple[RoutingDecision, ...],
                  repaired: str | None) -> ModelResponse:
        return ModelResponse(answer.content, answer.tool_calls, answer.finish_reason, answer.usage,
                             decision.chosen or "", answer.model, decision, decisions, repaired)

    def _append(self, type_: str, payload: dict[str, Any] | RoutingDecision, route: Route | None = None,
                parts: list[Part] | None = None) -> None:
        """Append ``payload``: a decision made on ``route`` (a screened one) from the parts
        the router picked as it screened and tried, what is new to the call scrubbed on the
        flusher; without ``route``, encoded and scrubbed whole on the flusher."""
        wal = self._wal
        if wal is None:
            return
        try:
            if route is not None and parts is not None and isinstance(payload, RoutingDecision):
                seq = wal.append_prepared(type_, RESERVED_SAGA, None,
                                          record_payload(payload, route, parts, type_, current_saga_id()))
            else:
                if isinstance(payload, RoutingDecision):
                    doc = payload.to_doc()
                    doc["saga"] = current_saga_id()
                    payload = doc
                seq = wal.append(type_, RESERVED_SAGA, None, payload)
            if self.durable:
                wal.barrier_sync(seq)
        except Exception:
            log.error("router: %s could not be recorded in the WAL", type_)
            raise


def _tool(h: Host) -> str:
    return f"model:{h.name}"
