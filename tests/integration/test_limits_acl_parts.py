"""A pod's agent credential cannot reset the fleet's limit windows: real redis-server 7,
users created exactly as ``agent-saga acl agent --agent <namespace>/<pod>`` prints them,
each pod debiting into its own part of the windows (``RedisLimitStore(part=...)``).

Rows: with one pod's credential, HDEL the window fields / ZREM the log members / DEL the
keys of another pod's part or of the shared keys (NOPERM), in a loop while two honest
pods spend against a 1,000 cap: they are authorised 1,000, not more. What the credential
may still do to its own part (reset it, write a negative or NaN total, add bogus parts to
the index) moves nobody else's accounting. Concurrent debits from several parts stay
atomic against one cap; the operator's usage sums every part and deletes the parts of pods
that went away once their windows are empty.
"""

from __future__ import annotations

import asyncio
import secrets
import shlex
from collections.abc import Iterator

import pytest
import redis
from agent_saga.cli import main
from agent_saga.controls import BudgetLimit, RedisLimitStore
from agent_saga.controls.limits import Charge
from agent_saga.controls.limits._redis import parts_bucket
from agent_saga.plane import preload_scripts
from fixtures.redis_server import KEY_PREFIX, RedisServer, client_for

LIM = "{agent-saga}:limits"
CAP = 1000.0


class Pods:
    """One ACL user per pod, as ``agent-saga acl agent --agent payments/<pod>`` prints it."""

    def __init__(self, server: RedisServer) -> None:
        self.server, self.names, self.password = server, [], secrets.token_hex(12)

    def url(self, pod: str, capsys: pytest.CaptureFixture[str]) -> str:
        name = f"{pod}-{secrets.token_hex(3)}"
        assert main(["acl", "agent", "--user", name, "--agent", f"payments/{pod}", "--key-prefix", KEY_PREFIX]) == 0
        admin = self.server.client()
        try:
            admin.execute_command(*shlex.split(capsys.readouterr().out))
            admin.execute_command("ACL", "SETUSER", name, f">{self.password}")
        finally:
            admin.close()
        self.names.append(name)
        return self.server.url.replace("://", f"://{name}:{self.password}@", 1)


@pytest.fixture
def pods(fresh_redis: RedisServer) -> Iterator[Pods]:
    admin = fresh_redis.client()
    preload_scripts(admin)  # the operator's job: agents may only EVALSHA
    p = Pods(fresh_redis)
    yield p
    for n in p.names:
        admin.execute_command("ACL", "DELUSER", n)
    admin.close()


def listed(admin: redis.Redis) -> set[str]:
    """The parts listed in every bucket in use and in the previous release's one set."""
    sets = [f"{LIM}:parts:{b.decode()}" for b in admin.smembers(f"{LIM}:buckets")] + [f"{LIM}:parts"]
    return {m.decode() for s in sets for m in admin.smembers(s)}


def spend(amount: float, window: float = 86_400) -> list[Charge]:
    return [Charge("daily", "*", amount, CAP, window)]


def reset_everything(attacker: redis.Redis) -> int:
    """Every reset the red team used, on every key of the limit store; how many Redis took."""
    took = 0
    keys = [k.decode() for k in attacker.scan_iter(match=f"{LIM}:*")]
    for key in keys:
        kind = attacker.type(key).decode()
        attempts = [lambda k=key: attacker.delete(k)]
        if kind == "hash":
            attempts += [lambda k=key, f=f: attacker.hdel(k, f) for f in attacker.hkeys(key)]
            attempts += [lambda k=key, f=f: attacker.hset(k, f, "0") for f in attacker.hkeys(key)]
        if kind == "zset":
            attempts += [lambda k=key, m=m: attacker.zrem(k, m) for m in attacker.zrange(key, 0, -1)]
            attempts += [lambda k=key: attacker.zremrangebyscore(k, "-inf", "+inf")]
        if kind == "set":
            attempts += [lambda k=key, m=m: attacker.srem(k, m) for m in attacker.smembers(key)]
        for attempt in attempts:
            try:
                attempt()
                took += 1
            except redis.exceptions.NoPermissionError:
                pass
    return took


