"""A route: the hosts a router may use, the order it prefers them in, and the constraints.

    route = Route([local, api], preference=["local-7b", "frontier"],
                  constraints=Constraints(max_cost_class="Medium"))
    route = Route.from_document(doc)   # a ModelRoute as the operator projects it

``Constraints`` are what every call on the route requires; a call may add its own
(``Router.complete(request, constraints=...)``): the stricter of the two applies.

Invariants:
- Host names are unique and every preference entry names a host; hosts the preference
  does not name follow it in declared order (as the operator projects them).
- A route read from the policy plane carries its ``id`` (``namespace/name``), ``uid`` and
  ``generation``: the decision records name the exact ModelRoute generation that decided.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from json.encoder import encode_basestring
from typing import Any

from ..chain import RESERVED_SAGA
from ..errors import ConfigurationError
from ..records import ExtensionType
from ..scrubber import scrub_payload
from ..wal.prepared import screened_text
from ._decision import Candidate
from ._hosts import COST_CLASSES, Capabilities, CostClass, Host, OpenAIHost

__all__ = ["Constraints", "Route"]

#: One host as a call's size is compared with its window: (context tokens, index (rank -
#: 1), host, the reasons it is refused whatever the call's size, and the record text that
#: follows a context-window reason in its refusal: those reasons and the end,
#: ``,"...","..."]}``).
ContextRow = tuple[int, int, Host, tuple[str, ...], str]
_RECORD = ExtensionType.ROUTING_DECISION.value  # the record type the route's texts are for (a scrubber warning names it)
_MEMO = 64  # call shapes remembered per route (a shape is a handful of booleans and constraints)


class Screen:
    """A route screened once for one shape of call (``Route.screen``): everything about
    the verdicts that does not depend on the call's size.

    ``verdicts`` / ``parts``: per host (by rank - 1), its refusal for the shape (every
    capability or constraint it misses) and that refusal's record text (scrubbed once),
    ``None`` for a host the shape does not refuse; a call copies both lists. ``by_context``:
    every host by context window, smallest first (``ContextRow``): a call refuses those
    smaller than its size and stops at the first that is not. ``eligible``: (index, host)
    of the hosts the shape does not refuse, in preference order: the hosts a call tries.
    """

    __slots__ = ("by_context", "eligible", "parts", "verdicts")

    def __init__(self, verdicts: list[Candidate | None], parts: list[str | None],
                 by_context: tuple[ContextRow, ...], eligible: tuple[tuple[int, Host], ...]) -> None:
        self.verdicts, self.parts, self.by_context, self.eligible = verdicts, parts, by_context, eligible


@dataclass(frozen=True, slots=True)
class Constraints:
    """What a call requires of a host (``None`` / ``False``: no requirement)."""

    min_context_tokens: int | None = None
    require_tools: bool = False
    require_json_mode: bool = False
    max_cost_class: CostClass | None = None

    def __post_init__(self) -> None:
        if self.max_cost_class is not None and self.max_cost_class not in COST_CLASSES:
            raise ConfigurationError(f"Constraints max_cost_class must be one of {', '.join(COST_CLASSES)} or "
                                     f"None, got {self.max_cost_class!r}")
        if self.min_context_tokens is not None and (isinstance(self.min_context_tokens, bool)
                                                    or not isinstance(self.min_context_tokens, int)
                                                    or self.min_context_tokens < 1):
            raise ConfigurationError(f"Constraints min_context_tokens must be a positive integer or None, got "
                                     f"{self.min_context_tokens!r}")

    def merged(self, other: Constraints | None) -> Constraints:
        """The stricter of ``self`` and ``other`` on every field."""
        if other is None or other == self:
            return self
        mins = [v for v in (self.min_context_tokens, other.min_context_tokens) if v is not None]
        costs = [v for v in (self.max_cost_class, other.max_cost_class) if v is not None]
        return Constraints(max(mins) if mins else None, self.require_tools or other.require_tools,
                           self.require_json_mode or other.require_json_mode,
                           min(costs, key=COST_CLASSES.index) if costs else None)

    def to_doc(self) -> dict[str, Any]:
        """The constraints as JSON (ModelRoute's field names; unset ones left out)."""
        doc: dict[str, Any] = {}
        if self.min_context_tokens is not None:
            doc["minContextTokens"] = self.min_context_tokens
        if self.require_tools:
            doc["requireTools"] = True
        if self.require_json_mode:
            doc["requireJsonMode"] = True
        if self.max_cost_class is not None:
            doc["maxCostClass"] = self.max_cost_class
        return doc

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any] | None) -> Constraints:
        """From ModelRoute's ``constraints`` (camelCase); raises ``ConfigurationError``."""
        doc = doc or {}
        return cls(doc.get("minContextTokens"), bool(doc.get("requireTools")), bool(doc.get("requireJsonMode")),
                   doc.get("maxCostClass"))


