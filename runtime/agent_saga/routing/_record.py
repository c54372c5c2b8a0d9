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
from ._decision import RoutingDecision
from ._ir import Usage
from ._route import Route

__all__ = ["decision_payload"]


def decision_payload(decision: RoutingDecision, route: Route, type_: str, saga: str | None) -> PreparedPayload:
    """The record payload of ``decision`` (made on ``route``, a screened one) in ``saga``:
    the route's texts picked now, the rest built when the flusher seals the record. A
    part that is not the route's own (another name, another route) is scrubbed."""
    known = route.candidate_texts()
    heads, hosts = route.refusal_heads, route.hosts
    parts: list[str | None] = []  # a text, a head ("...[": refusal, "{": chosen), or None: scrub
    for c in decision.candidates:
        text = known.get(id(c))
        refusal = c.outcome == "refused" and c.usage is None and c.elapsed_ms is None
        if text is None and (refusal or (c.outcome == "chosen" and not c.reasons)):
            h = hosts[c.rank - 1] if 0 < c.rank <= len(hosts) else None
            if h is not None and h.name == c.host and h.model == c.model:
                text = heads[c.rank - 1] if refusal else "{"
        parts.append(text)
    own = decision.route == route.record_doc and (decision.chosen is None or any(
        h.name == decision.chosen for h in hosts))
    return PreparedPayload(_Build(decision, parts, route.record_text if own else None, type_, saga))


class _Build:
    """The record text of one decision (called once, on the flusher; reads only values
    nobody changes: the frozen decision, its needs, and strings)."""

    __slots__ = ("decision", "parts", "route", "saga", "type")

    def __init__(self, decision: RoutingDecision, parts: list[str | None], route: str | None, type_: str,
                 saga: str | None) -> None:
        self.decision, self.parts, self.route, self.type, self.saga = decision, parts, route, type_, saga

    def __call__(self) -> str:
        d = self.decision
        texts: list[str] = []
        fresh: list[tuple[int, dict[str, Any]]] = []
        for c, part in zip(d.candidates, self.parts, strict=True):
            if part is None or (part == "{" and not _plain(c.usage)):
                fresh.append((len(texts), c.to_doc()))
                texts.append("")
            elif part == "{":  # chosen: the route's names, the router's and the host's numbers
                texts.append(canonical_json(c.to_doc()))
            elif part[-1] == "[":  # a refusal head: the reasons are the router's words and numbers
                texts.append(part + ",".join([encode_basestring(r) for r in c.reasons]) + "]}")
            else:
                texts.append(part)
        needs, context, saga, chosen = d.needs, d.context, self.saga, d.chosen
        counted = needs["tokens"].__class__ is int and needs["context_tokens"].__class__ is int
        route = self.route
        if fresh or context is not None or saga is not None or not counted or route is None:
            outside: dict[str, Any] = {"context": context, "needs": needs, "saga": saga}
            if fresh:
                outside["candidates"] = [doc for _, doc in fresh]
            if route is None:  # not the route's own: scrubbed like the rest
                outside["route"], outside["chosen"] = d.route, chosen
            clean = scrub_payload(outside, self.type, RESERVED_SAGA)
            assert clean is not None
            needs, context, saga = clean["needs"], clean["context"], clean["saga"]
            for (i, _), doc in zip(fresh, clean.get("candidates", ()), strict=True):
                texts[i] = canonical_json(doc)
            if route is None:
                route, chosen = canonical_json(clean["route"]), clean["chosen"]
        # canonical_json's layout: keys sorted, no spaces (the tests compare the two)
        return (f'{{"attempt":{_value(d.attempt)},"call":{_value(d.id)},'
                f'"candidates":[{",".join(texts)}],"chosen":{_value(chosen)},'
                f'"context":{_value(context)},"needs":{canonical_json(needs)},'
                f'"prompt_sha256":{_value(d.prompt_sha256)},"route":{route},'
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
