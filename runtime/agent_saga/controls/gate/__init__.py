"""The pre-flight gate: the one decision before any side effect, where refusal is free.

    gate = PreFlightGate(rules=[arg_exceeds("amount", 10_000)], limits=[BudgetLimit(...)],
                         approval_provider=ApprovalGateway(...), checks=[kill_switch, breaker])

Order: kill switch -> breaker -> SagaPolicy -> limits -> rules -> approval; the first
control that refuses ends it (see ``_gate`` for the invariants). The gate composes the
other controls (``agent_saga.controls.limits``, ``.killswitch``, ``.breaker``,
``.approvals``, ``.policy``); none of them imports the gate.

    _gate.py         PreFlightGate: the stages, the engine's hooks, status
    _policy.py       the SagaPolicy stage: the policies' rules and inverse as the gate's
    _nogate.py       the gate of a saga opened without one (the process's kill switch)
    _reservation.py  Reservation: the debit made for one call, handed back on a refusal
    _rules.py        per-call rules (arg_exceeds, tool_matches, tagged, rule(...))
    _verdicts.py     PreFlightDecision: the verdict with its audit detail
    (``PreCheck`` / ``CheckRefusal`` live in ``agent_saga.controls._checks``, below the
    kill switch and the breaker that implement them; they are re-exported here.)

Only this module is public.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports
from . import _nogate  # noqa: F401 - registers the no-gate fallback (the kill switch), always

if TYPE_CHECKING:
    from .._checks import CheckRefusal as CheckRefusal
    from .._checks import PreCheck as PreCheck
    from ._gate import PreFlightGate as PreFlightGate
    from ._rules import DEFAULT_RULES as DEFAULT_RULES
    from ._rules import Rule as Rule
    from ._rules import RuleHit as RuleHit
    from ._rules import RuleUnreadable as RuleUnreadable
    from ._rules import arg_exceeds as arg_exceeds
    from ._rules import irreversible_requires_human as irreversible_requires_human
    from ._rules import rule as rule
    from ._rules import tagged as tagged
    from ._rules import tool_matches as tool_matches
    from ._verdicts import STAGES as STAGES
    from ._verdicts import PreFlightDecision as PreFlightDecision
    from ._verdicts import Stage as Stage
    from ._verdicts import write_verdict as write_verdict

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._gate": ("PreFlightGate",),
    "._rules": (
        "DEFAULT_RULES", "Rule", "RuleHit", "RuleUnreadable", "arg_exceeds",
        "irreversible_requires_human", "rule", "tagged", "tool_matches",
    ),
    "._verdicts": ("STAGES", "PreFlightDecision", "Stage", "write_verdict"),
    ".._checks": ("CheckRefusal", "PreCheck"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
