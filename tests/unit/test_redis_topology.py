"""Sentinel and Cluster URLs, and one cluster slot per multi-key script.

``agent_saga._redis.topology`` parses what users type; ``key_slot`` is Redis Cluster's
CRC16 slot; every Lua script of the runtime and the operator names keys of one slot when
the key prefixes carry the documented hash tags (``{agentsaga}`` for the policy plane,
``{agent-saga}:wal`` for a WAL, the limit and recovery namespaces tag themselves).
"""

from __future__ import annotations

import pytest
from agent_saga._backends import REDIS_SCHEMES
from agent_saga._redis import key_slot, one_slot, topology
from agent_saga.errors import ConfigurationError
from agent_saga.wal.urls import redact, secrets_in

PLANE = "{agentsaga}:v1"


def test_a_sentinel_url_names_the_sentinels_the_service_and_the_database() -> None:
    t = topology("redis+sentinel://app:s3cret@10.0.0.1:26380,10.0.0.2/payments?db=3&sentinel_password=sp")
    assert t.kind == "sentinel"
    assert t.nodes == (("10.0.0.1", 26380), ("10.0.0.2", 26379))
    assert (t.service, t.db, t.username, t.password, t.sentinel_password, t.ssl) == (
        "payments", 3, "app", "s3cret", "sp", False)
    assert topology("rediss+sentinel://s:26379/m").ssl is True


def test_a_cluster_url_names_its_seed_nodes() -> None:
    t = topology("redis+cluster://:pw@n1:7000,n2:7001,n3")
    assert (t.kind, t.nodes, t.password) == ("cluster", (("n1", 7000), ("n2", 7001), ("n3", 6379)), "pw")
    assert topology("redis://h:6379/0").kind == "single"


@pytest.mark.parametrize(("url", "fix"), [
    ("redis+sentinel://s1:26379", "the path must be the Sentinel service name"),
    ("redis+sentinel://s1:26379/m?db=x", "db must be a number"),
    ("redis+sentinel://:hunter2@s1/m?socket_timeout=1", "unknown parameter(s) socket_timeout"),
    ("redis+cluster://:hunter2@n1:7000/2", "a Redis Cluster has only database 0"),
    ("redis+cluster:///", "no host given"),
])
def test_a_bad_ha_url_is_refused_naming_the_fix_without_the_password(url: str, fix: str) -> None:
    with pytest.raises(ConfigurationError) as e:
        topology(url)
    assert fix in str(e.value)
    assert "hunter2" not in str(e.value)
    assert "the form is redis+" in str(e.value)


def test_every_store_takes_the_ha_schemes_and_a_sentinel_password_is_a_secret() -> None:
    assert {"redis+sentinel", "rediss+sentinel", "redis+cluster", "rediss+cluster"} <= set(REDIS_SCHEMES)
    url = "redis+sentinel://s1:26379/m?sentinel_password=topsecret"
    assert "topsecret" in secrets_in(url)
    assert "topsecret" not in redact(url)


def test_key_slot_is_redis_clusters_crc16_of_the_hash_tag() -> None:
    # Values from the Redis Cluster specification and CLUSTER KEYSLOT.
    assert key_slot("foo") == 12182
    assert key_slot("123456789") == 12739
    assert key_slot("{user1000}.following") == key_slot("{user1000}.followers") == key_slot("user1000")
    assert key_slot("foo{}{bar}") == key_slot("foo{}{bar}")  # an empty tag: the whole key
    assert key_slot("foo{{bar}}zap") == key_slot("{bar")


