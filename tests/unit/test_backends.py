"""One URL -> backend mechanism (``agent_saga._backends``) for every kind opened from a
string: WAL writers and readers, kill-switch, limit, approval and claim stores."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga._backends import Backends
from agent_saga.controls.approvals import (
    APPROVAL_STORES,
    FileApprovalStore,
    RedisApprovalStore,
    open_approval_store,
)
from agent_saga.controls.killswitch import (
    SWITCH_STORES,
    FileSwitchStore,
    RedisSwitchStore,
    open_switch_store,
)
from agent_saga.controls.limits import (
    LIMIT_STORES,
    InProcessLimitStore,
    RedisLimitStore,
    open_limit_store,
)
from agent_saga.errors import ConfigurationError
from agent_saga.recovery import FileClaimLock, open_claim_lock
from agent_saga.recovery.targets import CLAIM_LOCKS
from agent_saga.wal import FileWAL, open_reader, open_wal
from agent_saga.wal.readers import READERS
from agent_saga.wal.targets import WALS

REGISTRIES = [WALS, READERS, SWITCH_STORES, LIMIT_STORES, APPROVAL_STORES, CLAIM_LOCKS]


@pytest.mark.parametrize("registry", REGISTRIES, ids=lambda r: r.kind)
def test_an_unknown_scheme_names_the_kind_and_the_schemes_without_the_password(registry: Backends[object]) -> None:
    with pytest.raises(ConfigurationError) as info:
        registry.open("ftp://user:hunter2@host/x")
    text = str(info.value)
    assert f"unknown {registry.kind} scheme 'ftp'" in text and "hunter2" not in text and "redis://" in text


def test_every_kind_takes_redis_and_the_file_kinds_take_a_path(tmp_path: Path) -> None:
    for registry in REGISTRIES:
        assert {"redis", "rediss", "unix"} <= set(registry.schemes), registry.kind
    assert "file" in WALS.schemes and "file" in READERS.schemes and "file" in SWITCH_STORES.schemes
    assert "file" in APPROVAL_STORES.schemes and "file" in CLAIM_LOCKS.schemes
    assert "" in LIMIT_STORES.schemes, "an empty limit store target is the in-process store"


def test_the_options_a_backend_takes_are_split_off_the_url() -> None:
    address = WALS.address("redis://:pw@h:6379/0?key=k&writer=w&ssl_cert_reqs=none")
    assert address.scheme == "redis" and dict(address.options) == {"key": "k", "writer": "w"}
    assert address.url == "redis://:pw@h:6379/0?ssl_cert_reqs=none"
    assert SWITCH_STORES.address("rediss://h/0?grace=30").options == {"grace": "30"}


def test_paths_and_file_urls_open_the_file_backends(tmp_path: Path) -> None:
    wal = open_wal(f"file://{tmp_path}/a.wal")
    try:
        assert isinstance(wal, FileWAL) and Path(wal.path) == tmp_path / "a.wal"
    finally:
        wal.close()
    assert open_reader(str(tmp_path / "a.wal")).chains() == [str(tmp_path / "a.wal")]
    assert isinstance(open_switch_store(str(tmp_path / "levers.json"), warn=False), FileSwitchStore)
    store = open_approval_store(f"file://{tmp_path}/approvals")
    assert isinstance(store, FileApprovalStore) and store.directory == f"{tmp_path}/approvals"
    assert isinstance(open_claim_lock(str(tmp_path / "claims")), FileClaimLock)


def test_redis_urls_open_the_redis_backends_without_connecting() -> None:
    assert isinstance(open_limit_store(""), InProcessLimitStore)
    limits = open_limit_store("redis://10.0.0.9:6379/0")
    assert isinstance(limits, RedisLimitStore) and limits.url == "redis://10.0.0.9:6379/0"
    switch = open_switch_store("redis://10.0.0.9:6379/0?grace=5")
    assert isinstance(switch, RedisSwitchStore) and switch.grace == 5 and switch.url == "redis://10.0.0.9:6379/0"
    assert isinstance(open_approval_store("redis://10.0.0.9:6379/0"), RedisApprovalStore)


def test_a_redis_kill_switch_store_needs_a_grace_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AGENT_SAGA_SWITCH_GRACE", raising=False)
    with pytest.raises(ConfigurationError, match=r"needs a grace window.*\?grace=SECONDS"):
        open_switch_store("redis://10.0.0.9:6379/0")
