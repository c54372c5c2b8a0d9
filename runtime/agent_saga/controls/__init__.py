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

if TYPE_CHECKING:
    from ..clocks import ControlClock as ControlClock
    from ..clocks import ManualClock as ManualClock
    from .approvals import ActionChallenge as ActionChallenge
    from .approvals import ApprovalGateway as ApprovalGateway
    from .approvals import ApprovalNotice as ApprovalNotice
    from .approvals import ApprovalOutcome as ApprovalOutcome
    from .approvals import ApprovalPolicy as ApprovalPolicy
    from .approvals import ApprovalProvider as ApprovalProvider
    from .approvals import ApprovalRefused as ApprovalRefused
    from .approvals import ApprovalRequest as ApprovalRequest
    from .approvals import ApprovalStore as ApprovalStore
    from .approvals import ApprovalStoreUnavailable as ApprovalStoreUnavailable
    from .approvals import ApproverKeyring as ApproverKeyring
    from .approvals import Decision as Decision
    from .approvals import EscalationLevel as EscalationLevel
    from .approvals import FileApprovalStore as FileApprovalStore
    from .approvals import Notifier as Notifier
    from .approvals import NotifierError as NotifierError
    from .approvals import PasskeyRefused as PasskeyRefused
    from .approvals import PasskeyVerifier as PasskeyVerifier
    from .approvals import RedisApprovalStore as RedisApprovalStore
    from .approvals import WebhookNotifier as WebhookNotifier
    from .approvals import open_approval_store as open_approval_store
    from .breaker import BreakerPolicy as BreakerPolicy
    from .breaker import CircuitBreaker as CircuitBreaker
    from .breaker import by_service as by_service
    from .breaker import by_tool_name as by_tool_name
    from .breaker import get_breaker as get_breaker
    from .breaker import set_breaker as set_breaker
    from .gate import DEFAULT_RULES as DEFAULT_RULES
    from .gate import CheckRefusal as CheckRefusal
    from .gate import PreCheck as PreCheck
    from .gate import PreFlightDecision as PreFlightDecision
    from .gate import PreFlightGate as PreFlightGate
    from .gate import Rule as Rule
    from .gate import RuleHit as RuleHit
    from .gate import arg_exceeds as arg_exceeds
    from .gate import irreversible_requires_human as irreversible_requires_human
    from .gate import rule as rule
    from .gate import tagged as tagged
    from .gate import tool_matches as tool_matches
    from .killswitch import FileSwitchStore as FileSwitchStore
    from .killswitch import KillSwitch as KillSwitch
    from .killswitch import Lever as Lever
    from .killswitch import LeverAction as LeverAction
    from .killswitch import RedisSwitchStore as RedisSwitchStore
    from .killswitch import SwitchStore as SwitchStore
    from .killswitch import SwitchStoreUnavailable as SwitchStoreUnavailable
    from .killswitch import SwitchView as SwitchView
    from .killswitch import get_kill_switch as get_kill_switch
    from .killswitch import open_switch_store as open_switch_store
    from .killswitch import set_kill_switch as set_kill_switch
    from .limits import BudgetLimit as BudgetLimit
    from .limits import InProcessLimitStore as InProcessLimitStore
    from .limits import LimitSnapshot as LimitSnapshot
    from .limits import LimitSource as LimitSource
    from .limits import LimitSpec as LimitSpec
    from .limits import LimitStore as LimitStore
    from .limits import LimitStoreUnavailable as LimitStoreUnavailable
    from .limits import LimitUsage as LimitUsage
    from .limits import RateLimit as RateLimit
    from .limits import RedisLimitSource as RedisLimitSource
    from .limits import RedisLimitStore as RedisLimitStore
    from .limits import Scope as Scope
    from .limits import by_arg as by_arg
    from .limits import by_tool as by_tool
    from .limits import combine as combine
    from .limits import fleet_signs as fleet_signs
    from .limits import get_limit_store as get_limit_store
    from .limits import global_scope as global_scope
    from .limits import set_limit_store as set_limit_store

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
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
    "..clocks": ("ControlClock", "ManualClock"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
