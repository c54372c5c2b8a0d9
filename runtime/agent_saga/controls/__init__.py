"""Pre-flight controls: the gate, spend and rate limits, and the stores behind them.

    PreFlightGate(rules=[...], limits=[...], approval_provider=...)
        order: kill switch -> breaker -> limits -> rules -> approval (see ``gate``)
    BudgetLimit / RateLimit, scoped by global_scope, by_tool, by_arg(...), combine(...)
    InProcessLimitStore (default) / RedisLimitStore(url), chosen with set_limit_store()
    KillSwitch(FileSwitchStore() | RedisSwitchStore(url, grace=...)), set_kill_switch()
    ApprovalGateway(store, notifier, wal, policy=ApprovalPolicy(timeout, levels=...))
    CircuitBreaker(BreakerPolicy(...), wal=...), set_breaker()

Layering: this package imports the engine's protocol types (``agent_saga.gates``), the
WAL interface and the standard library; ``redis`` is imported only inside the Redis
stores when they are used.
"""

from .approval_gateway import ApprovalGateway, ApprovalPolicy, EscalationLevel
from .approval_redis import RedisApprovalStore
from .approval_stores import (
    ApprovalRefused,
    ApprovalRequest,
    ApprovalStore,
    ApprovalStoreUnavailable,
    Decision,
    FileApprovalStore,
    open_approval_store,
)
from .approvals import ApprovalOutcome, ApprovalProvider
from .breaker import (
    BreakerPolicy,
    CircuitBreaker,
    by_service,
    by_tool_name,
    get_breaker,
    set_breaker,
)
from .clocks import ControlClock, ManualClock
from .fleet import fleet_signs
from .gate import CheckRefusal, PreCheck, PreFlightGate
from .killswitch import KillSwitch, get_kill_switch, open_switch_store, set_kill_switch
from .levers import Lever, LeverAction
from .limit_source import LimitSnapshot, LimitSource, RedisLimitSource
from .limits import BudgetLimit, RateLimit
from .notifiers import ApprovalNotice, Notifier, NotifierError, WebhookNotifier
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
from .switch_redis import RedisSwitchStore
from .switch_stores import FileSwitchStore, SwitchStore, SwitchStoreUnavailable, SwitchView
from .verdicts import PreFlightDecision

__all__ = [
    "DEFAULT_RULES",
    "ApprovalGateway",
    "ApprovalNotice",
    "ApprovalOutcome",
    "ApprovalPolicy",
    "ApprovalProvider",
    "ApprovalRefused",
    "ApprovalRequest",
    "ApprovalStore",
    "ApprovalStoreUnavailable",
    "BreakerPolicy",
    "BudgetLimit",
    "CheckRefusal",
    "CircuitBreaker",
    "ControlClock",
    "Decision",
    "EscalationLevel",
    "FileApprovalStore",
    "FileSwitchStore",
    "InProcessLimitStore",
    "KillSwitch",
    "Lever",
    "LeverAction",
    "LimitSnapshot",
    "LimitSource",
    "LimitSpec",
    "LimitStore",
    "LimitStoreUnavailable",
    "LimitUsage",
    "ManualClock",
    "Notifier",
    "NotifierError",
    "PreCheck",
    "PreFlightDecision",
    "PreFlightGate",
    "RateLimit",
    "RedisApprovalStore",
    "RedisLimitSource",
    "RedisLimitStore",
    "RedisSwitchStore",
    "Rule",
    "RuleHit",
    "Scope",
    "SwitchStore",
    "SwitchStoreUnavailable",
    "SwitchView",
    "WebhookNotifier",
    "arg_exceeds",
    "by_arg",
    "by_service",
    "by_tool",
    "by_tool_name",
    "combine",
    "fleet_signs",
    "get_breaker",
    "get_kill_switch",
    "get_limit_store",
    "global_scope",
    "irreversible_requires_human",
    "open_approval_store",
    "open_switch_store",
    "rule",
    "set_breaker",
    "set_kill_switch",
    "set_limit_store",
    "tagged",
    "tool_matches",
]
