"""The public API is exactly what __init__ exports, sorted; the core imports only the stdlib."""

from __future__ import annotations

import subprocess
import sys

import agent_saga

EXPECTED = {
    # the engine: sagas, steps, semantics, compensation, retry, the one clock
    "ActionSemantics", "AgentKit", "Clock", "Compensation", "Gate", "GateDecision", "ManualClock",
    "Record", "RecordType", "RetryPolicy", "RollbackOutcome", "RollbackReport", "Saga",
    "SagaContextFilter", "StepOutcome", "StepRequest", "ToolExecutorStats", "compensator",
    # the policy plane: one call wires every control to it (as AGENT_SAGA_REDIS_URL does)
    "connect_policy_plane",
    "configure_logging", "current_saga_id", "current_step_id", "get_compensator", "idempotency_key",
    "registered_compensators", "saga_scope", "set_tool_executor_size", "tool_executor_stats",
    # credentials
    "assert_no_secrets", "resolve_credential", "set_credential_resolver",
    # errors (the tree in agent_saga/errors.py)
    "CompensationError", "ConfigurationError", "GateBlocked", "HandlerNotRegistered",
    "NotSerializable", "RollbackIncomplete", "SagaError", "SagaQuarantined", "SagaRefused",
    "SecretDetected", "StepOutcomeUnknown", "StoreUnavailable", "WALBackpressure", "WALClosed",
    "WALCorrupt", "WALDecryptFailed", "WALError", "WALKeyMissing", "WALStalled",
    # the WAL and reading it
    "Backpressure", "BaseWAL", "CompactionAborted", "CompactionReport", "FileWAL", "PostgresWAL",
    "RedisWAL", "SagaState", "StepState", "VerifyResult", "WALStats", "get_default_wal", "read_log",
    "saga_states", "set_default_wal", "verify_records",
    # storage: the async sink interface the engine's WAL needs from a store
    "AsyncSink", "SinkWAL", "PostgresAsyncSink",
    # offline mesh sagas: device logs, the G-Set replicas exchange, the merged view
    "MeshWAL", "RecordSet", "MeshView",
    # audit (the brief's names first)
    "audit_root", "build_disclosure", "verify_disclosure", "redact_record", "certify",
    "export_bundle", "verify_bundle", "make_checkpoint", "verify_checkpoint", "EncryptedWAL",
    "AESGCMEncryptor", "AuditRoot", "Certificate", "Checkpoint", "Keyring", "PayloadEncryptor",
    "build_consistency", "certify_log", "decrypting", "encryptor_from_env", "redact_records",
    "verify_consistency",
    # saga isolation: tentative resources, semantic locks, snapshots
    "TentativeResource", "TentativeStatus", "SemanticLockManager", "RedisSemanticLocks", "SemanticLocks",
    "LockClaim", "LockStoreUnavailable", "SemanticLockNotHeld", "SemanticLockTimeout", "FileSnapshots",
    "InProcessSnapshots", "Snapshot", "SnapshotGCReport", "SnapshotMissing",
    # recovery
    "RecoveryDaemon", "RecoveryHalted", "reconciler", "Observation",
    # the agent runtime: repository edits as transactions
    "Codemod", "CodemodError", "CodemodRefused", "CodemodResult", "VerifyFailed",
    # the agent runtime: the loop
    "AgentLoop", "LoopResult", "LoopTool", "StopReason",
    # the agent runtime: the router and its IR, and the context broker (loaded on first use)
    "Router", "Route", "Constraints", "Capabilities", "OpenAIHost", "CallableHost", "RedisRouteSource",
    "Message", "Tool", "ToolCall", "ModelRequest", "HostAnswer", "Usage", "ModelResponse", "RoutingDecision",
    "Candidate", "RoutingRefused", "ModelActionRefused", "RoutingUnavailable",
    "ContextBroker", "Tier", "Receipt", "ServedContext", "DriftedSource",
    # controls: the gate, rules, limits
    "PreFlightGate", "PreFlightDecision", "PreCheck", "CheckRefusal", "DEFAULT_RULES", "Rule",
    "arg_exceeds", "irreversible_requires_human", "rule", "tagged", "tool_matches",
    "BudgetLimit", "RateLimit", "by_arg", "by_tool", "combine", "global_scope",
    "set_limit_store", "get_limit_store", "RedisLimitStore", "InProcessLimitStore", "LimitStore",
    "LimitStoreUnavailable", "LimitUsage", "RedisLimitSource",
    # controls: kill switch, breaker, approvals
    "KillSwitch", "Lever", "LeverAction", "FileSwitchStore", "RedisSwitchStore",
    "SwitchStoreUnavailable", "get_kill_switch", "set_kill_switch",
    "CircuitBreaker", "BreakerPolicy", "get_breaker", "set_breaker",
    "ApprovalGateway", "ApprovalNotice", "ApprovalOutcome", "ApprovalPolicy", "ApprovalProvider",
    "ApprovalRefused", "ApprovalStoreUnavailable", "EscalationLevel", "FileApprovalStore",
    "Notifier", "NotifierError", "RedisApprovalStore", "WebhookNotifier",
    # integrations: FastAPI lifespan, OpenTelemetry, Prometheus, the observer hook
    "saga_lifespan", "saga", "current_saga", "SagaRuntime", "setup_telemetry", "NoOpTracer", "setup_metrics",
    "Observer",
}


def test_exports_are_pinned_and_sorted() -> None:
    assert agent_saga.__all__ == sorted(agent_saga.__all__)
    exported = set(agent_saga.__all__)
    assert len(exported) == len(agent_saga.__all__), "a name is exported twice"
    assert exported == EXPECTED, (
        f"not exported: {sorted(EXPECTED - exported)}; exported but not pinned: {sorted(exported - EXPECTED)}"
    )
    for name in agent_saga.__all__:
        assert hasattr(agent_saga, name), name


