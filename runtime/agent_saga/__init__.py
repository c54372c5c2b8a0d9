"""agent-saga: the accountable runtime for AI agents that touch real systems.

Every public name is re-exported here; everything else is internal. A test pins this list.
"""

from .chain import VerifyResult, verify_records
from .compensation import Compensation, compensator, get_compensator, registered_compensators
from .controls import (
    DEFAULT_RULES,
    ApprovalOutcome,
    ApprovalProvider,
    BudgetLimit,
    InProcessLimitStore,
    LimitStore,
    LimitStoreUnavailable,
    LimitUsage,
    PreCheck,
    PreFlightDecision,
    PreFlightGate,
    RateLimit,
    RedisLimitStore,
    Rule,
    arg_exceeds,
    by_arg,
    by_tool,
    combine,
    get_limit_store,
    global_scope,
    irreversible_requires_human,
    rule,
    set_limit_store,
    tagged,
    tool_matches,
)
from .context import SagaContextFilter, configure_logging, current_saga_id, current_step_id
from .credentials import assert_no_secrets, resolve_credential, set_credential_resolver
from .engine import Saga
from .errors import (
    CompensationError,
    ConfigurationError,
    GateBlocked,
    HandlerNotRegistered,
    NotSerializable,
    RollbackIncomplete,
    SagaError,
    SagaRefused,
    SecretDetected,
    StepOutcomeUnknown,
    WALBackpressure,
    WALClosed,
    WALCorrupt,
    WALError,
    WALStalled,
)
from .executor import ToolExecutorStats, set_tool_executor_size, tool_executor_stats
from .gates import Gate, GateDecision, StepRequest
from .idempotency import idempotency_key
from .kit import AgentKit
from .records import Record, RecordType
from .retry import Clock, RetryPolicy
from .rollback import RollbackOutcome, RollbackReport, StepOutcome
from .scope import saga_scope
from .semantics import ActionSemantics
from .wal import Backpressure, BaseWAL, FileWAL, WALStats, get_default_wal, set_default_wal

__version__ = "0.1.0"

__all__ = [
    "ActionSemantics",
    "AgentKit",
    "ApprovalOutcome",
    "ApprovalProvider",
    "Backpressure",
    "BaseWAL",
    "BudgetLimit",
    "Clock",
    "Compensation",
    "CompensationError",
    "ConfigurationError",
    "DEFAULT_RULES",
    "FileWAL",
    "Gate",
    "GateBlocked",
    "GateDecision",
    "HandlerNotRegistered",
    "InProcessLimitStore",
    "LimitStore",
    "LimitStoreUnavailable",
    "LimitUsage",
    "NotSerializable",
    "PreCheck",
    "PreFlightDecision",
    "PreFlightGate",
    "RateLimit",
    "Record",
    "RecordType",
    "RedisLimitStore",
    "RetryPolicy",
    "RollbackIncomplete",
    "RollbackOutcome",
    "RollbackReport",
    "Rule",
    "Saga",
    "SagaContextFilter",
    "SagaError",
    "SagaRefused",
    "SecretDetected",
    "StepOutcome",
    "StepOutcomeUnknown",
    "StepRequest",
    "ToolExecutorStats",
    "VerifyResult",
    "WALBackpressure",
    "WALClosed",
    "WALCorrupt",
    "WALError",
    "WALStalled",
    "WALStats",
    "arg_exceeds",
    "assert_no_secrets",
    "by_arg",
    "by_tool",
    "combine",
    "compensator",
    "configure_logging",
    "current_saga_id",
    "current_step_id",
    "get_compensator",
    "get_default_wal",
    "get_limit_store",
    "global_scope",
    "idempotency_key",
    "irreversible_requires_human",
    "registered_compensators",
    "resolve_credential",
    "rule",
    "saga_scope",
    "set_credential_resolver",
    "set_default_wal",
    "set_limit_store",
    "set_tool_executor_size",
    "tagged",
    "tool_executor_stats",
    "tool_matches",
    "verify_records",
]
