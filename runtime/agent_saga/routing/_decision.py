"""What a routing decision says: every candidate, and why it was or was not chosen.

``RoutingDecision.candidates`` lists EVERY host of the route, in preference order, each
with an ``outcome``:

    chosen     it answered this call
    failed     it was tried and failed (429, 5xx, a timeout, a slow stream...): the reason
    breaker    its circuit breaker is open: not tried
    refused    it cannot serve this call: every capability or constraint it misses
    untried    it could serve the call, but a more preferred host answered first

The same document is the payload of the ``ROUTING_DECISION`` / ``ROUTING_REFUSED`` record.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Literal

from ..errors import SagaError
from ._ir import HostAnswer, ToolCall, Usage

__all__ = ["Candidate", "ModelActionRefused", "ModelResponse", "RoutingDecision", "RoutingRefused"]

Outcome = Literal["chosen", "failed", "breaker", "refused", "untried"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """One host of the route and what became of it for one call."""

    host: str
    model: str
    rank: int
    outcome: Outcome
    reasons: tuple[str, ...] = ()
    usage: Usage | None = None
    elapsed_ms: float | None = None

    @property
    def reason(self) -> str:
        """The reasons as one sentence."""
        return "; ".join(self.reasons)

    def to_doc(self) -> dict[str, Any]:
        """The candidate as JSON."""
        doc: dict[str, Any] = {"host": self.host, "model": self.model, "rank": self.rank, "outcome": self.outcome,
                               "reasons": list(self.reasons)}
        if self.usage is not None:
            doc["usage"] = self.usage.to_doc()
        if self.elapsed_ms is not None:
            doc["elapsed_ms"] = round(self.elapsed_ms, 3)
        return doc


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """Why this model, and why not the others (see the module doc).

    ``id``: the call's id (also in the record). ``route``: which route decided
    (``{id, uid, generation}``). ``needs``: what the call required (tokens, tools, JSON
    mode, cost). ``chosen``: the host that answered, ``None`` on a refusal.
    ``prompt_sha256``: the SHA-256 of the request sent. ``context``: the id of the
    ``ContextBroker`` serving whose messages the request carries, if any.
    """

    id: str
    route: dict[str, Any]
    needs: dict[str, Any]
    candidates: tuple[Candidate, ...]
    chosen: str | None
    prompt_sha256: str
    context: str | None = None
    attempt: int = 1

    @property
    def refused(self) -> bool:
        """True when no host answered."""
        return self.chosen is None

    def candidate(self, host: str) -> Candidate:
        """The verdict on ``host`` (``KeyError`` if the route has no such host)."""
        for c in self.candidates:
            if c.host == host:
                return c
        raise KeyError(host)

    def explain(self) -> str:
        """One line per candidate: ``host: outcome (reasons)``."""
        head = f"routed to {self.chosen}" if self.chosen else "refused: no host could answer"
        lines = [f"{head} ({self.needs_text()})"]
        lines += [f"  {c.rank}. {c.host}: {c.outcome}" + (f" ({c.reason})" if c.reasons else "")
                  for c in self.candidates]
        return "\n".join(lines)

    def needs_text(self) -> str:
        """What the call required, in words."""
        n = self.needs
        parts = [f"~{n['tokens']} tokens"]
        if n.get("tools"):
            parts.append("tools")
        if n.get("json_mode"):
            parts.append("JSON mode")
        if n.get("max_cost_class"):
            parts.append(f"cost <= {n['max_cost_class']}")
        return ", ".join(parts)

    def to_doc(self) -> dict[str, Any]:
        """The decision as JSON (the record's payload, with the ``saga`` the call was made in)."""
        return {"call": self.id, "route": self.route, "needs": self.needs, "chosen": self.chosen,
                "prompt_sha256": self.prompt_sha256, "context": self.context, "attempt": self.attempt,
                "candidates": [c.to_doc() for c in self.candidates]}


@dataclass(frozen=True, slots=True)
class ModelResponse:
    """The model's answer and the decision that produced it.

    ``usage``: the tokens of the call that produced this answer; ``decisions``: every
    decision made for it (two when a malformed action was repaired), ``repaired``: what
    was wrong with the first answer, if it was repaired.
    """

    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    usage: Usage
    host: str
    model: str
    decision: RoutingDecision
    decisions: tuple[RoutingDecision, ...] = field(default=())
    repaired: str | None = None

    @property
    def answer(self) -> HostAnswer:
        """The answer as a ``HostAnswer``."""
        return HostAnswer(self.content, self.tool_calls, self.finish_reason, self.usage, self.model)

    def json(self) -> Any:
        """The content parsed as JSON (a JSON-mode answer has been checked to be an object)."""
        import json

        return json.loads(self.content)


class RoutingRefused(SagaError):
    """No host answered: none could serve the call, or every one that could failed.
    ``decision`` names every candidate and why; no answer exists."""

    def __init__(self, decision: RoutingDecision) -> None:
        self.decision = decision
        super().__init__(decision.explain())


class ModelActionRefused(SagaError):
    """The model's answer could not be used (bad JSON, an unknown tool, unreadable
    arguments), once repaired and still malformed. ``problem`` says what was wrong;
    ``decision`` is the last call's. Nothing was acted on."""

    def __init__(self, problem: str, decision: RoutingDecision, first_problem: str) -> None:
        self.problem = problem
        self.first_problem = first_problem
        self.decision = decision
        super().__init__(f"the model's action was refused after one repair: {problem} (first answer: "
                         f"{first_problem}); nothing was acted on")


# ---------------------------------------------------------------------- the router's constructors
# The router makes a handful of these per call. A frozen dataclass's ``__init__`` sets each
# field through ``object.__setattr__``; these make the same object (the same class, every
# field set, in order; none of the three has a ``__post_init__``) by setting the slots
# directly, every field given positionally. tests/unit/routing pins them to the classes.
_new = object.__new__


def _setters(cls: type, names: tuple[str, ...]) -> tuple[Any, ...]:
    if tuple(f.name for f in fields(cls)) != names or "__post_init__" in vars(cls):
        raise TypeError(f"{cls.__name__}'s fields or checks changed: update its constructor in this module")
    return tuple(getattr(cls, n).__set__ for n in names)


(_C_HOST, _C_MODEL, _C_RANK, _C_OUTCOME, _C_REASONS, _C_USAGE, _C_ELAPSED) = _setters(
    Candidate, ("host", "model", "rank", "outcome", "reasons", "usage", "elapsed_ms"))
(_D_ID, _D_ROUTE, _D_NEEDS, _D_CANDIDATES, _D_CHOSEN, _D_SHA, _D_CONTEXT, _D_ATTEMPT) = _setters(
    RoutingDecision, ("id", "route", "needs", "candidates", "chosen", "prompt_sha256", "context", "attempt"))
(_R_CONTENT, _R_TOOL_CALLS, _R_FINISH, _R_USAGE, _R_HOST, _R_MODEL, _R_DECISION, _R_DECISIONS, _R_REPAIRED) = _setters(
    ModelResponse, ("content", "tool_calls", "finish_reason", "usage", "host", "model", "decision", "decisions",
                    "repaired"))


def new_candidate(host: str, model: str, rank: int, outcome: Outcome, reasons: tuple[str, ...],
                  usage: Usage | None = None, elapsed_ms: float | None = None) -> Candidate:
    """``Candidate(host, model, rank, outcome, reasons, usage, elapsed_ms)``."""
    c = _new(Candidate)
    _C_HOST(c, host)
    _C_MODEL(c, model)
    _C_RANK(c, rank)
    _C_OUTCOME(c, outcome)
    _C_REASONS(c, reasons)
    _C_USAGE(c, usage)
    _C_ELAPSED(c, elapsed_ms)
    return c


def new_decision(id: str, route: dict[str, Any], needs: dict[str, Any], candidates: tuple[Candidate, ...],
                 chosen: str | None, prompt_sha256: str, context: str | None, attempt: int) -> RoutingDecision:
    """``RoutingDecision(...)`` with every field given."""
    d = _new(RoutingDecision)
    _D_ID(d, id)
    _D_ROUTE(d, route)
    _D_NEEDS(d, needs)
    _D_CANDIDATES(d, candidates)
    _D_CHOSEN(d, chosen)
    _D_SHA(d, prompt_sha256)
    _D_CONTEXT(d, context)
    _D_ATTEMPT(d, attempt)
    return d


def new_response(content: str, tool_calls: tuple[ToolCall, ...], finish_reason: str, usage: Usage, host: str,
                 model: str, decision: RoutingDecision, decisions: tuple[RoutingDecision, ...],
                 repaired: str | None) -> ModelResponse:
    """``ModelResponse(...)`` with every field given."""
    r = _new(ModelResponse)
    _R_CONTENT(r, content)
    _R_TOOL_CALLS(r, tool_calls)
    _R_FINISH(r, finish_reason)
    _R_USAGE(r, usage)
    _R_HOST(r, host)
    _R_MODEL(r, model)
    _R_DECISION(r, decision)
    _R_DECISIONS(r, decisions)
    _R_REPAIRED(r, repaired)
    return r
