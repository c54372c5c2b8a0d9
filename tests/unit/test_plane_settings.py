"""One setting wires an agent pod: reading AGENT_SAGA_REDIS_URL, the namespace and the
identity, and how the CLI picks the store it reads (always saying which)."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga.cli import main
from agent_saga.errors import ConfigurationError
from agent_saga.plane import DEFAULT_GRACE, PlaneSettings, choose_store

URL = "redis://:s3cret@plane:6379/0"


def test_without_the_url_nothing_is_wired() -> None:
    assert PlaneSettings.from_env({"AGENT_SAGA_NAMESPACE": "payments"}) is None


def test_the_url_with_a_namespace_and_an_identity_is_all_an_agent_needs() -> None:
    s = PlaneSettings.from_env({"AGENT_SAGA_REDIS_URL": URL, "AGENT_SAGA_NAMESPACE": "payments",
                                "AGENT_SAGA_AGENT": "payments-agent"})
    assert s is not None
    assert (s.url, s.namespace, s.agent, s.grace, s.prefix) == (URL, "payments", "payments-agent", DEFAULT_GRACE,
                                                                "agentsaga:v1")
    assert "s3cret" not in s.describe()


def test_the_kill_switch_grace_has_a_documented_default_and_can_be_set() -> None:
    env = {"AGENT_SAGA_REDIS_URL": URL, "AGENT_SAGA_NAMESPACE": "payments"}
    assert PlaneSettings.from_env(env).grace == 30.0  # type: ignore[union-attr]
    assert PlaneSettings.from_env({**env, "AGENT_SAGA_SWITCH_GRACE": "0"}).grace == 0.0  # type: ignore[union-attr]


def test_the_plane_check_interval_has_a_documented_default_and_can_be_set() -> None:
    env = {"AGENT_SAGA_REDIS_URL": URL, "AGENT_SAGA_NAMESPACE": "payments"}
    assert PlaneSettings.from_env(env).check_interval == 0.5  # type: ignore[union-attr]
    s = PlaneSettings.from_env({**env, "AGENT_SAGA_PLANE_CHECK_INTERVAL": "2.5"})
    assert s is not None and s.check_interval == 2.5
    with pytest.raises(ConfigurationError, match="check_interval must be a number of seconds above 0 and at most 60"):
        PlaneSettings(URL, "payments", "agent", check_interval=0)


def test_the_pods_namespace_is_used_when_agent_saga_namespace_is_not_set() -> None:
    s = PlaneSettings.from_env({"AGENT_SAGA_REDIS_URL": URL, "POD_NAMESPACE": "billing"})
    assert s is not None and s.namespace == "billing"


def test_a_url_without_a_namespace_fails_naming_the_fix() -> None:
    with pytest.raises(ConfigurationError, match="set AGENT_SAGA_NAMESPACE .*fieldRef metadata.namespace"):
        PlaneSettings.from_env({"AGENT_SAGA_REDIS_URL": URL})


@pytest.mark.parametrize(("env", "named"), [
    ({"AGENT_SAGA_NAMESPACE": "Payments"}, "AGENT_SAGA_NAMESPACE='Payments'"),
    ({"AGENT_SAGA_NAMESPACE": "p", "AGENT_SAGA_AGENT": "a/b"}, "AGENT_SAGA_AGENT='a/b'"),
    ({"AGENT_SAGA_NAMESPACE": "p", "AGENT_SAGA_SWITCH_GRACE": "soon"}, "AGENT_SAGA_SWITCH_GRACE='soon'"),
    ({"AGENT_SAGA_NAMESPACE": "p", "AGENT_SAGA_SWITCH_GRACE": "-1"}, "non-negative"),
    ({"AGENT_SAGA_NAMESPACE": "p", "AGENT_SAGA_HEARTBEAT_INTERVAL": "0"}, "AGENT_SAGA_HEARTBEAT_INTERVAL='0'"),
    ({"AGENT_SAGA_NAMESPACE": "p", "AGENT_SAGA_PLANE_CHECK_INTERVAL": "0"}, "AGENT_SAGA_PLANE_CHECK_INTERVAL='0'"),
    ({"AGENT_SAGA_NAMESPACE": "p", "AGENT_SAGA_PLANE_CHECK_INTERVAL": "soon"}, "AGENT_SAGA_PLANE_CHECK_INTERVAL='soon'"),
    ({"AGENT_SAGA_NAMESPACE": "p", "AGENT_SAGA_PLANE_CHECK_INTERVAL": "61"}, "AGENT_SAGA_PLANE_CHECK_INTERVAL='61' is "
                                                                             "more than 60 seconds"),
])
def test_a_bad_value_names_its_variable(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigurationError, match=named.replace("(", r"\(")):
        PlaneSettings.from_env({"AGENT_SAGA_REDIS_URL": URL, **env})


def test_a_url_that_is_not_redis_is_refused_without_echoing_it() -> None:
    with pytest.raises(ConfigurationError) as info:
        PlaneSettings.from_env({"AGENT_SAGA_REDIS_URL": "http://user:pw@plane/", "AGENT_SAGA_NAMESPACE": "p"})
    assert "AGENT_SAGA_REDIS_URL must be redis://" in str(info.value) and "pw@plane" not in str(info.value)


# ---------------------------------------------------------------- the CLI's store
def test_the_cli_takes_the_explicit_store_then_the_specific_variable_then_the_plane(tmp_path: Path) -> None:
    env = {"AGENT_SAGA_APPROVAL_STORE": "redis://a/1", "AGENT_SAGA_REDIS_URL": URL}
    assert choose_store("redis://x/0", "AGENT_SAGA_APPROVAL_STORE", env=env).source == "--store"
    assert choose_store(None, "AGENT_SAGA_APPROVAL_STORE", env=env).target == "redis://a/1"
    plane = choose_store(None, "AGENT_SAGA_APPROVAL_STORE", env={"AGENT_SAGA_REDIS_URL": URL})
    assert plane.from_plane and plane.describe() == "redis://:***@plane:6379/0 (from $AGENT_SAGA_REDIS_URL)"


def test_the_cli_never_falls_back_to_a_local_store_that_does_not_exist(tmp_path: Path) -> None:
    missing = str(tmp_path / "agent-saga-approvals")
    none = choose_store(None, "AGENT_SAGA_APPROVAL_STORE", env={}, local_default=missing)
    assert none.target is None and none.describe() == "none configured"
    Path(missing).mkdir()
    there = choose_store(None, "AGENT_SAGA_APPROVAL_STORE", env={}, local_default=missing)
    assert there.target == missing and "no store configured" in there.source


def test_approvals_list_with_nothing_configured_says_how_to_name_a_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for v in ("AGENT_SAGA_APPROVAL_STORE", "AGENT_SAGA_REDIS_URL"):
        monkeypatch.delenv(v, raising=False)
    assert main(["approvals", "list"]) == 2
    err = capsys.readouterr().err
    assert "no approval store configured" in err and "AGENT_SAGA_REDIS_URL" in err


def test_approvals_list_says_which_store_it_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("AGENT_SAGA_REDIS_URL", raising=False)
    monkeypatch.setenv("AGENT_SAGA_APPROVAL_STORE", str(tmp_path / "approvals"))
    assert main(["approvals", "list"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("store: ") and "(from $AGENT_SAGA_APPROVAL_STORE)" in out
