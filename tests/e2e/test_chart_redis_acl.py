"""The in-chart Redis's ACL users, exactly as the chart configures them: ``helm template``
renders the Redis container's start script, the script writes its config file (the
passwords from the environment, as the pod gets them from its Secret), and a real
redis-server loads that file. With the chart's agent and approver credentials every
attack on other clients' connections is refused with NOPERM (CLIENT PAUSE WRITE / ALL,
KILL, LIST, UNPAUSE, NO-EVICT, UNBLOCK, TRACKING REDIRECT), the admin's connection is
untouched, and the legitimate flows work: the approver's ``agent-saga halt``, an agent
reading it."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from agent_saga.controls import RedisSwitchStore
from agent_saga.plane import preload_scripts
from chart_helpers import CHART, Helm, env_of, one
from fixtures.binaries import REPO_ROOT
from fixtures.redis_server import RedisServer

PASSWORDS = {"REDIS_PASSWORD": secrets.token_hex(12), "AGENT_PASSWORD": secrets.token_hex(12),
             "APPROVER_PASSWORD": secrets.token_hex(12)}
USERS = {"agent": ("agent-saga-agent", "AGENT_PASSWORD"), "approver": ("agent-saga-approver", "APPROVER_PASSWORD")}


class ChartRedis(RedisServer):
    """A redis-server started on the chart's config file (its default user has a password)."""

    def __init__(self, conf: Path, workdir: Path) -> None:
        super().__init__(workdir, extra_args=["--include", str(conf)])

    def client(self, **kw: object) -> redis.Redis:
        return redis.Redis(port=self.port, password=PASSWORDS["REDIS_PASSWORD"], socket_timeout=5, **kw)  # type: ignore[arg-type]

    def ping(self) -> bool:
        try:
            c = self.client()
            try:
                return bool(c.ping())
            finally:
                c.close()
        except (redis.RedisError, OSError):
            return False

    def url_of(self, role: str) -> str:
        user, secret = USERS[role]
        return f"redis://{user}:{PASSWORDS[secret]}@127.0.0.1:{self.port}/0"


@pytest.fixture(scope="module")
def chart_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ChartRedis]:
    tmp = tmp_path_factory.mktemp("chart-redis")
    objs = Helm(tmp / "helm").render(values=[CHART / "ci" / "inchart-redis-values.yaml"])
    (container,) = one(objs, "Deployment", "redis")["spec"]["template"]["spec"]["containers"]
    assert set(PASSWORDS) <= set(env_of(container)), "the script's passwords come from the pod's environment"
    start = container["args"][0]
    # The script up to its exec, writing the config where this test can read it.
    head, sep, tail = start.partition("exec redis-server /tmp/redis.conf")
    assert sep, start
    conf = tmp / "redis.conf"
    env = {"PATH": os.environ.get("PATH", ""), **PASSWORDS}
    subprocess.run(["sh", "-c", head.replace("/tmp/redis.conf", str(conf))], env=env, check=True, timeout=30)
    assert {line.split()[1] for line in conf.read_text().splitlines() if line.startswith("user ")} == \
        {u for u, _ in USERS.values()}
    server = ChartRedis(conf, tmp / "data").start()
    yield server
    server.close()


@pytest.mark.parametrize("role", sorted(USERS))
def test_the_charts_credentials_reach_no_other_connection(chart_redis: ChartRedis, role: str) -> None:
    admin = chart_redis.client(single_connection_client=True)
    admin_id = int(admin.client_id())
    mine = redis.Redis.from_url(chart_redis.url_of(role), socket_timeout=5)
    try:
        for cmd in (("CLIENT", "PAUSE", "5000", "WRITE"), ("CLIENT", "PAUSE", str(365 * 86_400_000), "ALL"),
                    ("CLIENT", "KILL", "ID", str(admin_id)), ("CLIENT", "KILL", "USER", "default"),
                    ("CLIENT", "KILL", "USER", USERS["approver"][0]), ("CLIENT", "LIST"), ("CLIENT", "UNPAUSE"),
                    ("CLIENT", "NO-EVICT", "on"), ("CLIENT", "UNBLOCK", str(admin_id)),
                    ("CLIENT", "TRACKING", "on", "REDIRECT", str(admin_id), "BCAST")):
            with pytest.raises(redis.exceptions.NoPermissionError):
                mine.execute_command(*cmd)
        assert mine.ping() and int(mine.client_id()) != admin_id
        assert admin.ping(), "the admin's connection was neither killed nor paused"
        assert all("b" not in c["flags"] for c in admin.client_list())
    finally:
        mine.close()
        admin.close()


def test_with_the_charts_credentials_a_halt_is_pulled_and_obeyed(chart_redis: ChartRedis) -> None:
    admin = chart_redis.client()
    preload_scripts(admin)  # the operator (the default user) does this at startup
    env = {k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")}
    env.update({"PYTHONPATH": str(REPO_ROOT / "runtime"), "AGENT_SAGA_SWITCH_STORE": chart_redis.url_of("approver"),
                "AGENT_SAGA_SWITCH_GRACE": "0"})
    out = subprocess.run([sys.executable, "-m", "agent_saga.cli", "halt", "--scope", "tool:wire.*", "--reason",
                          "fraud", "--by", "soc@corp"], capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0, out.stderr
    store = RedisSwitchStore(chart_redis.url_of("agent"), grace=0)  # an agent reads it with its own credential
    try:
        (lever,) = store.levers()
        assert lever.scope == "tool:wire.*" and lever.reason == "fraud"
    finally:
        store.close()
        admin.close()
