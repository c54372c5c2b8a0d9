"""Pre-flight controls: the gate, spend and rate limits, and the stores behind them.

    PreFlightGate(rules=[...], limits=[...], approval_provider=...)
        order: kill switch -> breaker -> limits -> rules -> approval (see ``gate``)
    BudgetLimit / RateLimit, scoped by global_scope, by_tool, by_arg(...), combine(...)
    InProcessLimitStore (default) / RedisLimitStore(url), chosen with set_limit_store()

Layering: this package imports the engine's protocol types (``agent_saga.gates``), the
WAL interface and the standard library; ``redis`` is imported only inside
``RedisLimitStore`` when it is used.
"""

from .approvals import ApprovalOutcome, ApprovalProvider
from .fleet import fleet_signs
from .gate import PreCheck, PreFlightGate
from .limits import BudgetLimit, RateLimit
from .rules import (
    DEFAULT_RULES,
    Rule,
    RuleHit,
    arg_exceeds,
    irreversible_requires_human,
    rule,
    tagged,
    tool_matches,
)
from .scopes import Scope, by_arg, by_tool, combine, global_scope
from .stores import (
    InProcessLimitStore,
    LimitSpec,
    LimitStore,
    LimitStoreUnavailable,
    LimitUsage,
    RedisLimitStore,
    get_limit_store,
    set_limit_store,
)
from .verdicts import PreFlightDecision

__all__ = [
    "DEFAULT_RULES",
    "ApprovalOutcome",
    "ApprovalProvider",
    "BudgetLimit",
    "InProcessLimitStore",
    "LimitSpec",
    "LimitStore",
    "LimitStoreUnavailable",
    "LimitUsage",
    "PreCheck",
    "PreFlightDecision",
    "PreFlightGate",
    "RateLimit",
    "RedisLimitStore",
    "Rule",
    "RuleHit",
    "Scope",
    "arg_exceeds",
    "by_arg",
    "by_tool",
    "combine",
    "fleet_signs",
    "get_limit_store",
    "global_scope",
    "irreversible_requires_human",
    "rule",
    "set_limit_store",
    "tagged",
    "tool_matches",
]