@pytest.mark.single_redis("one server's ACL users")
async def test_a_pods_credential_cannot_reset_the_fleets_windows(
        pods: Pods, fresh_redis: RedisServer, capsys: pytest.CaptureFixture[str]) -> None:
    honest = [RedisLimitStore(pods.url(p, capsys), part=f"payments/{p}") for p in ("p-2", "p-3")]
    mine_url = pods.url("p-1", capsys)
    mine = RedisLimitStore(mine_url, part="payments/p-1")
    attacker = client_for(mine_url)
    assert (await mine.debit(spend(100), "own-1")).ok, "the attacker's own debits work"
    authorised = 0.0
    for i in range(32):  # 3,200 asked for against a 1,000 cap, a reset of everything between each
        for j, store in enumerate(honest):
            if (await store.debit(spend(100), f"d-{i}-{j}")).ok:
                authorised += 100
        reset_everything(attacker)
    # The attacker's own 100 went with its first reset (its own accounting: conceded).
    assert authorised == CAP, f"{authorised:g} authorised to the honest pods against a {CAP:g} cap"
    # Its own part is all it could touch: the resets of the others were refused, the windows hold.
    admin = fresh_redis.client()
    for p in ("p-2", "p-3"):
        assert admin.hget(f"{LIM}:part:payments/{p}:totals", "daily:*") is not None
    assert "payments/p-2" in listed(admin)
    # Writing nonsense into its own part: a negative, a NaN, an infinite "next" in its totals;
    # bogus parts in the index. Nobody else's accounting moves.
    for bad in ("-1e18", "nan", "-inf"):
        attacker.hset(f"{LIM}:part:payments/p-1:totals", mapping={"daily:*": bad, "@next": "1e300"})
        for index in (f"{LIM}:parts", f"{LIM}:parts:{parts_bucket('payments/p-1')}"):
            attacker.sadd(index, "payments/p-1", "x}:limits:totals", "../p-2", "payments/p-2")
        attacker.sadd(f"{LIM}:buckets", "x}:limits:totals", "../1", str(parts_bucket("payments/p-1")))
        refused = await honest[0].debit(spend(100), f"after-{bad}")
        assert not refused.ok and refused.used == (CAP,), refused
    for store in (*honest, mine):
        await store.aclose()
    attacker.close()
    admin.close()


async def test_concurrent_debits_from_several_parts_stay_atomic_against_one_cap(
        fresh_redis: RedisServer) -> None:
    stores = [RedisLimitStore(fresh_redis.url, part=f"payments/p-{i}") for i in range(4)]
    shared = RedisLimitStore(fresh_redis.url)  # a process without a part: the shared keys
    everyone = [*stores, shared]
    results = await asyncio.gather(*(s.debit(spend(10), f"c-{i}-{k}") for k in range(30)
                                     for i, s in enumerate(everyone)))
    assert sum(r.ok for r in results) == CAP / 10, "exactly the cap, over every part"
    spec = BudgetLimit("daily", arg="amount", max_total=CAP, window=86_400).spec()
    for s in everyone:
        (row,) = await s.usage([spec])
        assert (row.used, row.entries) == (CAP, CAP / 10), "every part's usage sums the fleet's"
    for s in everyone:
        await s.aclose()


async def test_the_operators_usage_deletes_the_parts_of_pods_that_went_away(fresh_redis: RedisServer) -> None:
    gone = RedisLimitStore(fresh_redis.url, part="payments/old-pod")
    stays = RedisLimitStore(fresh_redis.url, part="payments/new-pod")
    operator = RedisLimitStore(fresh_redis.url, compact=True)
    assert (await gone.debit(spend(100, window=0.2), "g-1")).ok
    assert (await stays.debit(spend(100), "s-1")).ok
    await gone.aclose()
    admin = fresh_redis.client()
    spec = BudgetLimit("daily", arg="amount", max_total=CAP, window=86_400).spec()

    deadline = asyncio.get_running_loop().time() + 30
    while True:  # poll: the old pod's part is deleted once its window is empty
        await operator.usage([spec])
        if listed(admin) == {"payments/new-pod"}:
            break
        assert asyncio.get_running_loop().time() < deadline, listed(admin)
        await asyncio.sleep(0.05)
    assert not admin.exists(f"{LIM}:part:payments/old-pod:totals", f"{LIM}:part:payments/old-pod:log")
    (row,) = await operator.usage([spec])
    assert row.used == 100
    for s in (stays, operator):
        await s.aclose()
    admin.close()


def test_a_part_name_that_could_reach_other_keys_is_refused() -> None:
    from agent_saga.errors import ConfigurationError

    for bad in ("", "payments/p-1:totals", "payments/*", "{other}", "a b"):
        with pytest.raises(ConfigurationError, match="part .* must be non-empty"):
            RedisLimitStore("redis://127.0.0.1:1/0", part=bad)


async def test_a_store_opened_from_a_url_with_a_part_debits_into_that_part(fresh_redis: RedisServer) -> None:
    from agent_saga.controls.limits import open_limit_store

    store = open_limit_store(f"{fresh_redis.url}?part=payments/p-9")
    assert isinstance(store, RedisLimitStore) and store.part == "payments/p-9"
    assert (await store.debit(spend(10), "u-1")).ok
    admin = fresh_redis.client()
    assert listed(admin) == {"payments/p-9"}
    assert float(admin.hget(f"{LIM}:part:payments/p-9:totals", "daily:*")) == 10
    await store.aclose()
    admin.close()