def _script_key_sets() -> dict[str, list[str]]:
    """The KEYS of every Lua script, built by the modules' own key names, with the
    documented cluster prefixes."""
    from agent_saga.controls.approvals._redis import RedisApprovalStore
    from agent_saga.controls.killswitch._redis import RedisSwitchStore
    from agent_saga.controls.limits._redis import RedisLimitStore
    from agent_saga.controls.policy._surface import surface_index_key, surface_key
    from agent_saga.heartbeat._model import (
        heartbeat_buckets_key,
        heartbeat_index_key,
        heartbeat_key,
        heartbeat_legacy_index_key,
    )
    from agent_saga.isolation import RedisSemanticLocks
    from agent_saga.recovery.redis import RedisClaimLock, RedisLedger
    from agent_saga.wal.redis import RedisLog
    from agent_saga_operator.projection import Keys

    wal = RedisLog(None, "{agent-saga}:wal", "test")
    limits = RedisLimitStore("redis+cluster://n1:7000")
    approvals = RedisApprovalStore("redis+cluster://n1:7000", prefix=PLANE)
    reader = RedisSwitchStore("redis+cluster://n1:7000", grace=0, prefix=PLANE)
    claims = RedisClaimLock("redis+cluster://n1:7000")
    ledger = RedisLedger("redis+cluster://n1:7000")
    k = Keys("{agentsaga}")
    locks = RedisSemanticLocks("redis+cluster://n1:7000")
    return {
        "RedisWAL APPEND/COMPACT": [wal.stream("pod-7"), wal.gseq_key, wal.writers_key],
        "RedisLimitStore debit/refund/usage": [*limits._keys, limits.defs_key],
        "RedisApprovalStore request": [approvals.request_key("r1"), approvals.pending_key],
        "RedisApprovalStore decide": [approvals.decision_key("r1"), approvals.pending_key, approvals.rev_key],
        "policy-plane reader sync marker": [reader.index_key, reader.rev_key, reader.synced_key],
        "kill switch engage/release": [reader.key("lever-1"), reader.index_key, reader.rev_key,
                                       reader.synced_key],
        "heartbeat beat/gone": [heartbeat_key(PLANE, "payments/pod.7"), heartbeat_index_key(PLANE, "payments/pod"),
                                heartbeat_legacy_index_key(PLANE), heartbeat_buckets_key(PLANE)],
        "agent surface": [surface_key(PLANE, "payments", "agent"), surface_index_key(PLANE)],
        "recovery claims and ledger": [claims.key("saga-1"), ledger._done, ledger._attempts, ledger._esc,
                                       ledger._resolved, ledger._journal],
        "semantic locks acquire/renew/release": [locks.key("account:42")],
        "operator put/delete": [k.doc("killswitch", "x"), k.index("killswitch"), k.rev],
        "operator decision": [k.decision("r1"), k.rev, k.pending],
        "operator sync": [k.synced, k.rev, k.sync_pending("n1")],
    }


def test_every_script_keeps_its_keys_in_one_cluster_slot_with_the_documented_prefixes() -> None:
    for what, keys in _script_key_sets().items():
        slots = {key_slot(key) for key in keys}
        assert len(slots) == 1, f"{what}: {keys} span slots {slots}"
        one_slot(keys, what)


def test_a_script_across_slots_is_refused_naming_the_hash_tag_fix() -> None:
    with pytest.raises(ConfigurationError) as e:
        one_slot(["agent-saga:wal:w:pod-7", "agent-saga:wal:gseq"], "RedisWAL key 'agent-saga:wal'")
    assert "give the key prefix one hash tag" in str(e.value)
    assert "{agent-saga}:wal" in str(e.value)


def test_every_script_of_the_runtime_operator_and_recoveryd_goes_through_the_one_redis_module() -> None:
    """``_redis.script`` is where the one-slot guard lives: a direct ``register_script``
    elsewhere would send a cross-slot script to a cluster unchecked."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    direct = [str(p.relative_to(root)) for d in ("runtime", "operator", "recoveryd") for p in (root / d).rglob("*.py")
              if p.name != "_redis.py" and ".register_script(" in p.read_text()]
    assert direct == [], f"register_script called outside agent_saga._redis.script: {direct}"


def test_the_policy_plane_on_a_cluster_without_a_hash_tagged_prefix_is_refused_at_open_naming_the_setting() -> None:
    from agent_saga.controls.approvals._redis import RedisApprovalStore
    from agent_saga.controls.killswitch._redis import RedisSwitchStore
    from agent_saga.heartbeat._writer import HeartbeatWriter

    cluster = "redis+cluster://n1:7000"
    opens = {
        "RedisSwitchStore": lambda prefix: RedisSwitchStore(cluster, grace=0, prefix=prefix),
        "RedisApprovalStore": lambda prefix: RedisApprovalStore(cluster, prefix=prefix),
        "the agent heartbeat": lambda prefix: HeartbeatWriter(cluster, namespace="payments", agent="a",
                                                              state=lambda: None, prefix=prefix),  # type: ignore[arg-type,return-value]
    }
    for what, open_ in opens.items():
        with pytest.raises(ConfigurationError) as e:
            open_("agentsaga:v1")  # the default: no hash tag
        assert what in str(e.value) and "needs a hash tag" in str(e.value)
        assert "AGENT_SAGA_KEY_PREFIX" in str(e.value) and "{agentsaga}" in str(e.value)
        assert open_(PLANE).prefix == PLANE
    assert RedisSwitchStore("redis://h:6379/0", grace=0).prefix == "agentsaga:v1"  # one server: no tag needed