def test_every_error_derives_from_saga_error() -> None:
    for name in agent_saga.__all__:
        obj = getattr(agent_saga, name)
        if isinstance(obj, type) and issubclass(obj, Exception):
            assert issubclass(obj, agent_saga.SagaError), name


def test_importing_the_runtime_loads_only_the_standard_library() -> None:
    # This includes the integrations' libraries: agent_saga re-exports saga_lifespan,
    # setup_telemetry and setup_metrics, and must not load fastapi, starlette,
    # opentelemetry or prometheus_client to do so.
    code = (
        "import sys; import agent_saga, agent_saga.cli, agent_saga.kubectl, agent_saga.connectors, "
        "agent_saga.connectors.stripe, "
        "agent_saga.connectors.salesforce; "
        "third = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names) "
        "- {'agent_saga', '__main__', '_virtualenv', '__editable___agent_saga_0_1_0_finder'}); "
        "print(','.join(m for m in third if not m.startswith('_')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"third-party modules imported by the core: {out.stdout}"


PUBLIC_PACKAGES = (
    "agent_saga", "agent_saga.audit", "agent_saga.controls", "agent_saga.controls.approvals",
    "agent_saga.controls.breaker", "agent_saga.controls.gate", "agent_saga.controls.killswitch",
    "agent_saga.controls.limits", "agent_saga.mcp", "agent_saga.recovery", "agent_saga.wal", "agent_saga.connectors",
    "agent_saga.routing", "agent_saga.contextbroker", "agent_saga.codemod", "agent_saga.loop",
    "agent_saga.ui", "agent_saga.mesh", "agent_saga.speculation", "agent_saga.isolation",
)

MCP_EXPECTED = {
    # the proxy (agent-saga mcp) and its parts
    "McpProxy", "HttpProxy", "call_tool_http", "ProxyOptions", "run_proxy", "loop_factory", "ToolSession", "Boundary", "COMMIT_TOOL", "ROLLBACK_TOOL",
    "ClientChannel", "stdio_client_channel", "StdioUpstream", "UpstreamGone", "OutcomeUnknown",
    "call_tool_once", "result_document", "Surface", "OnePolicy", "plane_policy",
    # named upstreams: how a recovery daemon reaches an MCP server (mcp:<name>)
    "ENV_UPSTREAMS", "IDEMPOTENCY_META", "UpstreamSpec", "handler_name", "load_upstreams", "register_upstream",
}


def test_the_mcp_proxy_exports_are_pinned_and_sorted() -> None:
    import agent_saga.mcp as mcp

    assert mcp.__all__ == sorted(mcp.__all__)
    assert set(mcp.__all__) == MCP_EXPECTED, (
        f"not exported: {sorted(MCP_EXPECTED - set(mcp.__all__))}; "
        f"exported but not pinned: {sorted(set(mcp.__all__) - MCP_EXPECTED)}")


ROUTING_EXPECTED = {
    # the IR and the hosts
    "Message", "Tool", "ToolCall", "ModelRequest", "HostAnswer", "Usage", "estimate_tokens",
    "Host", "OpenAIHost", "CallableHost", "Capabilities", "HostError", "COST_CLASSES",
    # routes, the router, its decisions and refusals
    "Route", "Constraints", "RouteSource", "RedisRouteSource", "Router", "RoutingDecision", "Candidate",
    "ModelResponse", "RoutingRefused", "ModelActionRefused", "RoutingUnavailable", "action_problem",
    # the record types it writes
    "DECISION", "REFUSED", "REPAIRED", "ACTION_REFUSED",
}
CONTEXT_EXPECTED = {"ContextBroker", "Tier", "Receipt", "ContextItem", "ServedContext", "Eviction",
                    "DriftedSource", "SERVED", "EVICTED"}


def test_the_routing_and_context_exports_are_pinned_and_sorted() -> None:
    import agent_saga.contextbroker as contextbroker
    import agent_saga.routing as routing

    for module, expected in ((routing, ROUTING_EXPECTED), (contextbroker, CONTEXT_EXPECTED)):
        assert module.__all__ == sorted(module.__all__)
        assert set(module.__all__) == expected, module.__name__


def test_every_public_name_and_its_public_methods_have_a_docstring() -> None:
    """Ruff's pydocstyle rules (D1xx) check the public modules; this checks what the public
    packages export, wherever it is defined (private modules included)."""
    import importlib
    import inspect

    missing: list[str] = []
    for package in PUBLIC_PACKAGES:
        module = importlib.import_module(package)
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isfunction(obj) and not obj.__doc__:
                missing.append(f"{package}.{name}")
            if not inspect.isclass(obj):
                continue
            if not obj.__dict__.get("__doc__"):
                missing.append(f"{package}.{name}")
            for attr, value in vars(obj).items():
                if attr.startswith("_"):
                    continue
                fn = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
                if inspect.isfunction(fn) and not fn.__doc__:
                    missing.append(f"{package}.{name}.{attr}")
    assert missing == [], f"public names without a docstring: {missing}"


def test_the_packages_ship_py_typed_so_users_type_checkers_read_their_hints() -> None:
    import tomllib
    from importlib import resources
    from pathlib import Path

    import agent_saga_operator
    import agent_saga_recoveryd

    data = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    for package in (agent_saga, agent_saga_operator, agent_saga_recoveryd):
        name = package.__name__
        assert resources.files(name).joinpath("py.typed").is_file(), name  # PEP 561's marker
        assert "py.typed" in data.get(name, []), f"{name}: py.typed is not in the wheel's package data"
