"""One harness per WAL backend for the contract suite: open the same log again, read one
writer's chain back raw, and tamper with stored records the way an attacker with write
access to the store would (bypassing the WAL)."""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from agent_saga import BaseWAL, FileWAL, verify_records
from agent_saga.chain import VerifyResult
from agent_saga.records import Record
from agent_saga.wal.file import iter_file_records
from fixtures.redis_server import client_for, tagged

WRITER = "w1"


class Harness:
    name = "?"

    def open(self, **kw: Any) -> BaseWAL:
        raise NotImplementedError

    def chain(self) -> list[tuple[str, Any]]:
        raise NotImplementedError

    def records(self) -> list[Record]:
        out = []
        for _loc, item in self.chain():
            assert not isinstance(item, Exception), item
            out.append(item)
        return out

    def verify(self) -> VerifyResult:
        return verify_records(iter(self.chain()))

    # Raw edits, by record seq.
    def alter_payload(self, seq: int, payload: dict[str, Any]) -> None:
        raise NotImplementedError

    def delete(self, seq: int) -> None:
        raise NotImplementedError

    def swap(self, a: int, b: int) -> None:
        raise NotImplementedError

    def corrupt(self, seq: int) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


def _seq(line: bytes) -> int | None:
    try:
        return int(json.loads(line)["seq"])
    except ValueError:
        return None


def _edit_line(line: bytes, fn: Callable[[dict[str, Any]], None]) -> bytes:
    d = json.loads(line)
    fn(d)
    return json.dumps(d, separators=(",", ":"), ensure_ascii=False).encode()


class FileHarness(Harness):
    name = "file"

    def __init__(self, tmp_path: Path) -> None:
        self.path = tmp_path / "contract.wal"

    def open(self, **kw: Any) -> BaseWAL:
        kw.pop("writer", None)
        return FileWAL(self.path, **kw)

    def chain(self) -> list[tuple[str, Any]]:
        return list(iter_file_records(self.path))

    def _lines(self) -> list[bytes]:
        return self.path.read_bytes().splitlines(keepends=True)

    def _index(self, lines: list[bytes], seq: int) -> int:
        return next(i for i, ln in enumerate(lines) if _seq(ln) == seq)

    def alter_payload(self, seq: int, payload: dict[str, Any]) -> None:
        lines = self._lines()
        i = self._index(lines, seq)
        lines[i] = _edit_line(lines[i], lambda d: d.update(payload=payload)) + b"\n"
        self.path.write_bytes(b"".join(lines))

    def delete(self, seq: int) -> None:
        lines = self._lines()
        del lines[self._index(lines, seq)]
        self.path.write_bytes(b"".join(lines))

    def swap(self, a: int, b: int) -> None:
        lines = self._lines()
        i, j = self._index(lines, a), self._index(lines, b)
        lines[i], lines[j] = lines[j], lines[i]
        self.path.write_bytes(b"".join(lines))

    def corrupt(self, seq: int) -> None:
        lines = self._lines()
        lines[self._index(lines, seq)] = b"{not json at all\n"
        self.path.write_bytes(b"".join(lines))


