"""The debugger over a RedisWAL (what `kubectl port-forward` to the policy plane gives):
two writers' chains on a real Redis, indexed through ``open_reader`` and served over HTTP
with a token."""

from __future__ import annotations

import http.client
import json
import threading
from typing import Any

import pytest
from agent_saga import saga_scope
from agent_saga.semantics import ActionSemantics
from agent_saga.ui import LogIndex, start
from agent_saga.wal.readers import open_reader
from agent_saga.wal.redis import RedisWAL
from fixtures.polling import until
from fixtures.redis_server import tagged

pytestmark = pytest.mark.integration
UI_WAL = tagged("ui:wal")


async def test_the_debugger_reads_a_fleet_log_from_redis(fresh_redis: Any) -> None:
    for writer in ("pod-a", "pod-b"):
        wal = RedisWAL(fresh_redis.url, key=UI_WAL, writer=writer)
        try:
            async with saga_scope(wal, saga_id=f"order-{writer}") as saga:
                await saga.execute("pay.charge", ActionSemantics.REVERSIBLE, lambda: None, policy_args={"amount": 7})
        finally:
            wal.close()
    reader = open_reader(f"{fresh_redis.url}?key={UI_WAL}")
    index = LogIndex(reader)
    server = start(index, "127.0.0.1", 0, token="tok")
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        def get(path: str, token: str | None = "tok") -> tuple[int, Any]:
            conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=10)
            try:
                conn.request("GET", path, headers={"Authorization": f"Bearer {token}"} if token else {})
                res = conn.getresponse()
                return res.status, json.loads(res.read())
            finally:
                conn.close()

        status = until("the index is built", lambda: (s := get("/api/status")[1])["indexed"] and s)
        assert status["verified"] and sorted(c["writer"] for c in status["chains"]) == ["pod-a", "pod-b"]
        assert get("/api/status", token=None)[0] == 401
        sagas = get("/api/sagas")[1]
        assert sorted(s["saga_id"] for s in sagas["sagas"]) == ["order-pod-a", "order-pod-b"]
        assert {s["status"] for s in sagas["sagas"]} == {"COMPLETED"}
        code, detail = get("/api/saga?id=order-pod-b")
        assert code == 200 and detail["steps"][0]["policy_args"] == {"amount": 7}
        assert detail["steps"][0]["outcome"] == "committed"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        reader.close()
