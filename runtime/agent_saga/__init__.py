"""agent-saga: the accountable runtime for AI agents that touch real systems.

Every public name is re-exported here; everything else is internal. A test pins this list.
Each name is loaded from its module when first used (``agent_saga.Saga``, or
``from agent_saga import Saga``), so ``import agent_saga`` costs little and a process pays
only for the parts it uses: a CLI command does not load the router, the audit bundles or
the codemod. ``_SOURCES`` lists each name once: it is what runs, and ``__all__`` derives
from it. The imports under ``TYPE_CHECKING`` (explicit re-exports) are what type checkers
read; a test holds the two equal.
"""

from typing import TYPE_CHECKING

from ._lazy import lazy_exports

# Nothing here runs for its side effects. The process-wide wiring happens where it is
# needed: a saga opened without a gate still meets the process's kill switch
# (``agent_saga.gates`` imports the controls' fallback on the first such saga), an agent
# configured by its environment is wired when a control or scope is first built
# (``agent_saga.controls._wiring`` imports the plane), and a recovery process resolves
# the codemod's own compensations (``agent_saga.compensation`` imports them on the
# first lookup).

if TYPE_CHECKING:
    from .audit import AESGCMEncryptor as AESGCMEncryptor
    from .audit import AuditRoot as AuditRoot
    from .audit import Certificate as Certificate
    from .audit import Checkpoint as Checkpoint
    from .audit import EncryptedWAL as EncryptedWAL
    from .audit import Keyring as Keyring
    from .audit import PayloadEncryptor as PayloadEncryptor
    from .audit import audit_root as audit_root
    from .audit import build_consistency as build_consistency
    from .audit import build_disclosure as build_disclosure
    from .audit import certify as certify
    from .audit import certify_log as certify_log
    from .audit import decrypting as decrypting
    from .audit import encryptor_from_env as encryptor_from_env
    from .audit import export_bundle as export_bundle
    from .audit import make_checkpoint as make_checkpoint
    from .audit import redact_record as redact_record
    from .audit import redact_records as redact_records
    from .audit import verify_bundle as verify_bundle
    from .audit import verify_checkpoint as verify_checkpoint
    from .audit import verify_consistency as verify_consistency
    from .audit import verify_disclosure as verify_disclosure
    from .chain import VerifyResult as VerifyResult
    from .chain import verify_records as verify_records
    from .clocks import Clock as Clock
    from .codemod import Codemod as Codemod
    from .codemod import CodemodError as CodemodError
    from .codemod import CodemodRefused as CodemodRefused
    from .codemod import CodemodResult as CodemodResult
    from .codemod import VerifyFailed as VerifyFailed
    from .compensation import Compensation as Compensation
    from .compensation import compensator as compensator
    from .compensation import get_compensator as get_compensator
    from .compensation import registered_compensators as registered_compensators
    from .context import SagaContextFilter as SagaContextFilter
    from .context import configure_logging as configure_logging
    from .context import current_saga_id as current_saga_id
    from .context import current_step_id as current_step_id
    from .contextbroker import ContextBroker as ContextBroker
    from .contextbroker import DriftedSource as DriftedSource
    from .contextbroker import Receipt as Receipt
    from .contextbroker import ServedContext as ServedContext
    from .contextbroker import Tier as Tier
    from .controls import DEFAULT_RULES as DEFAULT_RULES
    from .controls import ApprovalGateway as ApprovalGateway
    from .controls import ApprovalNotice as ApprovalNotice
    from .controls import ApprovalOutcome as ApprovalOutcome
    from .controls import ApprovalPolicy as ApprovalPolicy
    from .controls import ApprovalProvider as ApprovalProvider
    from .controls import ApprovalRefused as ApprovalRefused
    from .controls import ApprovalStoreUnavailable as ApprovalStoreUnavailable
    from .controls import BreakerPolicy as BreakerPolicy
    from .controls import BudgetLimit as BudgetLimit
    from .controls import CheckRefusal as CheckRefusal
    from .controls import CircuitBreaker as CircuitBreaker
    from .controls import EscalationLevel as EscalationLevel
    from .controls import FileApprovalStore as FileApprovalStore
    from .controls import FileSwitchStore as FileSwitchStore
    from .controls import InProcessLimitStore as InProcessLimitStore
    from .controls import KillSwitch as KillSwitch
    from .controls import Lever as Lever
    from .controls import LeverAction as LeverAction
    from .controls import LimitStore as LimitStore
    from .controls import LimitStoreUnavailable as LimitStoreUnavailable
    from .controls import LimitUsage as LimitUsage
    from .controls import ManualClock as ManualClock
    from .controls import Notifier as Notifier
    from .controls import NotifierError as NotifierError
    from .controls import PreCheck as PreCheck
    from .controls import PreFlightDecision as PreFlightDecision
    from .controls import PreFlightGate as PreFlightGate
    from .controls import RateLimit as RateLimit
    from .controls import RedisApprovalStore as RedisApprovalStore
    from .controls import RedisLimitSource as RedisLimitSource
    from .controls import RedisLimitStore as RedisLimitStore
    from .controls import RedisSwitchStore as RedisSwitchStore
    from .controls import Rule as Rule
    from .controls import SwitchStoreUnavailable as SwitchStoreUnavailable
    from .controls import WebhookNotifier as WebhookNotifier
    from .controls import arg_exceeds as arg_exceeds
    from .controls import by_arg as by_arg
    from .controls import by_tool as by_tool
    from .controls import combine as combine
    from .controls import get_breaker as get_breaker
    from .controls import get_kill_switch as get_kill_switch
    from .controls import get_limit_store as get_limit_store
    from .controls import global_scope as global_scope
    from .controls import irreversible_requires_human as irreversible_requires_human
    from .controls import rule as rule
    from .controls import set_breaker as set_breaker
    from .controls import set_kill_switch as set_kill_switch
    from .controls import set_limit_store as set_limit_store
    from .controls import tagged as tagged
    from .controls import tool_matches as tool_matches
    from .credentials import assert_no_secrets as assert_no_secrets
    from .credentials import resolve_credential as resolve_credential
    from .credentials import set_credential_resolver as set_credential_resolver
    from .engine import Saga as Saga
    from .errors import CompensationError as CompensationError
    from .errors import ConfigurationError as ConfigurationError
    from .errors import GateBlocked as GateBlocked
    from .errors import HandlerNotRegistered as HandlerNotRegistered
    from .errors import NotSerializable as NotSerializable
    from .errors import RollbackIncomplete as RollbackIncomplete
    from .errors import SagaError as SagaError
    from .errors import SagaQuarantined as SagaQuarantined
    from .errors import SagaRefused as SagaRefused
    from .errors import SecretDetected as SecretDetected
    from .errors import StepOutcomeUnknown as StepOutcomeUnknown
    from .errors import StoreUnavailable as StoreUnavailable
    from .errors import WALBackpressure as WALBackpressure
    from .errors import WALClosed as WALClosed
    from .errors import WALCorrupt as WALCorrupt
    from .errors import WALDecryptFailed as WALDecryptFailed
    from .errors import WALError as WALError
    from .errors import WALKeyMissing as WALKeyMissing
    from .errors import WALStalled as WALStalled
    from .executor import ToolExecutorStats as ToolExecutorStats
    from .executor import set_tool_executor_size as set_tool_executor_size
    from .executor import tool_executor_stats as tool_executor_stats
    from .fastapi import SagaRuntime as SagaRuntime
    from .fastapi import current_saga as current_saga
    from .fastapi import saga as saga
    from .fastapi import saga_lifespan as saga_lifespan
    from .gates import Gate as Gate
    from .gates import GateDecision as GateDecision
    from .gates import StepRequest as StepRequest
    from .history import SagaState as SagaState
    from .history import StepState as StepState
    from .history import saga_states as saga_states
    from .idempotency import idempotency_key as idempotency_key
    from .isolation import FileSnapshots as FileSnapshots
    from .isolation import InProcessSnapshots as InProcessSnapshots
    from .isolation import LockClaim as LockClaim
    from .isolation import LockStoreUnavailable as LockStoreUnavailable
    from .isolation import RedisSemanticLocks as RedisSemanticLocks
    from .isolation import SemanticLockManager as SemanticLockManager
    from .isolation import SemanticLockNotHeld as SemanticLockNotHeld
    from .isolation import SemanticLocks as SemanticLocks
    from .isolation import SemanticLockTimeout as SemanticLockTimeout
    from .isolation import Snapshot as Snapshot
    from .isolation import SnapshotGCReport as SnapshotGCReport
    from .isolation import SnapshotMissing as SnapshotMissing
    from .isolation import TentativeResource as TentativeResource
    from .isolation import TentativeStatus as TentativeStatus
    from .kit import AgentKit as AgentKit
    from .loop import AgentLoop as AgentLoop
    from .loop import LoopResult as LoopResult
    from .loop import LoopTool as LoopTool
    from .loop import StopReason as StopReason
    from .mesh import MeshView as MeshView
    from .mesh import MeshWAL as MeshWAL
    from .mesh import RecordSet as RecordSet
    from .metrics import setup_metrics as setup_metrics
    from .observe import Observer as Observer
    from .plane import connect_policy_plane as connect_policy_plane
    from .records import Record as Record
    from .records import RecordType as RecordType
    from .recovery import Observation as Observation
    from .recovery import RecoveryDaemon as RecoveryDaemon
    from .recovery import RecoveryHalted as RecoveryHalted
    from .recovery import reconciler as reconciler
    from .retry import RetryPolicy as RetryPolicy
    from .rollback import RollbackOutcome as RollbackOutcome
    from .rollback import RollbackReport as RollbackReport
    from .rollback import StepOutcome as StepOutcome
    from .routing import CallableHost as CallableHost
    from .routing import Candidate as Candidate
    from .routing import Capabilities as Capabilities
    from .routing import Constraints as Constraints
    from .routing import HostAnswer as HostAnswer
    from .routing import Message as Message
    from .routing import ModelActionRefused as ModelActionRefused
    from .routing import ModelRequest as ModelRequest
    from .routing import ModelResponse as ModelResponse
    from .routing import OpenAIHost as OpenAIHost
    from .routing import RedisRouteSource as RedisRouteSource
    from .routing import Route as Route
    from .routing import Router as Router
    from .routing import RoutingDecision as RoutingDecision
    from .routing import RoutingRefused as RoutingRefused
    from .routing import RoutingUnavailable as RoutingUnavailable
    from .routing import Tool as Tool
    from .routing import ToolCall as ToolCall
    from .routing import Usage as Usage
    from .scope import saga_scope as saga_scope
    from .semantics import ActionSemantics as ActionSemantics
    from .telemetry import NoOpTracer as NoOpTracer
    from .telemetry import setup_telemetry as setup_telemetry
    from .wal import AsyncSink as AsyncSink
    from .wal import Backpressure as Backpressure
    from .wal import BaseWAL as BaseWAL
    from .wal import CompactionAborted as CompactionAborted
    from .wal import CompactionReport as CompactionReport
    from .wal import FileWAL as FileWAL
    from .wal import PostgresAsyncSink as PostgresAsyncSink
    from .wal import PostgresWAL as PostgresWAL
    from .wal import RedisWAL as RedisWAL
    from .wal import SinkWAL as SinkWAL
    from .wal import WALStats as WALStats
    from .wal import get_default_wal as get_default_wal
    from .wal import read_log as read_log
    from .wal import set_default_wal as set_default_wal


