"""Sharding orders work and never strands it: a member that leaves moves only its own
sagas, and a daemon that cannot read the membership, or is not in it, takes every orphan."""

from __future__ import annotations

from pathlib import Path

import pytest
from agent_saga.errors import ConfigurationError
from agent_saga.recovery import RecoveryDaemon
from agent_saga.recovery.shards import owner_of, shard_of

SAGAS = [f"saga-{i}" for i in range(300)]


def test_every_saga_has_one_owner_and_a_dead_member_moves_only_its_own() -> None:
    members = ["a", "b", "c"]
    before = {s: owner_of(s, members) for s in SAGAS}
    shards = [shard_of(SAGAS, m, members) for m in members]
    assert sorted(s for sh in shards for s in sh) == sorted(SAGAS), "each saga in exactly one shard"
    assert all(len(sh) > 50 for sh in shards)
    after = {s: owner_of(s, ["a", "c"]) for s in SAGAS}
    moved = {s for s in SAGAS if before[s] != after[s]}
    assert moved == {s for s in SAGAS if before[s] == "b"}


def test_an_unknown_membership_or_one_without_this_daemon_takes_every_orphan() -> None:
    assert shard_of(SAGAS, "a", None) == SAGAS
    assert shard_of(SAGAS, "a", ["b", "c"]) == SAGAS
    assert shard_of(SAGAS, "a", ["a"]) == SAGAS


def test_shard_needs_claims_that_keep_a_membership(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="shard=True needs claims that keep a membership"):
        RecoveryDaemon(tmp_path / "a.wal", shard=True)
