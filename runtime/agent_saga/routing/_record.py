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
from ._hosts import COST_CLASSES
from ._ir import Usage
from ._route import Route

__all__ = ["CHOSEN", "CHOSEN_DOC", "REFUSED_PART", "SCRUB", "Part", "chosen_part", "decision_payload", "record_payload"]


def decision_payload(decision: RoutingDecision, route: Route, type_: str, saga: str | None) -> PreparedPayload:
    """The record payload of ``decision`` (made on ``route``, a screened one) in ``saga``:
    the route's texts picked now, the rest built when the flusher seals the record. A
    part that is not the route's own (another name, another route) is scrubbed.

    What the flusher is handed is strings, numbers and tuples of them, not the decision's
    objects: kept alive until the record is sealed, objects would be walked by the cyclic
    garbage collector on the caller's time."""
    known = route.candidate_texts()
    heads, mids, hosts = route.refusal_heads, route.chosen_mids, route.hosts
    parts: list[Part] = []
    for c in decision.candidates:
        text = known.get(id(c))
        if text is not None:
            parts.append(text)
            continue
        i = c.rank - 1
        h = hosts[i] if 0 <= i < len(hosts) else None
        own = h is not None and h.name == c.host and h.model == c.model
        u = c.usage
        if own and c.outcome == "refused" and u is None and c.elapsed_ms is None:
            parts.append((REFUSED_PART, heads[i], c.reasons))  # the route's head, the router's reasons
        elif own and c.outcome == "chosen" and not c.reasons and _plain(u):
            parts.append(chosen_part(mids[i], c) or (
                CHOSEN_DOC, c.host, c.model, c.rank, c.elapsed_ms,
                *((u.prompt_tokens, u.completion_tokens, u.reported) if u is not None else ())))
        else:
            parts.append((SCRUB, c.to_doc()))  # a host's or a breaker's words: scrubbed
    return record_payload(decision, route, parts, type_, saga)


def record_payload(decision: RoutingDecision, route: Route, parts: list[Part], type_: str,
                   saga: str | None) -> PreparedPayload:
    """``decision_payload`` with the parts already picked, one per candidate in order (the
    router picks them as it screens and tries: see ``Part``)."""
    chosen = decision.chosen
    own_route = decision.route == route.record_doc and (chosen is None or chosen in route.host_names)
    return PreparedPayload(_Build((decision.id, decision.attempt, chosen, decision.context,
                                   decision.prompt_sha256, decision.needs, parts,
                                   route.record_text if own_route else decision.route, own_route, type_, saga)))


#: One candidate for the flusher: its text, or a tuple whose first item says what the rest is:
#: (REFUSED_PART, refusal head, reasons); (CHOSEN, the route's text between elapsed_ms and
#: usage, elapsed_ms, prompt, completion, reported); (CHOSEN_DOC, host, model, rank,
#: elapsed_ms[, prompt, completion, reported]); (SCRUB, document).
Part = str | tuple[Any, ...]
SCRUB, REFUSED_PART, CHOSEN, CHOSEN_DOC = range(4)


def chosen_part(mid: str, c: Candidate) -> Part | None:
    """The (CHOSEN, ...) part of a chosen candidate whose elapsed time is a float and whose
    usage is integers and a bool (``mid``: the route's text for its host), else ``None``."""
    u, e = c.usage, c.elapsed_ms
    if u is None or e.__class__ is not float:
        return None
    prompt, completion, reported = u.prompt_tokens, u.completion_tokens, u.reported
    if prompt.__class__ is not int or completion.__class__ is not int or reported.__class__ is not bool:
        return None  # not what ``_plain`` takes: scrubbed
    return (CHOSEN, mid, e, prompt, completion, reported)

_NEEDS = frozenset(("tokens", "context_tokens", "tools", "json_mode", "max_cost_class"))


class _Build(tuple):  # type: ignore[type-arg]
    """The record text of one decision (called once, on the flusher): the values it is
    built from, as one tuple (one object for the garbage collector while it is queued)."""

    __slots__ = ()

    def __call__(self) -> str:
        call, attempt, chosen, context, prompt, needs, parts, route, own_route, type_, saga = self
        texts: list[str] = []
        fresh: list[tuple[int, dict[str, Any]]] = []
        for part in parts:
            if part.__class__ is str:
                texts.append(part)
                continue
            kind = part[0]
            if kind == REFUSED_PART:  # the reasons are the router's words and numbers
                texts.append(part[1] + ",".join([encode_basestring(r) for r in part[2]]) + "]}")
            elif kind == CHOSEN:  # the route's names, the router's and the host's numbers
                _, mid, elapsed, p, c, reported = part
                texts.append(f'{{"elapsed_ms":{float.__repr__(round(elapsed, 3))},{mid},"usage":'
                             f'{{"completion_tokens":{int.__repr__(c)},"prompt_tokens":{int.__repr__(p)},'
                             f'"reported":{"true" if reported else "false"},'
                             f'"total_tokens":{int.__repr__(p + c)}}}}}')
            elif kind == CHOSEN_DOC:
                _, host, model, rank, elapsed, *usage = part
                texts.append(canonical_json(Candidate(host, model, rank, "chosen", (), Usage(*usage) if usage else None,
                                                      elapsed).to_doc()))
            else:
                fresh.append((len(texts), part[1]))
                texts.append("")
        needs_text = _needs_text(needs)
        if fresh or context is not None or saga is not None or needs_text is None or not own_route:
            outside: dict[str, Any] = {"context": context, "saga": saga}
            if needs_text is None:  # not the router's numbers and words: scrubbed
                outside["needs"] = needs
            if fresh:
                outside["candidates"] = [doc for _, doc in fresh]
            if not own_route:  # not the route's own: scrubbed like the rest
                outside["route"], outside["chosen"] = route, chosen
            clean = scrub_payload(outside, type_, RESERVED_SAGA)
            assert clean is not None
            context, saga = clean["context"], clean["saga"]
            if needs_text is None:
                needs_text = canonical_json(clean["needs"])
            for (i, _), doc in zip(fresh, clean.get("candidates", ()), strict=True):
                texts[i] = canonical_json(doc)
            if not own_route:
                route, chosen = canonical_json(clean["route"]), clean["chosen"]
        # canonical_json's layout: keys sorted, no spaces (the tests compare the two)
        return (f'{{"attempt":{_value(attempt)},"call":{_value(call)},'
                f'"candidates":[{",".join(texts)}],"chosen":{_value(chosen)},'
                f'"context":{_value(context)},"needs":{needs_text},'
                f'"prompt_sha256":{_value(prompt)},"route":{route},'
                f'"saga":{_value(saga)}}}')


def _needs_text(needs: dict[str, Any]) -> str | None:
    """``canonical_json(needs)`` for what the router measures (two integers, two booleans
    and a cost class); ``None`` for anything else (then scrubbed with the rest)."""
    if needs.keys() != _NEEDS:
        return None
    tokens, ctx, tools, json_mode, cost = (needs["tokens"], needs["context_tokens"], needs["tools"],
                                           needs["json_mode"], needs["max_cost_class"])
    if (tokens.__class__ is not int or ctx.__class__ is not int or tools.__class__ is not bool
            or json_mode.__class__ is not bool or not (cost is None or cost in COST_CLASSES)):
        return None
    return (f'{{"context_tokens":{int.__repr__(ctx)},"json_mode":{"true" if json_mode else "false"},'
            f'"max_cost_class":{"null" if cost is None else encode_basestring(cost)},'
            f'"tokens":{int.__repr__(tokens)},"tools":{"true" if tools else "false"}}}')


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
