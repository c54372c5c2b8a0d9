"""The command line: required Redis URL, environment fallbacks, kopf registry contents."""

from __future__ import annotations

import pytest
from agent_saga_operator.__main__ import parse_args
from agent_saga_operator.config import OperatorConfig
from agent_saga_operator.handlers import build_registry
from agent_saga_operator.metrics import last_spec_write


def test_redis_url_is_required(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("AGENT_SAGA_REDIS_URL", raising=False)
    with pytest.raises(SystemExit) as exc:
        parse_args([])
    assert exc.value.code == 2 and "--redis-url" in capsys.readouterr().err


def test_environment_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_SAGA_REDIS_URL", "redis://r:6379/0")
    monkeypatch.setenv("AGENT_SAGA_OPERATOR_NAMESPACES", "a,b")
    args = parse_args(["--resync-interval", "5"])
    assert args.redis_url == "redis://r:6379/0" and args.namespaces == ["a", "b"] and args.resync_interval == 5


def test_registry_has_every_handler_kind() -> None:
    registry = build_registry(OperatorConfig(redis_url="redis://x"))
    changing = registry._changing.get_all_handlers()
    ids = {str(h.id) for h in changing}
    assert {"reconcile", "reconcile/spec", "remove"} <= ids
    timers = [h for h in registry._spawning.get_all_handlers() if str(h.id) == "resync"]
    assert len(timers) == 5
    daemons = [h for h in registry._spawning.get_all_handlers() if str(h.id) == "expiry"]
    assert len(daemons) == 2  # KillSwitch TTL, Approval deadline


def test_projection_lag_reads_spec_writes_only() -> None:
    meta = {"managedFields": [
        {"manager": "kubectl", "operation": "Apply", "time": "2026-07-01T12:00:00Z"},
        {"manager": "op", "operation": "Update", "subresource": "status", "time": "2026-07-01T12:09:00Z"},
        {"manager": "kubectl", "operation": "Update", "time": "2026-07-01T12:05:00Z"},
    ]}
    written = last_spec_write(meta)
    assert written is not None and written.isoformat() == "2026-07-01T12:05:00+00:00"
    assert last_spec_write({}) is None