class Route:
    """Hosts in preference order, and the constraints every call on them must meet."""

    __slots__ = ("_screens", "_texts", "_untried", "applies_to", "chosen_mids", "constraints", "generation",
                 "host_names", "hosts", "id", "record_doc", "record_text", "refusal_heads", "rows", "screened", "uid")

    def __init__(self, hosts: Sequence[Host], *, preference: Sequence[str] | None = None,
                 constraints: Constraints | None = None, id: str | None = None, uid: str = "",
                 generation: int = 0, applies_to: Sequence[str] | None = None) -> None:
        hosts = list(hosts)
        if not hosts:
            raise ConfigurationError("a Route needs at least one host")
        by_name: dict[str, Host] = {}
        for h in hosts:
            if not isinstance(h, Host):
                raise ConfigurationError(f"a Route's hosts must be Host objects (OpenAIHost, CallableHost), got {h!r}")
            if h.name in by_name:
                raise ConfigurationError(f"a Route's host names must be unique: {h.name!r} appears twice")
            by_name[h.name] = h
        order = list(preference or ())
        for p in order:
            if p not in by_name:
                raise ConfigurationError(f"preference names {p!r}, which is not a host of this route "
                                         f"(hosts: {', '.join(by_name)}): add that host, or remove it from preference")
        if len(set(order)) != len(order):
            raise ConfigurationError(f"preference names a host twice: {order}")
        order += [h.name for h in hosts if h.name not in order]
        #: The hosts, most preferred first.
        self.hosts: tuple[Host, ...] = tuple(by_name[n] for n in order)
        #: (rank, host, context tokens, tools, json mode, cost index): what screening reads.
        self.rows: tuple[tuple[int, Host, int, bool, bool, int], ...] = tuple(
            (i, h, h.capabilities.context_tokens, h.capabilities.tools, h.capabilities.json_mode,
             COST_CLASSES.index(h.capabilities.cost_class)) for i, h in enumerate(self.hosts, 1))
        self.constraints = constraints or Constraints()
        self.id = id
        self.uid = uid
        self.generation = generation
        self.applies_to = None if applies_to is None else tuple(applies_to)
        self._screens: dict[tuple[str | None, bool, bool, bool, bool], Screen] = {}
        #: chosen host -> per host (by rank - 1): its verdict when left untried, and its text
        self._untried: dict[str, tuple[tuple[Candidate, str], ...]] = {}
        #: id(candidate) -> its record text (canonical JSON, scrubbed once), for the
        #: candidates the two memos hold (cleared with them, so an id is never that of
        #: another object).
        self._texts: dict[int, str] = {}
        #: Which route this is, as record text (scrubbed once).
        self.record_doc = self.to_doc()
        self.record_text = screened_text(self.record_doc, _RECORD, RESERVED_SAGA)
        #: True when no host name, model or route id holds anything the scrubber would
        #: touch: then what the router builds from them alone needs no scrubbing per call.
        names = {"hosts": [{"host": h.name, "model": h.model} for h in self.hosts], "route": self.to_doc()}
        self.screened = scrub_payload(names, _RECORD, RESERVED_SAGA) is names
        #: Per host (by rank - 1): the record text of its refusal up to its reasons,
        #: ``{"host":...,"reasons":[`` (a refusal that names the call's size is this, its
        #: reasons and ``]}``).
        self.refusal_heads: tuple[str, ...] = tuple(
            screened_text(Candidate(h.name, h.model, i, "refused").to_doc(), _RECORD, RESERVED_SAGA)[:-2]
            for i, h in enumerate(self.hosts, 1))
        #: Per host (by rank - 1): the record text of its choice between its elapsed time
        #: and its usage, ``"host":...,"reasons":[]`` (a chosen candidate is
        #: ``{"elapsed_ms":E,`` this ``,"usage":{...}}``).
        self.chosen_mids: tuple[str, ...] = tuple(
            screened_text(Candidate(h.name, h.model, i, "chosen").to_doc(), _RECORD, RESERVED_SAGA)[1:-1]
            for i, h in enumerate(self.hosts, 1))
        self.host_names = frozenset(by_name)

    def screen(self, c: Constraints, tools: bool, json_mode: bool, call_tools: bool, call_json: bool) -> Screen:
        """The route screened for a call of this shape, all but its size: tool calling,
        JSON mode, cost class (``c``: the merged constraints; ``tools`` / ``json_mode``:
        what the call needs; ``call_*``: whether the call itself asks for it, which the
        reason says). Built once per shape and kept with the route, so a call only
        compares its size with the context windows smaller than it."""
        key = (c.max_cost_class, tools, json_mode, call_tools, call_json)  # all a screen depends on
        screen = self._screens.get(key)
        if screen is None:
            if len(self._screens) >= _MEMO:
                self._forget()
            # setdefault: of two threads building the same screen, the first one kept is
            # the one every call uses and the only one whose texts are registered by id
            screen = self._screens.setdefault(key, self._build_screen(c, tools, json_mode, call_tools, call_json))
            for refusal, text in zip(screen.verdicts, screen.parts, strict=True):
                if refusal is not None and text is not None:
                    self._texts[id(refusal)] = text
        return screen

    def _build_screen(self, c: Constraints, tools: bool, json_mode: bool, call_tools: bool,
                      call_json: bool) -> Screen:
        max_cost = COST_CLASSES.index(c.max_cost_class) if c.max_cost_class else len(COST_CLASSES)
        verdicts: list[Candidate | None] = []
        parts: list[str | None] = []
        by_context: list[ContextRow] = []
        eligible: list[tuple[int, Host]] = []
        for rank, h, ctx, has_tools, has_json, cost in self.rows:
            why: list[str] = []
            if tools and not has_tools:
                why.append("no tool calling, and " + ("the call offers tools" if call_tools
                                                      else "the route requires tools"))
            if json_mode and not has_json:
                why.append("no JSON mode, and " + ("the call asks for JSON" if call_json
                                                   else "the route requires JSON mode"))
            if cost > max_cost:
                why.append(f"cost class {COST_CLASSES[cost]} is above the {c.max_cost_class} allowed")
            static = tuple(why)
            refusal = Candidate(h.name, h.model, rank, "refused", static) if static else None
            verdicts.append(refusal)
            parts.append(None if refusal is None else screened_text(refusal.to_doc(), _RECORD, RESERVED_SAGA))
            by_context.append((ctx, rank - 1, h, static, "".join(["," + encode_basestring(r) for r in static]) + "]}"))
            if refusal is None:
                eligible.append((rank - 1, h))
        by_context.sort(key=lambda row: (row[0], row[1]))
        return Screen(verdicts, parts, tuple(by_context), tuple(eligible))

    def untried_row(self, chosen: str) -> tuple[tuple[Candidate, str], ...]:
        """Per host (by rank - 1): the verdict on it when it is eligible and left untried
        because ``chosen`` (a host of this route) answered first, and its record text
        (scrubbed once)."""
        row = self._untried.get(chosen)
        if row is None:
            entries = []
            for rank, host in enumerate(self.hosts, 1):
                c = Candidate(host.name, host.model, rank, "untried", (f"eligible; {chosen} answered first",))
                entries.append((c, screened_text(c.to_doc(), _RECORD, RESERVED_SAGA)))
            row = self._untried.setdefault(chosen, tuple(entries))  # the first one kept (see ``screen``)
            for c, text in row:
                self._texts[id(c)] = text
        return row

    def candidate_texts(self) -> Mapping[int, str]:
        """The record texts (canonical JSON, scrubbed once) of the verdicts this route
        keeps, by ``id``: a decision record reuses them instead of encoding and scrubbing
        the same verdict for every call."""
        return self._texts

    def _forget(self) -> None:
        self._screens.clear()
        self._untried.clear()
        self._texts.clear()

    def describe(self) -> str:
        """``ModelRoute ns/name (generation g)`` or ``route`` for one built in code."""
        return f"ModelRoute {self.id} (generation {self.generation})" if self.id else "route (in code)"

    def to_doc(self) -> dict[str, Any]:
        """Which route this is (for decision records)."""
        return {"id": self.id, "uid": self.uid or None, "generation": self.generation}

    @classmethod
    def from_document(cls, doc: Mapping[str, Any], *, timeout: float = 60.0, stream: bool = False,
                      stall_timeout: float = 10.0) -> Route:
        """A route from a ModelRoute document of the policy plane (every host an
        ``OpenAIHost``). Raises ``ConfigurationError`` naming what cannot be read."""
        rid = str(doc.get("id") or "")
        try:
            hosts = []
            for h in doc.get("hosts") or ():
                caps = h.get("capabilities") or {}
                hosts.append(OpenAIHost(
                    str(h["name"]), str(h["endpoint"]), str(h["model"]),
                    Capabilities(int(caps["contextTokens"]), bool(caps.get("tools")), bool(caps.get("jsonMode")),
                                 caps.get("costClass") or "Medium"),
                    credential_ref=h.get("credentialRef"), timeout=timeout, stream=stream,
                    stall_timeout=stall_timeout))
            applies = doc.get("appliesTo")
            return cls(hosts, preference=doc.get("preference"), constraints=Constraints.from_doc(doc.get("constraints")),
                       id=rid or None, uid=str(doc.get("uid") or ""), generation=int(doc.get("generation") or 0),
                       applies_to=None if not applies else list(applies.get("agents") or ()))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ConfigurationError(f"ModelRoute {rid or '?'} cannot be read: {type(exc).__name__}: {exc}") from None