#: Every public name, by the module that defines it: the one list (``agent_saga._lazy``).
#: ``__all__`` derives from it, and each name is loaded on first use (PEP 562), so
#: ``import agent_saga`` (and a CLI command) pays only for what it touches.
_SOURCES: dict[str, tuple[str, ...]] = {
    ".audit": (
        "AESGCMEncryptor", "AuditRoot", "Certificate", "Checkpoint", "EncryptedWAL",
        "Keyring", "PayloadEncryptor", "audit_root", "build_consistency",
        "build_disclosure", "certify", "certify_log", "decrypting", "encryptor_from_env",
        "export_bundle", "make_checkpoint", "redact_record", "redact_records",
        "verify_bundle", "verify_checkpoint", "verify_consistency", "verify_disclosure",
    ),
    ".chain": ("VerifyResult", "verify_records",),
    ".clocks": ("Clock",),
    ".codemod": ("Codemod", "CodemodError", "CodemodRefused", "CodemodResult", "VerifyFailed",),
    ".compensation": ("Compensation", "compensator", "get_compensator", "registered_compensators",),
    ".context": ("SagaContextFilter", "configure_logging", "current_saga_id", "current_step_id",),
    ".controls": (
        "DEFAULT_RULES", "ApprovalGateway", "ApprovalNotice", "ApprovalOutcome",
        "ApprovalPolicy", "ApprovalProvider", "ApprovalRefused", "ApprovalStoreUnavailable",
        "BreakerPolicy", "BudgetLimit", "CheckRefusal", "CircuitBreaker", "EscalationLevel",
        "FileApprovalStore", "FileSwitchStore", "InProcessLimitStore", "KillSwitch",
        "Lever", "LeverAction", "LimitStore", "LimitStoreUnavailable", "LimitUsage",
        "ManualClock", "Notifier", "NotifierError", "PreCheck", "PreFlightDecision",
        "PreFlightGate", "RateLimit", "RedisApprovalStore", "RedisLimitSource",
        "RedisLimitStore", "RedisSwitchStore", "Rule", "SwitchStoreUnavailable",
        "WebhookNotifier", "arg_exceeds", "by_arg", "by_tool", "combine", "get_breaker",
        "get_kill_switch", "get_limit_store", "global_scope", "irreversible_requires_human",
        "rule", "set_breaker", "set_kill_switch", "set_limit_store", "tagged",
        "tool_matches",
    ),
    ".credentials": ("assert_no_secrets", "resolve_credential", "set_credential_resolver",),
    ".engine": ("Saga",),
    ".errors": (
        "CompensationError", "ConfigurationError", "GateBlocked", "HandlerNotRegistered",
        "NotSerializable", "RollbackIncomplete", "SagaError", "SagaQuarantined",
        "SagaRefused", "SecretDetected", "StepOutcomeUnknown", "StoreUnavailable",
        "WALBackpressure", "WALClosed", "WALCorrupt", "WALDecryptFailed", "WALError",
        "WALKeyMissing", "WALStalled",
    ),
    ".executor": ("ToolExecutorStats", "set_tool_executor_size", "tool_executor_stats",),
    ".fastapi": ("SagaRuntime", "current_saga", "saga", "saga_lifespan",),
    ".gates": ("Gate", "GateDecision", "StepRequest",),
    ".history": ("SagaState", "StepState", "saga_states",),
    ".idempotency": ("idempotency_key",),
    ".isolation": (
        "FileSnapshots", "InProcessSnapshots", "LockClaim", "LockStoreUnavailable",
        "RedisSemanticLocks", "SemanticLockManager", "SemanticLockNotHeld", "SemanticLocks",
        "SemanticLockTimeout", "Snapshot", "SnapshotGCReport", "SnapshotMissing",
        "TentativeResource", "TentativeStatus",
    ),
    ".kit": ("AgentKit",),
    ".loop": ("AgentLoop", "LoopResult", "LoopTool", "StopReason",),
    ".mesh": ("MeshView", "MeshWAL", "RecordSet",),
    ".metrics": ("setup_metrics",),
    ".observe": ("Observer",),
    ".plane": ("connect_policy_plane",),
    ".records": ("Record", "RecordType",),
    ".recovery": ("Observation", "RecoveryDaemon", "RecoveryHalted", "reconciler",),
    ".retry": ("RetryPolicy",),
    ".rollback": ("RollbackOutcome", "RollbackReport", "StepOutcome",),
    ".routing": (
        "CallableHost", "Candidate", "Capabilities", "Constraints", "HostAnswer", "Message",
        "ModelActionRefused", "ModelRequest", "ModelResponse", "OpenAIHost",
        "RedisRouteSource", "Route", "Router", "RoutingDecision", "RoutingRefused",
        "RoutingUnavailable", "Tool", "ToolCall", "Usage",
    ),
    ".scope": ("saga_scope",),
    ".semantics": ("ActionSemantics",),
    ".telemetry": ("NoOpTracer", "setup_telemetry"),
    ".wal": (
        "AsyncSink", "Backpressure", "BaseWAL", "CompactionAborted", "CompactionReport",
        "FileWAL", "PostgresAsyncSink", "PostgresWAL", "RedisWAL", "SinkWAL", "WALStats",
        "get_default_wal", "read_log", "set_default_wal",
    ),
    ".contextbroker": ("ContextBroker", "DriftedSource", "Receipt", "ServedContext", "Tier",),
}

__version__ = "0.1.0"


__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
