"""Choosing the limit store: the process default, set_limit_store, the fleet warning
("a local budget fails open across a fleet"), and no third-party import in the core."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
from agent_saga.controls import (
    BudgetLimit,
    InProcessLimitStore,
    PreFlightGate,
    RedisLimitStore,
    fleet_signs,
    get_limit_store,
    set_limit_store,
)
from agent_saga.controls.limits import ENV_LIMIT_STORE
from agent_saga.controls.limits import _fleet as fleet
from agent_saga.errors import ConfigurationError

LIMIT = BudgetLimit("daily-spend", arg="amount", max_total=50_000, window=86_400)


@pytest.fixture(autouse=True)
def _isolate(monkeypatch):
    prev = set_limit_store(None)
    fleet._reset_for_tests()
    for var in ("KUBERNETES_SERVICE_HOST", "WEB_CONCURRENCY", "POD_NAME", "HOSTNAME", "GUNICORN_CMD_ARGS",
                "UVICORN_WORKERS", "DYNO", "AGENT_SAGA_SINGLE_PROCESS", ENV_LIMIT_STORE):
        monkeypatch.delenv(var, raising=False)
    yield
    set_limit_store(prev)
    fleet._reset_for_tests()


def test_the_default_store_is_in_process_and_set_limit_store_replaces_it():
    assert isinstance(get_limit_store(), InProcessLimitStore)
    redis_store = RedisLimitStore("redis://127.0.0.1:6379/0")
    set_limit_store(redis_store)
    assert get_limit_store() is redis_store
    assert PreFlightGate(limits=[LIMIT]).store is redis_store


def test_the_default_store_can_come_from_the_environment(monkeypatch):
    monkeypatch.setenv(ENV_LIMIT_STORE, "redis://:secret@10.0.0.9:6379/0")
    store = get_limit_store()
    assert isinstance(store, RedisLimitStore)
    assert store.describe() == "RedisLimitStore(redis://***@10.0.0.9:6379/0)", "no password in messages"


def test_set_limit_store_refuses_what_is_not_a_store():
    with pytest.raises(ConfigurationError, match="set_limit_store"):
        set_limit_store("redis://localhost")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("env", "sign"),
    [
        ({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, "KUBERNETES_SERVICE_HOST"),
        ({"WEB_CONCURRENCY": "4"}, "WEB_CONCURRENCY=4"),
        ({"GUNICORN_CMD_ARGS": "--bind 0.0.0.0 --workers 3"}, "3 workers"),
        ({"UVICORN_WORKERS": "2"}, "UVICORN_WORKERS=2"),
        ({"POD_NAME": "agent-0"}, "POD_NAME"),
        ({"HOSTNAME": "agent-7d9f8b6c5d-x2k8q"}, "looks like a replicated pod"),
        ({"DYNO": "web.2"}, "DYNO"),
    ],
)
def test_fleet_signs_recognise_a_process_that_is_one_of_many(env, sign):
    signs = fleet_signs(env, spawned=False)
    assert any(sign in s for s in signs), signs


def test_fleet_signs_stay_quiet_for_a_lone_process():
    assert fleet_signs({"HOSTNAME": "laptop", "WEB_CONCURRENCY": "1"}, spawned=False) == []
    assert fleet_signs({}, spawned=True) == ["this process was started by multiprocessing (a worker among others)"]


def test_in_process_store_in_a_fleet_warns_once_at_start_up(monkeypatch, caplog):
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    with caplog.at_level(logging.WARNING, logger="agent_saga.controls"):
        PreFlightGate(limits=[LIMIT])
        PreFlightGate(limits=[LIMIT])
    warnings = [r for r in caplog.records if r.name == "agent_saga.controls"]
    assert len(warnings) == 1
    message = warnings[0].getMessage()
    assert "InProcessLimitStore" in message and "KUBERNETES_SERVICE_HOST" in message
    assert "set_limit_store(RedisLimitStore(url))" in message and "N times" in message


def test_no_fleet_warning_with_a_shared_store_without_limits_or_when_acknowledged(monkeypatch, caplog):
    monkeypatch.setenv("WEB_CONCURRENCY", "8")
    with caplog.at_level(logging.WARNING, logger="agent_saga.controls"):
        PreFlightGate(limits=[LIMIT], store=RedisLimitStore("redis://127.0.0.1:6379/0"))
        PreFlightGate()  # no limits: nothing to over-grant
        monkeypatch.setenv("AGENT_SAGA_SINGLE_PROCESS", "1")
        PreFlightGate(limits=[LIMIT])
    assert [r for r in caplog.records if r.name == "agent_saga.controls"] == []


def test_the_runtime_core_does_not_import_redis():
    code = textwrap.dedent(
        """
        import sys
        import agent_saga.controls as c
        c.PreFlightGate(limits=[c.BudgetLimit("x", arg="amount", max_total=1, window=1)])
        c.RedisLimitStore("redis://127.0.0.1:6379/0")
        assert "redis" not in sys.modules, sorted(m for m in sys.modules if m.startswith("redis"))
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
