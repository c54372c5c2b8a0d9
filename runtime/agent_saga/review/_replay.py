"""Replay a proposed SagaPolicy over the calls a log records: what would have changed.

    report = replay_policies(recorded_calls(reader.records()), current=None, proposed=pset)
    report.stricter, report.looser, report.by_tool["wire.send"]

Every recorded call is evaluated twice, under CURRENT and under PROPOSED, by
``evaluate_call``: the function the gate runs for its SagaPolicy and rule stages, so the
tool classification, undeclared tools, policy-argument paths, rules, tags and
``appliesTo`` are the gate's own. The gate's default rule (an IRREVERSIBLE step needs a
human) is evaluated under both.

What a replay does not see, said once: the limits (``agent-saga limits replay``), the kill
switch and the breaker (they depend on the moment, not on the policy), and rules the
agent's code adds to its gate (they are not in the log, and are the same under both
policies). The inverses a policy names are taken as registered in the agent: whether
its process has the ``@compensator`` is a fact about the agent, not about the policy.

Invariants:
- A call is *stricter* when its verdict rises (ALLOW < REQUIRE_APPROVAL < BLOCK) from
  CURRENT to PROPOSED, *looser* when it falls; a call whose verdict stays is unchanged
  even if the reason changed.
- Every call is counted: evaluated, or ``unevaluable`` with its reason and examples.
- Memory is bounded by the number of tools and reasons (a few example saga ids each),
  never by the number of calls.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..controls.gate._policy import evaluate_call
from ..controls.gate._rules import DEFAULT_RULES, Rule
from ..controls.policy import PolicyInForce, PolicySet
from ._calls import REASONS, RecordedCall, Unevaluable

__all__ = ["RANK", "ReplayReport", "ReplayedCall", "ToolReplay", "policy_set", "replay_calls", "replay_policies"]

VERDICTS = ("ALLOW", "REQUIRE_APPROVAL", "BLOCK")
RANK = {v: i for i, v in enumerate(VERDICTS)}
EXAMPLES = 3


def policy_set(policies: Sequence[PolicyInForce], agent: str) -> PolicySet | None:
    """The policies that govern ``agent``, as the gate of that agent would hold them
    (None: no policy). The inverses they name are taken as registered in the agent."""
    if not policies:
        return None
    return PolicySet(policies, agent=agent, version=1, inverses_elsewhere=True)


@dataclass(frozen=True, slots=True)
class ReplayedCall:
    """One call and its verdict under each policy, with who decided (``policy:<id>``,
    ``rule:<name>``)."""

    call: RecordedCall
    current: str
    proposed: str
    current_by: str
    proposed_by: str

    @property
    def change(self) -> int:
        """> 0 stricter, < 0 looser, 0 unchanged."""
        return RANK[self.proposed] - RANK[self.current]


def replay_calls(calls: Iterable[RecordedCall | Unevaluable], current: PolicySet | None,
                 proposed: PolicySet | None, rules: Sequence[Rule] = DEFAULT_RULES
                 ) -> Iterator[ReplayedCall | Unevaluable]:
    """Each call with its verdict under ``current`` and ``proposed`` (``Unevaluable``
    passed through)."""
    rules = tuple(rules)
    for c in calls:
        if isinstance(c, Unevaluable):
            yield c
            continue
        a = evaluate_call(c.request, current, rules)
        b = evaluate_call(c.request, proposed, rules)
        yield ReplayedCall(c, a.verdict, b.verdict, a.decided_by, b.decided_by)


def _counts() -> dict[str, int]:
    return dict.fromkeys(VERDICTS, 0)


@dataclass
class ToolReplay:
    """One tool's calls: the verdicts under each policy, what changed, examples."""

    calls: int = 0
    current: dict[str, int] = field(default_factory=_counts)
    proposed: dict[str, int] = field(default_factory=_counts)
    stricter: int = 0
    looser: int = 0
    changes: dict[str, int] = field(default_factory=dict)  # "ALLOW -> BLOCK" -> calls
    examples: dict[str, list[dict[str, str]]] = field(default_factory=lambda: {"stricter": [], "looser": []})

    def to_doc(self) -> dict[str, Any]:
        return {"calls": self.calls, "current": dict(self.current), "proposed": dict(self.proposed),
                "stricter": self.stricter, "looser": self.looser, "changes": dict(sorted(self.changes.items())),
                "examples": self.examples}


