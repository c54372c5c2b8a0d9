"""Pre-flight controls: one subpackage per control, each laid out the same way.

    PreFlightGate(rules=[...], limits=[...], approval_provider=..., checks=[...])  gate/
        order: kill switch -> breaker -> limits -> rules -> approval
    BudgetLimit / RateLimit, scoped by global_scope, by_tool, by_arg(...), combine(...)  limits/
    InProcessLimitStore (default) / RedisLimitStore(url), chosen with set_limit_store()
    KillSwitch(FileSwitchStore() | RedisSwitchStore(url, grace=...)), set_kill_switch()  killswitch/
    ApprovalGateway(store, notifier, wal, policy=ApprovalPolicy(timeout, levels=...))  approvals/
    CircuitBreaker(BreakerPolicy(...), wal=...), set_breaker()  breaker/

Every control subpackage has the same inner shape, as far as the control has the part:
``_model`` (the values and documents), ``_store`` (the store protocol and its
``StoreUnavailable`` error), ``_local`` (the one-process store), ``_redis`` (the fleet
store), ``_default`` (the store from a URL and the process-wide default), and the control
itself. Only each subpackage's ``__init__`` is public; modules starting with ``_`` are not.

Shared below the subpackages: ``_checks`` (``PreCheck``, the interface of the kill switch
and the breaker, which the gate consults) and ``_policyplane`` (the one policy-plane
reader: ``RedisSwitchStore`` and ``RedisLimitSource`` are two).

Layering: the control subpackages import each other only through the gate, which
composes them (``gate`` imports ``limits``, ``killswitch``, ``breaker``, ``approvals``;
none of them imports the gate or each other). They import the engine's protocol types
(``agent_saga.gates``), the WAL interface and the standard library; ``redis`` is
imported only inside the Redis stores when they are used (``agent_saga._redis``).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ..clocks import ControlClock, ManualClock

if TYPE_CHECKING:
    from .approvals import (
        ActionChallenge,
        ApprovalGateway,
        ApprovalNotice,
        ApprovalOutcome,
        ApprovalPolicy,
        ApprovalProvider,
        ApprovalRefused,
        ApprovalRequest,
        ApprovalStore,
        ApprovalStoreUnavailable,
        ApproverKeyring,
        Decision,
        EscalationLevel,
        FileApprovalStore,
        Notifier,
        NotifierError,
        PasskeyRefused,
        PasskeyVerifier,
        RedisApprovalStore,
        WebhookNotifier,
        open_approval_store,
    )
    from .breaker import (
        BreakerPolicy,
        CircuitBreaker,
        by_service,
        by_tool_name,
        get_breaker,
        set_breaker,
    )
    from .gate import (
        DEFAULT_RULES,
        CheckRefusal,
        PreCheck,
        PreFlightDecision,
        PreFlightGate,
        Rule,
        RuleHit,
        arg_exceeds,
        irreversible_requires_human,
        rule,
        tagged,
        tool_matches,
    )
    from .killswitch import (
        FileSwitchStore,
        KillSwitch,
        Lever,
        LeverAction,
        RedisSwitchStore,
        SwitchStore,
        SwitchStoreUnavailable,
        SwitchView,
        get_kill_switch,
        open_switch_store,
        set_kill_switch,
    )
    from .limits import (
        BudgetLimit,
        InProcessLimitStore,
        LimitSnapshot,
        LimitSource,
        LimitSpec,
        LimitStore,
        LimitStoreUnavailable,
        LimitUsage,
        RateLimit,
        RedisLimitSource,
        RedisLimitStore,
        Scope,
        by_arg,
        by_tool,
        combine,
        fleet_signs,
        get_limit_store,
        global_scope,
        set_limit_store,
    )

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    ".approvals": (
        "ActionChallenge", "ApprovalGateway", "ApprovalNotice", "ApprovalOutcome",
        "ApprovalPolicy", "ApprovalProvider", "ApprovalRefused", "ApprovalRequest",
        "ApprovalStore", "ApprovalStoreUnavailable", "ApproverKeyring", "Decision",
        "EscalationLevel", "FileApprovalStore", "Notifier", "NotifierError",
        "PasskeyRefused", "PasskeyVerifier", "RedisApprovalStore", "WebhookNotifier",
        "open_approval_store",
    ),
    ".breaker": (
        "BreakerPolicy", "CircuitBreaker", "by_service", "by_tool_name", "get_breaker",
        "set_breaker",
    ),
    ".gate": (
        "DEFAULT_RULES", "CheckRefusal", "PreCheck", "PreFlightDecision", "PreFlightGate",
        "Rule", "RuleHit", "arg_exceeds", "irreversible_requires_human", "rule", "tagged",
        "tool_matches",
    ),
    ".killswitch": (
        "FileSwitchStore", "KillSwitch", "Lever", "LeverAction", "RedisSwitchStore",
        "SwitchStore", "SwitchStoreUnavailable", "SwitchView", "get_kill_switch",
        "open_switch_store", "set_kill_switch",
    ),
    ".limits": (
        "BudgetLimit", "InProcessLimitStore", "LimitSnapshot", "LimitSource", "LimitSpec",
        "LimitStore", "LimitStoreUnavailable", "LimitUsage", "RateLimit",
        "RedisLimitSource", "RedisLimitStore", "Scope", "by_arg", "by_tool", "combine",
        "fleet_signs", "get_limit_store", "global_scope", "set_limit_store",
    ),
}

__all__ = [
    "DEFAULT_RULES",
    "ActionChallenge",
    "ApprovalGateway",
    "ApprovalNotice",
    "ApprovalOutcome",
    "ApprovalPolicy",
    "ApprovalProvider",
    "ApprovalRefused",
    "ApprovalRequest",
    "ApprovalStore",
    "ApprovalStoreUnavailable",
    "ApproverKeyring",
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
    "PasskeyRefused",
    "PasskeyVerifier",
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

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
