"""RedisLog reads a page of the merged log with one small script (``RedisLog.PAGE``), on a
real redis-server: the records are exactly those XRANGE gives, an entry not as a writer
wrote it is judged as XRANGE's reader judges it, and a server that refuses scripts is
read with XRANGE."""

from __future__ import annotations

import urllib.parse
import uuid
from typing import Any

import pytest
from agent_saga import WALCorrupt
from agent_saga.wal.redis import RedisLog, RedisWAL
from fixtures.redis_server import CLUSTER, client_for, tagged

pytestmark = pytest.mark.skipif(CLUSTER, reason="a cluster's pages are read with XRANGE (no script)")


def new_key() -> str:
    return tagged(f"t-{uuid.uuid4().hex[:8]}:wal")


def write(url: str, key: str, n: int) -> None:
    wals = [RedisWAL(url, key=key, writer=f"w-{i}") for i in range(2)]
    for k in range(n):
        wals[k % 2].append("STEP_COMMITTED", f"s-{k}", None, {"k": k, "text": "a\nb é"})
    for wal in wals:
        wal.barrier_sync(timeout=30)
        wal.close()


def read(client: Any, key: str, *, script: bool, page_size: int = 7) -> tuple[list[Any], bool]:
    log = RedisLog(client, key, "test")
    log.page_script = script
    records = [r for page in log.pages_since(0, page_size=page_size) for r in page]
    return records, log.page_script


def outcome(client: Any, key: str, *, script: bool) -> str:
    try:
        read(client, key, script=script)
    except WALCorrupt as exc:
        return f"WALCorrupt {exc.location}: {exc}"
    return "read"


def test_pages_by_script_are_the_records_xrange_reads(fresh_redis: Any) -> None:
    key = new_key()
    write(fresh_redis.url, key, 40)
    client = fresh_redis.client()
    try:
        by_script, still = read(client, key, script=True)
        by_xrange, _ = read(client, key, script=False)
    finally:
        client.close()
    assert still  # the server ran the script
    assert len(by_script) == 40
    assert by_script == by_xrange
    assert [r.extra for r in by_script] == [r.extra for r in by_xrange]
    assert [r.extra["gseq"] for r in by_script] == list(range(1, 41))


@pytest.mark.parametrize("fields", [
    {"x": "1"},  # no record field
    {"r": "not json"},  # an undecodable line
    {"r": ""},  # an empty line
    {"r": '{"v":1}', "x": "1"},  # a second field
])
def test_an_entry_not_as_written_is_judged_as_xrange_judges_it(fresh_redis: Any, fields: dict[str, str]) -> None:
    key = new_key()
    write(fresh_redis.url, key, 4)
    client = fresh_redis.client()
    try:
        g = client.incrby(f"{key}:gseq", 1)
        client.xadd(f"{key}:w:w-1", fields, id=f"{g}-0")
        by_script = outcome(client, key, script=True)
        by_xrange = outcome(client, key, script=False)
    finally:
        client.close()
    assert by_script.startswith("WALCorrupt") and f"entry {g}-0" in by_script
    assert by_script == by_xrange


def test_an_entry_with_an_extra_field_reads_as_with_xrange(fresh_redis: Any) -> None:
    key = new_key()
    write(fresh_redis.url, key, 4)
    client = fresh_redis.client()
    try:
        line = client.xrange(f"{key}:w:w-1", count=1)[0][1][b"r"]
        g = client.incrby(f"{key}:gseq", 1)
        client.xadd(f"{key}:w:w-1", {"r": line, "note": "x"}, id=f"{g}-0")
        by_script, _ = read(client, key, script=True)
        by_xrange, _ = read(client, key, script=False)
    finally:
        client.close()
    assert len(by_script) == 5 and by_script == by_xrange


def test_a_server_that_refuses_scripts_is_read_with_xrange(fresh_redis: Any) -> None:
    key = new_key()
    write(fresh_redis.url, key, 20)
    admin = fresh_redis.client()
    user = f"reader-{uuid.uuid4().hex[:6]}"
    admin.acl_setuser(user, enabled=True, passwords=["+pw"], keys=["*"], commands=["+@all", "-@scripting"])
    parts = urllib.parse.urlsplit(fresh_redis.url)
    reader = client_for(parts._replace(netloc=f"{user}:pw@{parts.hostname}:{parts.port}").geturl())
    try:
        refused, on = read(reader, key, script=True)
        expected, _ = read(admin, key, script=False)
    finally:
        reader.close()
        admin.acl_deluser(user)
        admin.close()
    assert not on  # it reads with XRANGE from now on
    assert refused == expected and len(refused) == 20
