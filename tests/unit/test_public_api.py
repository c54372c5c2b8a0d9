"""The public API is exactly what __init__ exports, sorted; the core imports only the stdlib."""

from __future__ import annotations

import subprocess
import sys

import agent_saga

EXPECTED = {
    "ActionSemantics", "AgentKit", "Backpressure", "BaseWAL", "Clock", "Compensation",
    "CompensationError", "ConfigurationError", "FileWAL", "Gate", "GateBlocked", "GateDecision",
    "HandlerNotRegistered", "NotSerializable", "Record", "RecordType", "RetryPolicy",
    "RollbackIncomplete", "RollbackOutcome", "RollbackReport", "Saga", "SagaContextFilter",
    "SagaError", "SagaRefused", "SecretDetected", "StepOutcome", "StepOutcomeUnknown",
    "StepRequest", "ToolExecutorStats", "VerifyResult", "WALBackpressure", "WALClosed",
    "WALCorrupt", "WALError", "WALStalled", "WALStats", "assert_no_secrets", "compensator",
    "configure_logging", "current_saga_id", "current_step_id", "get_compensator",
    "get_default_wal", "idempotency_key", "registered_compensators", "resolve_credential",
    "saga_scope", "set_credential_resolver", "set_default_wal", "set_tool_executor_size",
    "tool_executor_stats", "verify_records",
    # audit (the brief's names first)
    "audit_root", "build_disclosure", "verify_disclosure", "redact_record", "certify",
    "export_bundle", "verify_bundle", "make_checkpoint", "verify_checkpoint", "EncryptedWAL",
    "WALKeyMissing", "WALDecryptFailed",
    # controls
    "PreFlightGate", "BudgetLimit", "RateLimit", "by_arg", "by_tool", "combine", "arg_exceeds",
    "set_limit_store", "RedisLimitStore", "InProcessLimitStore",
    # fleet WAL backends
    "RedisWAL", "PostgresWAL", "CompactionReport", "CompactionAborted",
}


def test_exports_are_pinned_and_sorted() -> None:
    assert agent_saga.__all__ == sorted(agent_saga.__all__)
    assert set(agent_saga.__all__) >= EXPECTED, EXPECTED - set(agent_saga.__all__)
    for name in agent_saga.__all__:
        assert hasattr(agent_saga, name), name


def test_every_error_derives_from_saga_error() -> None:
    for name in agent_saga.__all__:
        obj = getattr(agent_saga, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, agent_saga.SagaError), name


def test_importing_the_runtime_loads_only_the_standard_library() -> None:
    code = (
        "import sys; import agent_saga, agent_saga.cli; "
        "third = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) "
        "- {'agent_saga', '__main__', '_virtualenv', '__editable___agent_saga_0_1_0_finder'}); "
        "print(','.join(m for m in third if not m.startswith('_')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"third-party modules imported by the core: {out.stdout}"
