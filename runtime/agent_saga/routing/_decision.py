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

from dataclasses import dataclass, field
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