@dataclass
class ReplayReport:
    """The whole replay (see the module doc); ``to_doc`` is the ``--json`` output."""

    calls: int = 0
    evaluated: int = 0
    stricter: int = 0
    looser: int = 0
    current: dict[str, int] = field(default_factory=_counts)
    proposed: dict[str, int] = field(default_factory=_counts)
    by_tool: dict[str, ToolReplay] = field(default_factory=dict)
    unevaluable: dict[str, dict[str, Any]] = field(default_factory=dict)
    first_ts: int | None = None
    last_ts: int | None = None

    def add(self, item: ReplayedCall | Unevaluable) -> None:
        """Count one call."""
        self.calls += 1
        if isinstance(item, Unevaluable):
            entry = self.unevaluable.setdefault(item.why, {"count": 0, "reason": REASONS[item.why], "examples": []})
            entry["count"] += 1
            if len(entry["examples"]) < EXAMPLES:
                entry["examples"].append({"saga": item.saga, "step": item.step, "tool": item.tool,
                                          "detail": item.detail})
            return
        req = item.call.request
        ts = item.call.ts
        self.first_ts = ts if self.first_ts is None else min(self.first_ts, ts)
        self.last_ts = ts if self.last_ts is None else max(self.last_ts, ts)
        self.evaluated += 1
        tool = self.by_tool.get(req.tool)
        if tool is None:
            tool = self.by_tool[req.tool] = ToolReplay()
        tool.calls += 1
        self.current[item.current] += 1
        self.proposed[item.proposed] += 1
        tool.current[item.current] += 1
        tool.proposed[item.proposed] += 1
        change = item.change
        if change == 0:
            return
        direction = "stricter" if change > 0 else "looser"
        if change > 0:
            self.stricter += 1
            tool.stricter += 1
        else:
            self.looser += 1
            tool.looser += 1
        key = f"{item.current} -> {item.proposed}"
        tool.changes[key] = tool.changes.get(key, 0) + 1
        shown = tool.examples[direction]
        if len(shown) < EXAMPLES:
            # Who asked or refused: the proposed policy's rule for a stricter call, the
            # current one's (the objection that goes away) for a looser one.
            shown.append({"saga": req.saga_id, "step": req.step_id, "current": item.current,
                          "proposed": item.proposed,
                          "decided_by": item.proposed_by if change > 0 else item.current_by})

    @property
    def unevaluated(self) -> int:
        """Calls the log could not replay (counted in ``unevaluable`` by reason)."""
        return self.calls - self.evaluated

    def exit_code(self) -> int:
        """0 nothing changes, 1 stricter only, 3 something looser."""
        return 3 if self.looser else 1 if self.stricter else 0

    def to_doc(self) -> dict[str, Any]:
        return {
            "calls": self.calls, "evaluated": self.evaluated, "unevaluated": self.unevaluated,
            "stricter": self.stricter, "looser": self.looser,
            "unchanged": self.evaluated - self.stricter - self.looser,
            "verdicts": {"current": dict(self.current), "proposed": dict(self.proposed)},
            "by_tool": {t: r.to_doc() for t, r in sorted(self.by_tool.items())},
            "unevaluable": self.unevaluable,
            "first_ts": self.first_ts, "last_ts": self.last_ts,
        }


def replay_policies(calls: Iterable[RecordedCall | Unevaluable], current: PolicySet | None,
                    proposed: PolicySet | None, rules: Sequence[Rule] = DEFAULT_RULES) -> ReplayReport:
    """The report of ``replay_calls`` over ``calls``."""
    report = ReplayReport()
    for item in replay_calls(calls, current, proposed, rules):
        report.add(item)
    return report