class RedisHarness(Harness):
    name = "redis"

    def __init__(self, server: Any) -> None:
        from agent_saga.wal.redis import RedisLog

        self.server = server
        self.key = tagged(f"t-{uuid.uuid4().hex[:8]}:wal")
        self.client = client_for(server.url)
        self.log = RedisLog(self.client, self.key, "test")
        self.stream = self.log.stream(WRITER)

    def open(self, **kw: Any) -> BaseWAL:
        from agent_saga.wal.redis import RedisWAL

        kw.setdefault("writer", WRITER)
        return RedisWAL(self.server.url, key=self.key, **kw)

    def chain(self) -> list[tuple[str, Any]]:
        return list(self.log.chain(WRITER))

    def _entries(self) -> list[tuple[bytes, bytes]]:
        return [(eid, f[b"r"]) for eid, f in self.client.xrange(self.stream)]

    def _rewrite(self, entries: list[tuple[bytes, bytes]]) -> None:
        pipe = self.client.pipeline(transaction=True)
        pipe.delete(self.stream)
        for eid, line in entries:
            pipe.xadd(self.stream, {"r": line}, id=eid)
        pipe.execute()

    def _index(self, entries: list[tuple[bytes, bytes]], seq: int) -> int:
        return next(i for i, (_e, ln) in enumerate(entries) if _seq(ln) == seq)

    def alter_payload(self, seq: int, payload: dict[str, Any]) -> None:
        e = self._entries()
        i = self._index(e, seq)
        e[i] = (e[i][0], _edit_line(e[i][1], lambda d: d.update(payload=payload)))
        self._rewrite(e)

    def delete(self, seq: int) -> None:
        e = self._entries()
        self.client.xdel(self.stream, e[self._index(e, seq)][0])

    def swap(self, a: int, b: int) -> None:
        e = self._entries()
        i, j = self._index(e, a), self._index(e, b)
        e[i], e[j] = (e[i][0], e[j][1]), (e[j][0], e[i][1])
        self._rewrite(e)

    def corrupt(self, seq: int) -> None:
        e = self._entries()
        i = self._index(e, seq)
        e[i] = (e[i][0], b"{not json at all")
        self._rewrite(e)

    def close(self) -> None:
        self.client.close()


class PostgresHarness(Harness):
    name = "postgres"

    def __init__(self, dsn: str) -> None:
        import psycopg
        from agent_saga.wal.postgres import PostgresLog

        self.dsn = dsn
        self.conn = psycopg.connect(dsn, autocommit=True)
        self.log = PostgresLog(lambda: contextlib.nullcontext(self.conn), "saga_wal", "test")

    def open(self, **kw: Any) -> BaseWAL:
        from agent_saga.wal.postgres import PostgresWAL

        kw.setdefault("writer", WRITER)
        return PostgresWAL(self.dsn, **kw)

    def chain(self) -> list[tuple[str, Any]]:
        return list(self.log.chain(WRITER))

    def alter_payload(self, seq: int, payload: dict[str, Any]) -> None:
        from agent_saga.records import canonical_json

        self.conn.execute(
            "UPDATE saga_wal SET payload = %s WHERE writer = %s AND seq = %s",
            (canonical_json(payload), WRITER, seq),
        )

    def delete(self, seq: int) -> None:
        self.conn.execute("DELETE FROM saga_wal WHERE writer = %s AND seq = %s", (WRITER, seq))

    def swap(self, a: int, b: int) -> None:
        # Exchange the two records' places in the chain (their content, under each other's seq).
        with self.conn.transaction():
            self.conn.execute("UPDATE saga_wal SET seq = -1 WHERE writer = %s AND seq = %s", (WRITER, a))
            self.conn.execute("UPDATE saga_wal SET seq = %s WHERE writer = %s AND seq = %s", (a, WRITER, b))
            self.conn.execute("UPDATE saga_wal SET seq = %s WHERE writer = %s AND seq = -1", (b, WRITER))

    def corrupt(self, seq: int) -> None:
        self.conn.execute(
            "UPDATE saga_wal SET payload = '{not json at all' WHERE writer = %s AND seq = %s", (WRITER, seq)
        )

    def close(self) -> None:
        self.conn.close()


class PostgresAsyncHarness(PostgresHarness):
    """The same table, written by SinkWAL through psycopg's asynchronous connection."""

    name = "postgres-async"

    def open(self, **kw: Any) -> BaseWAL:
        from agent_saga.wal import PostgresAsyncSink, SinkWAL

        kw.setdefault("writer", WRITER)
        return SinkWAL(PostgresAsyncSink(self.dsn), **kw)


@contextlib.contextmanager
def harness_for(name: str, request: Any, tmp_path: Path) -> Iterator[Harness]:
    h: Harness
    if name == "file":
        h = FileHarness(tmp_path)
    elif name == "redis":
        h = RedisHarness(request.getfixturevalue("fresh_redis"))
    elif name == "postgres-async":
        h = PostgresAsyncHarness(request.getfixturevalue("postgres_db"))
    else:
        h = PostgresHarness(request.getfixturevalue("postgres_db"))
    try:
        yield h
    finally:
        h.close()
