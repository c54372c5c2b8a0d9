"""No policy-plane credential reaches another client's connection, and a halt gets through
a storm of killed connections. Real redis-server 7, users created exactly as
``agent-saga acl ROLE`` prints them.

Rows: with any role's credential, ``CLIENT PAUSE ... WRITE`` (every write of the fleet,
the halt included, waits: the fleet fails closed), ``CLIENT PAUSE <a year> ALL`` (every
user frozen, the admin too), ``CLIENT KILL USER <approver|operator>`` in a loop (halts
lost), ``CLIENT LIST`` (every client's address and name), ``CLIENT NO-EVICT``,
``UNBLOCK``, ``UNPAUSE`` and ``TRACKING ... REDIRECT`` (messages into another connection)
are refused with NOPERM. A second client with the admin's rights killing the approver's
(or the operator's) connections while a write waits: ``agent-saga halt`` and the
operator's KillSwitch projection send the write again and say so; it lands.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from agent_saga.controls import Lever, RedisSwitchStore
from agent_saga.plane import preload_scripts
from fixtures.polling import until
from fixtures.redis_server import KEY_PREFIX, PLANE_ENV, RedisServer, client_for
from fixtures.redis_server import PLANE_PREFIX as P

pytestmark = pytest.mark.single_redis("one server's ACL users, CLIENT PAUSE and CLIENT KILL")
ROOT = Path(__file__).resolve().parents[2]
ROLES = ("agent", "approver", "operator")


class Users:
    """ACL users made from what ``agent-saga acl ROLE`` prints, deleted afterwards."""

    def __init__(self, server: RedisServer) -> None:
        self.server, self.names, self.password = server, [], secrets.token_hex(12)

    def make(self, role: str) -> tuple[str, str]:
        """(user name, URL with its password)."""
        name = f"{role}-{secrets.token_hex(3)}"
        argv = shlex.split(cli_out("acl", role, "--user", name, "--key-prefix", KEY_PREFIX))
        admin = self.server.client()
        try:
            admin.execute_command(*argv)
            admin.execute_command("ACL", "SETUSER", name, f">{self.password}")
        finally:
            admin.close()
        self.names.append(name)
        return name, self.server.url.replace("://", f"://{name}:{self.password}@", 1)


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    return {**env, "PYTHONPATH": str(ROOT / "runtime"), **PLANE_ENV, **extra}


def cli_out(*args: str) -> str:
    out = subprocess.run([sys.executable, "-m", "agent_saga.cli", *args], capture_output=True, text=True,
                         timeout=60, env=cli_env(), check=True)
    return out.stdout


@pytest.fixture
def users(fresh_redis: RedisServer) -> Iterator[Users]:
    u = Users(fresh_redis)
    yield u
    admin = fresh_redis.client()
    admin.execute_command("CLIENT", "UNPAUSE")
    for n in u.names:
        admin.execute_command("ACL", "DELUSER", n)
    admin.close()


def attacks(victim_id: int) -> list[tuple[str, ...]]:
    """What a credential could do to other clients with ``+@connection``."""
    return [("CLIENT", "PAUSE", "5000", "WRITE"), ("CLIENT", "PAUSE", str(365 * 86_400_000), "ALL"),
            ("CLIENT", "KILL", "ID", str(victim_id)), ("CLIENT", "KILL", "USER", "default"),
            ("CLIENT", "KILL", "ADDR", "127.0.0.1:1"), ("CLIENT", "LIST"), ("CLIENT", "UNPAUSE"),
            ("CLIENT", "NO-EVICT", "on"), ("CLIENT", "UNBLOCK", str(victim_id)),
            ("CLIENT", "TRACKING", "on", "REDIRECT", str(victim_id), "BCAST")]


@pytest.mark.parametrize("role", ROLES)
def test_no_role_reaches_another_clients_connection(users: Users, fresh_redis: RedisServer, role: str) -> None:
    _, url = users.make(role)
    victim = fresh_redis.client(single_connection_client=True)  # the admin, mid-session
    victim_id = int(victim.client_id())
    mine = client_for(url)
    try:
        for cmd in attacks(victim_id):
            with pytest.raises(redis.exceptions.NoPermissionError):
                mine.execute_command(*cmd)
        # Its own connection still works: the handshake, its id and name, a read.
        assert mine.ping() and int(mine.client_id()) != victim_id
        mine.client_setname(f"{role}-1")
        assert mine.client_getname() in (f"{role}-1", f"{role}-1".encode())
        assert mine.get(f"{P}:rev") is None
        assert victim.ping(), "the admin's connection was neither killed nor paused"
        (me,) = [c for c in victim.client_list() if c["name"] == f"{role}-1"]
        assert me["flags"] == "N", me
    finally:
        mine.close()
        victim.close()


def test_an_agent_cannot_pause_writes_so_a_halt_goes_through(users: Users, fresh_redis: RedisServer) -> None:
    preload_scripts(fresh_redis.client())
    _, agent_url = users.make("agent")
    _, approver_url = users.make("approver")
    agent = client_for(agent_url)
    with pytest.raises(redis.exceptions.NoPermissionError):
        agent.execute_command("CLIENT", "PAUSE", str(3600 * 1000), "WRITE")
    agent.close()
    out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "halt", "--reason", "fraud", "--by", "soc@corp"],
                         capture_output=True, text=True, timeout=60,
                         env=cli_env(AGENT_SAGA_SWITCH_STORE=approver_url, AGENT_SAGA_SWITCH_GRACE="0"))
    assert out.returncode == 0, out.stderr
    assert fresh_redis.client().scard(f"{P}:killswitch:index") == 1


class Storm:
    """A second client, with the admin's rights (no role may): it pauses every write, then
    kills each connection of ``user`` whose write is waiting, ``kills`` times, then lets
    writes through. Each killed connection is one attempt whose reply was lost."""

    def __init__(self, server: RedisServer, user: str, kills: int) -> None:
        self.server, self.user, self.kills, self.killed = server, user, kills, 0
        self.error: BaseException | None = None
        self.admin = server.client()
        self.admin.execute_command("CLIENT", "PAUSE", "60000", "WRITE")
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _waiting(self) -> list[int]:
        return [int(c["id"]) for c in self.admin.client_list()
                if c["user"] == self.user and "b" in c["flags"] and c["cmd"] == "evalsha"]

    def _run(self) -> None:
        try:
            while self.killed < self.kills:
                (victim, *_) = until(f"a waiting write of {self.user}", self._waiting, timeout=30, interval=0.005)
                self.admin.client_kill_filter(_id=victim)
                self.killed += 1
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc
        finally:
            self.admin.execute_command("CLIENT", "UNPAUSE")

    def join(self) -> None:
        self.thread.join(timeout=60)
        self.admin.close()
        if self.error is not None:
            raise self.error
        assert self.killed == self.kills


def test_a_halt_lands_through_a_storm_of_killed_connections_and_says_so(
        users: Users, fresh_redis: RedisServer) -> None:
    preload_scripts(fresh_redis.client())
    name, approver_url = users.make("approver")
    storm = Storm(fresh_redis, name, kills=3)
    out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "halt", "--scope", "tool:wire.*", "--reason",
                          "fraud pattern", "--by", "soc@corp"], capture_output=True, text=True, timeout=60,
                         env=cli_env(AGENT_SAGA_SWITCH_STORE=approver_url, AGENT_SAGA_SWITCH_GRACE="0"))
    storm.join()
    assert out.returncode == 0, out.stderr
    assert "landed after 4 attempts: the connection was lost 3 time(s)" in out.stdout, out.stdout
    admin = fresh_redis.client()
    (lever_id,) = admin.smembers(f"{P}:killswitch:index")
    assert b"fraud pattern" in admin.get(f"{P}:killswitch:{lever_id.decode()}")
    assert admin.get(f"{P}:rev") == b"1", "one change, counted once"
    # Lifting it through the next storm: the same.
    storm = Storm(fresh_redis, name, kills=2)
    out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "resume", "--scope", "tool:wire.*", "--by",
                          "soc@corp"], capture_output=True, text=True, timeout=60,
                         env=cli_env(AGENT_SAGA_SWITCH_STORE=approver_url, AGENT_SAGA_SWITCH_GRACE="0"))
    storm.join()
    assert out.returncode == 0, out.stderr
    # The kills hit the read before the lift (a script: paused with the writes).
    assert "read the levers after 3 attempts" in out.stdout and "lifted HALT tool:wire.*" in out.stdout, out.stdout
    assert admin.scard(f"{P}:killswitch:index") == 0
    admin.close()


def test_a_halt_whose_every_attempt_is_lost_exits_non_zero_saying_it_may_have_landed(
        users: Users, fresh_redis: RedisServer) -> None:
    preload_scripts(fresh_redis.client())
    name, approver_url = users.make("approver")
    storm = Storm(fresh_redis, name, kills=6)  # the first attempt and its 5 repeats
    out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "halt", "--reason", "fraud", "--by", "soc@corp"],
                         capture_output=True, text=True, timeout=60,
                         env=cli_env(AGENT_SAGA_SWITCH_STORE=approver_url, AGENT_SAGA_SWITCH_GRACE="0"))
    storm.join()
    assert out.returncode == 2, out.stdout
    assert "6 attempt(s)" in out.stderr and "it may have been written" in out.stderr, out.stderr
    assert "agent-saga status" in out.stderr and approver_url.split("@")[0].split(":")[-1] not in out.stderr


def test_a_lever_written_twice_is_one_change(fresh_redis: RedisServer) -> None:
    """What makes a write safe to repeat: the second write of the same lever (its first
    attempt landed, the reply was lost) changes nothing and notifies nobody."""
    store = RedisSwitchStore(fresh_redis.url, grace=0, prefix=P)
    admin = fresh_redis.client()
    sub = admin.pubsub()
    sub.subscribe(f"{P}:events")
    until("subscribed", lambda: sub.get_message(timeout=0.1))
    lever = Lever.new("Halt", "global", reason="incident", by="soc@corp", now=time.time())
    store.engage(lever)
    store.engage(lever)
    assert admin.get(f"{P}:rev") == b"1"
    assert store.lift(lever.id) is not None and store.lift(lever.id) is None
    assert admin.get(f"{P}:rev") == b"2"
    notes = [m for m in iter(lambda: sub.get_message(timeout=0.2), None) if m["type"] == "message"]
    assert len(notes) == 2, notes
    sub.close()
    store.close()
    admin.close()


async def test_the_operator_projects_a_killswitch_through_a_storm_and_logs_it(
        users: Users, fresh_redis: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    from agent_saga_operator.projection import Projector

    name, url = users.make("operator")
    projector = Projector(url, prefix=KEY_PREFIX)
    await projector.ping()
    caplog.set_level(logging.WARNING, logger="agent_saga_operator.projection")
    storm = await asyncio.to_thread(Storm, fresh_redis, name, 3)
    rev = await projector.put("KillSwitch", "payments/stop-wires", {"v": 1, "kind": "KillSwitch", "action": "Halt"})
    await asyncio.to_thread(storm.join)
    await projector.aclose()
    assert rev == 1
    assert fresh_redis.client().get(f"{P}:killswitch:payments/stop-wires") is not None
    said = [r.getMessage() for r in caplog.records]
    assert sum("lost its reply" in m for m in said) == 3, said
    assert any("landed after 4 attempts" in m for m in said), said
