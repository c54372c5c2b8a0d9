"""The tool surface an agent was seen calling, and the SagaPolicy skeleton written from it.

Observe mode is the ramp: a policy in ``mode: Observe`` refuses nothing and records, per
agent, every tool called through the gate (name, the semantics the code declares, the
policy argument names, and — from the MCP proxy — the tool's input schema) into the
policy plane (docs/policy-plane.md, "Tool surface"). ``agent-saga policy skeleton`` turns
that record into a SagaPolicy manifest in which **every tool is IRREVERSIBLE with a TODO**:
a generator that guessed COMPENSABLE and invented an inverse would assert that a real
operation is undoable on the evidence of its name. What a tool's name or annotations
(``readOnlyHint``, ``destructiveHint``) suggest is a comment beside it (``_hints``): a
candidate for the reviewer to verify, never the declaration. Reviewers downgrade what is
safe; the file never upgrades itself — the generator refuses to overwrite a file, so a
reviewed policy is never replaced by a fresh skeleton.

Invariants:
- A surface entry is plain JSON ``{"v": 1, "tool", "semantics", "policyArgs", "inputSchema",
  "firstSeen", "lastSeen", "calls", "source"}``; entries of an unknown ``v`` are skipped.
- ``skeleton_yaml`` is a pure function of its inputs (tools sorted by name) and its output
  parses as a valid SagaPolicy (``load_policy_text``) with every tool IRREVERSIBLE.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ._hints import hints
from ._model import TOOL_NAME

__all__ = ["SurfaceEntry", "merge_surface", "skeleton_yaml", "surface_entry_doc"]

SURFACE_VERSION = 1
_NAME = re.compile(r"[^a-z0-9-]+")


@dataclass(frozen=True, slots=True)
class SurfaceEntry:
    """One tool as agents were seen calling it (``semantics``: what the code declares,
    None when unknown, e.g. through the MCP proxy)."""

    tool: str
    semantics: str | None = None
    policy_args: tuple[str, ...] = ()
    input_schema: Mapping[str, Any] | None = None
    first_seen: float = 0.0
    last_seen: float = 0.0
    calls: int = 0
    agents: tuple[str, ...] = field(default=())
    annotations: Mapping[str, Any] | None = None  # the MCP tool's annotations (readOnlyHint, ...), if known

    @classmethod
    def from_doc(cls, doc: Mapping[str, Any], agent: str = "") -> SurfaceEntry:
        """Raises ``ValueError`` on a document that is not a v1 surface entry."""
        if doc.get("v") != SURFACE_VERSION or not isinstance(doc.get("tool"), str):
            raise ValueError(f"not a v{SURFACE_VERSION} tool surface entry: {dict(doc)!r:.200}")
        schema = doc.get("inputSchema")
        return cls(
            tool=doc["tool"],
            semantics=doc.get("semantics") if isinstance(doc.get("semantics"), str) else None,
            policy_args=tuple(str(a) for a in doc.get("policyArgs") or ()),
            input_schema=schema if isinstance(schema, Mapping) else None,
            first_seen=float(doc.get("firstSeen") or 0.0),
            last_seen=float(doc.get("lastSeen") or 0.0),
            calls=int(doc.get("calls") or 0),
            agents=(agent,) if agent else (),
        )


def surface_entry_doc(tool: str, *, semantics: str | None, policy_args: Iterable[str], now: float,
                      input_schema: Mapping[str, Any] | None = None, source: str = "runtime",
                      first_seen: float | None = None, calls: int = 1) -> dict[str, Any]:
    """The JSON an agent stores for one tool it called (see the module doc)."""
    return {"v": SURFACE_VERSION, "tool": tool, "semantics": semantics, "policyArgs": sorted(policy_args),
            "inputSchema": dict(input_schema) if input_schema is not None else None,
            "firstSeen": now if first_seen is None else first_seen, "lastSeen": now, "calls": calls,
            "source": source}


def merge_surface(entries: Iterable[SurfaceEntry]) -> list[SurfaceEntry]:
    """One entry per tool across agents (calls summed, names and agents united), sorted."""
    by: dict[str, SurfaceEntry] = {}
    for e in entries:
        cur = by.get(e.tool)
        if cur is None:
            by[e.tool] = e
            continue
        by[e.tool] = SurfaceEntry(
            e.tool,
            cur.semantics if cur.semantics == e.semantics else _stricter(cur.semantics, e.semantics),
            tuple(sorted(set(cur.policy_args) | set(e.policy_args))),
            cur.input_schema or e.input_schema,
            min(cur.first_seen, e.first_seen), max(cur.last_seen, e.last_seen), cur.calls + e.calls,
            tuple(sorted(set(cur.agents) | set(e.agents))), cur.annotations or e.annotations,
        )
    return [by[t] for t in sorted(by)]


def _stricter(a: str | None, b: str | None) -> str | None:
    order = {"REVERSIBLE": 0, "COMPENSABLE": 1, "IRREVERSIBLE": 2}
    known = [s for s in (a, b) if s in order]
    return max(known, key=order.__getitem__) if known else None


def resource_name(text: str) -> str:
    """A valid resource name from ``text`` (``payments-agent``)."""
    name = _NAME.sub("-", text.lower()).strip("-")[:63].strip("-")
    return name or "saga-policy"


def skeleton_yaml(entries: Iterable[SurfaceEntry], *, name: str, namespace: str, agents: Iterable[str] = (),
                  generated_at: str = "", source: str = "") -> str:
    """A SagaPolicy manifest declaring every tool IRREVERSIBLE, each with a TODO (and,
    as comments, the candidates its name or annotations suggest)."""
    tools = merge_surface(entries)
    q = json.dumps
    agents = sorted(set(agents))
    out = [
        f"# SagaPolicy skeleton written by `agent-saga policy skeleton`{' from ' + source if source else ''}"
        f"{' at ' + generated_at if generated_at else ''}.",
        "# Every tool below is IRREVERSIBLE: each call needs a named human until a reviewer",
        "# classifies it. Downgrade only what you know: REVERSIBLE (restored exactly, nobody can",
        "# tell) or COMPENSABLE with its inverse: compensate: {tool: ..., callArgs: {name: $.path into",
        "# the call}, values: {name: constant}, args: {name: $.path into the result}}. A \"candidate\"",
        "# comment is what a tool's name or annotations suggest: verify it before you use it. Nothing",
        "# here is declared on a guess, and this file is never rewritten by the generator.",
        "apiVersion: agentsaga.dev/v1alpha1",
        "kind: SagaPolicy",
        "metadata:",
        f"  name: {resource_name(name)}",
        f"  namespace: {q(namespace)}",
        "spec:",
        "  mode: Enforce",
        "  undeclaredTools: Refuse",
    ]
    if agents:
        out += ["  appliesTo:", "    agents: [" + ", ".join(q(a) for a in agents) + "]"]
    if not tools:
        out += ["  tools: {}   # TODO: no tool calls were recorded; run the agents in Observe mode first"]
        return "\n".join(out) + "\n"
    out.append("  tools:")
    schemas = {t.tool: t.input_schema for t in tools}
    for t in tools:
        if not TOOL_NAME.match(t.tool) or len(t.tool) > 253:
            out.append(f"    # skipped {q(t.tool)}: not a valid tool name for a policy")
            continue
        seen = f"seen {t.calls} call(s)" + (f" by {', '.join(t.agents)}" if t.agents else "")
        code = f"; the code declares {t.semantics}" if t.semantics else ""
        out.append(f"    {q(t.tool)}:")
        out.append(f"      semantics: IRREVERSIBLE  # TODO: review ({seen}{code})")
        if t.policy_args:
            out.append(f"      # policy arguments seen: {', '.join(t.policy_args)}")
        if t.input_schema is not None:
            schema = json.dumps(t.input_schema, sort_keys=True, separators=(",", ":"))
            out.append(f"      # input schema: {schema[:400]}{'…' if len(schema) > 400 else ''}")
        out += [f"      # {line}" for line in hints(t.tool, t.input_schema, t.annotations, schemas)]
    return "\n".join(out) + "\n"
