"""The payload of a ``ROUTING_DECISION`` / ``ROUTING_REFUSED`` record, built as text.

The record names every candidate and why (``RoutingDecision.to_doc``). Most of it is the
same from one call to the next and comes from the route alone: host names, models, ranks,
the verdicts a call's shape decides (no tool calling, no JSON mode, a cost class above
the limit) and "eligible; X answered first". The route screens those once (``Route``:
``screened``, ``record_text``, ``candidate_texts``, ``refusal_heads``); the record joins
them with what is new to the call. The caller only picks the route's texts (dictionary
look-ups); the WAL's flusher builds the rest as it seals the record:

- scrubbed per record: what came from outside the route: a failed candidate's error (the
  host's words), a breaker's reason, the context id and the saga the caller passed, a
  chosen candidate's usage and the call's needs when they hold anything but integers
  (the host reported the one, a pluggable function counted the other);
- encoded without scrubbing: the context-window refusals (the route's screened head, and
  a reason made of two numbers the router computed), a chosen candidate whose usage is
  integers (the route's names and numbers), the call id (random hex), the prompt's
  SHA-256 and the attempt number.

The text is byte for byte ``canonical_json`` of what the scrubber makes of ``to_doc()``
(tests/unit/routing/test_decision_record_text.py pins it), so the record on disk, its
digest and every reader are unchanged. A route whose names the scrubber would touch is
not screened; its records take the ordinary path (the flusher encodes and scrubs them).
"""

from __future__ import annotations

from json.encoder import encode_basestring
from typing import Any

from ..chain import RESERVED_SAGA
from ..records import canonical_json
from ..scrubber import scrub_payload
from ..wal.prepared import PreparedPayload
from ._decision import Candidate, RoutingDecision
from ._ir import Usage
from ._route import Route

__all__ = ["decision_payload"]


def decision_payload(decision: RoutingDecision, route: Route, type_: str, saga: str | None) -> PreparedPayload:
    """The record payload of ``decision`` (made on ``route``, a screened one) in ``saga``:
    the route's texts picked now, the rest built when the flusher seals the record. A
    part that is not the route's own (another name, another route) is scrubbed.

    What the flusher is handed is strings, numbers and tuples of them, not the decision's
    objects: kept alive until the record is sealed, objects would be walked by the cyclic
    garbage collector on the caller's time."""
    known = route.candidate_texts()
    heads, hosts = route.refusal_heads, route.hosts
    parts: list[Part] = []
    for c in decision.candidates:
        text = known.get(id(c))
        if text is not None:
            parts.append(text)
            continue
        h = hosts[c.rank - 1] if 0 < c.rank <= len(hosts) else None
        own = h is not None and h.name == c.host and h.model == c.model
        u = c.usage
        if own and c.outcome == "refused" and u is None and c.elapsed_ms is None:
            parts.append((heads[c.rank - 1], c.reasons))  # the route's head, the router's reasons
        elif own and c.outcome == "chosen" and not c.reasons and _plain(u):
            parts.append((c.host, c.model, c.rank, c.elapsed_ms, *((u.prompt_tokens, u.completion_tokens, u.reported)
                                                                 if u is not None else ())))
        else:
            parts.append((c.to_doc(),))  # a host's or a breaker's words: scrubbed
    own_route = decision.route == route.record_doc and (decision.chosen is None or any(
        h.name == decision.chosen for h in hosts))
    return PreparedPayload(_Build((decision.id, decision.attempt, decision.chosen, decision.context,
                                   decision.prompt_sha256, decision.needs, tuple(parts),
                                   route.record_text if own_route else decision.route, own_route, type_, saga)))


#: One candidate for the flusher: its text; (refusal head, reasons); (host, model, rank,
#: elapsed_ms[, prompt, completion, reported]) of the chosen one; or (document,) to scrub.
Part = str | tuple[Any, ...]


class _Build:
    """The record text of one decision (called once, on the flusher)."""

    __slots__ = ("args",)

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args = args

    def __call__(self) -> str:
        call, attempt, chosen, context, prompt, needs, parts, route, own_route, type_, saga = self.args
        texts: list[str] = []
        fresh: list[tuple[int, dict[str, Any]]] = []
        for part in parts:
            if part.__class__ is str:
                texts.append(part)
            elif len(part) == 2:  # a refusal head: the reasons are the router's words and numbers
                texts.append(part[0] + ",".join([encode_basestring(r) for r in part[1]]) + "]}")
            elif len(part) == 1:
                fresh.append((len(texts), part[0]))
                texts.append("")
            else:  # chosen: the route's names, the router's and the host's numbers
                host, model, rank, elapsed, *usage = part
                texts.append(canonical_json(Candidate(host, model, rank, "chosen", (), Usage(*usage) if usage else None,
                                                      elapsed).to_doc()))
        counted = needs["tokens"].__class__ is int and needs["context_tokens"].__class__ is int
        if fresh or context is not None or saga is not None or not counted or not own_route:
            outside: dict[str, Any] = {"context": context, "needs": needs, "saga": saga}
            if fresh:
                outside["candidates"] = [doc for _, doc in fresh]
            if not own_route:  # not the route's own: scrubbed like the rest
                outside["route"], outside["chosen"] = route, chosen
            clean = scrub_payload(outside, type_, RESERVED_SAGA)
            assert clean is not None
            needs, context, saga = clean["needs"], clean["context"], clean["saga"]
            for (i, _), doc in zip(fresh, clean.get("candidates", ()), strict=True):
                texts[i] = canonical_json(doc)
            if not own_route:
                route, chosen = canonical_json(clean["route"]), clean["chosen"]
        # canonical_json's layout: keys sorted, no spaces (the tests compare the two)
        return (f'{{"attempt":{_value(attempt)},"call":{_value(call)},'
                f'"candidates":[{",".join(texts)}],"chosen":{_value(chosen)},'
                f'"context":{_value(context)},"needs":{canonical_json(needs)},'
                f'"prompt_sha256":{_value(prompt)},"route":{route},'
                f'"saga":{_value(saga)}}}')


def _value(v: Any) -> str:
    """``canonical_json(v)``, without building an encoder for the usual None, str and int."""
    if v is None:
        return "null"
    if v.__class__ is str:
        return encode_basestring(v)
    if v.__class__ is int:
        return int.__repr__(v)
    return canonical_json(v)


def _plain(usage: Usage | None) -> bool:
    """True when ``usage`` holds integers and a bool only (nothing a scrubber reads)."""
    return usage is None or (usage.prompt_tokens.__class__ is int and usage.completion_tokens.__class__ is int
                             and usage.reported.__class__ is bool)
