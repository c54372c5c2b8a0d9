"""The PostgreSQL and Salesforce undo paths run on the event loop: no thread hop.

A rollback, a recovery sweep over an orphan and a reconciliation pass, against the real
PostgreSQL server and the protocol-level sObject REST server. Thread-pool submissions are
counted where they happen: the agent-saga tool pools (``ToolExecutor.submit``, the
daemon's own pool included) and the loop's default executor (a counting executor
installed with ``set_default_executor``, which ``asyncio.to_thread`` and
``run_in_executor(None, ...)`` use). The undo paths submit nothing that reaches a
connector; ``AGENT_SAGA_PG_DRIVER=thread`` shows the count seeing it when they do.
Then the failure paths on the same async path: a server that refuses the connection, and
an inverse that refuses to overwrite someone else's write.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from agent_saga import FileWAL, leases, saga_scope
from agent_saga.connectors import postgres as pg
from agent_saga.connectors import salesforce as sf
from agent_saga.connectors import set_credential_resolver
from agent_saga.errors import RollbackIncomplete
from agent_saga.executor import ToolExecutor
from agent_saga.recovery import RecoveryDaemon
from agent_saga.recovery.reconciliation import plan_checks, run_checks
from agent_saga.wal.readers import FileLogReader
from fixtures.salesforce_server import TOKEN, SalesforceServer

pytestmark = pytest.mark.integration

PG, SF = "orders_db", "sf_org"
PASSWORD = "hunter2-not-in-the-log"
OPP = "006000000000001"
FUTURE = lambda: time.time() + 3600  # noqa: E731 - a daemon clock past every lease
ALLOW = [f"* postgres.*,salesforce.* {PG},{SF}"]  # this log's writer holds both references


def _name(fn: Any) -> str:
    """``module.qualname`` of what a pool was handed (through partials and ``ctx.run``)."""
    while isinstance(fn, functools.partial):
        fn = fn.args[0] if getattr(fn.func, "__name__", "") == "run" and fn.args else fn.func
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


class Hops:
    """Every thread-pool submission while it is installed: ``(pool, function)``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[str, str]] = []
        real = ToolExecutor.submit

        def submit(pool: ToolExecutor, fn: Callable[..., Any], kwargs: Any) -> Any:
            self.seen.append(("tool pool", _name(fn)))
            return real(pool, fn, kwargs)

        monkeypatch.setattr(ToolExecutor, "submit", submit)
        hops = self

        class Counting(ThreadPoolExecutor):
            def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
                hops.seen.append(("default executor", _name(args[0] if _name(fn).endswith("Context.run") else fn)))
                return super().submit(fn, *args, **kwargs)

        self.default = Counting(max_workers=2)
        asyncio.get_running_loop().set_default_executor(self.default)

    def connector_hops(self) -> list[tuple[str, str]]:
        """The submissions that run connector or client code: what must be none."""
        return [s for s in self.seen if s[0] == "tool pool" or s[1].startswith(("agent_saga.connectors", "psycopg", "urllib"))]


@pytest.fixture
def systems(postgres_db: str, salesforce: SalesforceServer) -> Iterator[tuple[psycopg.Connection[Any], SalesforceServer, dict[str, Any]]]:
    """A table and an Opportunity; ``creds`` (mutable) is what the resolver answers."""
    salesforce.describe["Opportunity"] = {"Id": False, "StageName": True, "LastModifiedDate": False}
    salesforce.add("Opportunity", OPP, StageName="Prospecting")
    creds: dict[str, Any] = {
        PG: {"dsn": postgres_db.replace("postgres@", f"postgres:{PASSWORD}@")},
        SF: {"instance_url": salesforce.url, "access_token": TOKEN},
    }
    prev = set_credential_resolver(lambda ref: creds.get(ref))
    with psycopg.connect(postgres_db, autocommit=True) as db:
        db.execute("CREATE TABLE orders (tenant text, id int, status text, PRIMARY KEY (tenant, id))")
        db.execute("INSERT INTO orders VALUES ('t1', 7, 'open')")
        yield db, salesforce, creds
    set_credential_resolver(prev)


def status(db: psycopg.Connection[Any]) -> str:
    return str(db.execute("SELECT status FROM orders").fetchone()[0])  # type: ignore[index]


def stage(org: SalesforceServer) -> str:
    return str(org.records[("Opportunity", OPP)]["StageName"])


async def steps(saga: Any) -> None:
    await pg.update(saga, credential_ref=PG, table="orders", key={"tenant": "t1", "id": 7}, values={"status": "paid"})
    await sf.update(saga, credential_ref=SF, sobject="Opportunity", record_id=OPP, fields={"StageName": "Closed Won"})


async def orphan(wal_path: Path) -> None:
    """A saga that ran both steps and whose process "died": no rollback, no renewal."""
    wal = FileWAL(wal_path)
    scope = saga_scope(wal, saga_id="s1", lease_seconds=1)
    saga = await scope.__aenter__()
    await steps(saga)
    assert scope._lease is not None
    leases.unregister(scope._lease)
    await wal.barrier()
    wal.close()


def records(wal_path: Path) -> list[Any]:
    reader = FileLogReader(wal_path)
    try:
        return list(reader.records())
    finally:
        reader.close()


def dead_url() -> tuple[str, int]:
    """An address nothing listens on (a port just bound and released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return "127.0.0.1", s.getsockname()[1]


@pytest.mark.parametrize("driver", ["async", "thread"])
async def test_rollback_recovery_and_reconciliation_take_no_thread(
    systems: tuple[psycopg.Connection[Any], SalesforceServer, dict[str, Any]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch, driver: str,
) -> None:
    db, org, _ = systems
    monkeypatch.setenv("AGENT_SAGA_PG_DRIVER", driver)
    hops = Hops(monkeypatch)
    try:
        # 1. In-process: a step fails, both compensations run.
        wal = FileWAL(tmp_path / "agent.wal")
        with pytest.raises(RuntimeError, match="changed its mind"):
            async with saga_scope(wal) as saga:
                await steps(saga)
                assert (status(db), stage(org)) == ("paid", "Closed Won")
                raise RuntimeError("the model changed its mind")
        wal.close()
        assert saga.rollback_report is not None and saga.rollback_report.clean, saga.rollback_report
        assert (status(db), stage(org)) == ("open", "Prospecting")
        rolled_back = hops.connector_hops()

        # 2. After a crash: the daemon compensates the orphan.
        await orphan(tmp_path / "crashed.wal")
        before_recovery = len(hops.seen)
        assert (status(db), stage(org)) == ("paid", "Closed Won")
        daemon = RecoveryDaemon(str(tmp_path / "crashed.wal"), clock=FUTURE, lease_grace=0, allow=ALLOW)
        try:
            rep = await daemon.sweep()
        finally:
            await daemon.close()
        assert [(r.saga_id, r.status) for r in rep.results] == [("s1", "ROLLED_BACK")], rep
        assert (status(db), stage(org)) == ("open", "Prospecting")
        recovered = [h for h in hops.seen[before_recovery:] if h in hops.connector_hops()]

        # 3. Later: the reconcilers confirm both undos against the systems.
        before_reconcile = len(hops.seen)
        report = await run_checks(plan_checks(records(tmp_path / "crashed.wal")))
        assert report.summary().endswith("2 confirmed, 0 drift, 0 unverifiable - clean"), report.summary()
        reconciled = [h for h in hops.seen[before_reconcile:] if h in hops.connector_hops()]
    finally:
        hops.default.shutdown(wait=True)
    if driver == "async":
        assert (rolled_back, recovered, reconciled) == ([], [], []), hops.seen
    else:  # the PostgreSQL half on the pool, counted; Salesforce stays on the loop
        pg_on_pool = [("tool pool", "agent_saga.connectors.postgres._run")]
        assert rolled_back == [("tool pool", "agent_saga.connectors.postgres.update_row"), *pg_on_pool], rolled_back
        assert (recovered, reconciled) == (pg_on_pool, pg_on_pool), hops.seen
    assert PASSWORD not in (tmp_path / "agent.wal").read_text() + (tmp_path / "crashed.wal").read_text()


async def test_a_refused_connection_escalates_the_undo_and_leaves_the_reconciliation_unverifiable(
    systems: tuple[psycopg.Connection[Any], SalesforceServer, dict[str, Any]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db, org, creds = systems
    wal = FileWAL(tmp_path / "agent.wal")  # a saga rolled back while the systems answered
    with pytest.raises(RuntimeError, match="abort"):
        async with saga_scope(wal) as saga:
            await steps(saga)
            raise RuntimeError("abort")
    wal.close()
    await orphan(tmp_path / "crashed.wal")
    host, port = dead_url()
    creds[PG] = {"dsn": f"postgresql://postgres:{PASSWORD}@{host}:{port}/postgres"}
    creds[SF] = {"instance_url": f"http://{host}:{port}", "access_token": TOKEN}
    hops = Hops(monkeypatch)
    try:
        daemon = RecoveryDaemon(str(tmp_path / "crashed.wal"), clock=FUTURE, lease_grace=0, allow=ALLOW)
        try:
            rep = await daemon.sweep()
            escalations = await daemon.ledger.escalations()
        finally:
            await daemon.close()
        report = await run_checks(plan_checks(records(tmp_path / "agent.wal")))
    finally:
        hops.default.shutdown(wait=True)
    assert hops.connector_hops() == [], hops.seen
    [result] = rep.results
    assert result.status == "ROLLBACK_PARTIAL" and len(escalations) == 2, (result, escalations)
    escalated = " | ".join(e.reason for e in escalations)
    assert "Connection refused" in escalated and "Connect call failed" in escalated, escalated  # psycopg's, asyncio's
    assert (status(db), stage(org)) == ("paid", "Closed Won")  # nothing was undone: a human decides
    assert [f.verdict.value for f in report.findings] == ["UNVERIFIABLE", "UNVERIFIABLE"], report.findings
    reasons = " | ".join(f.message for f in report.findings)
    assert "raised OperationalError" in reasons and "raised ConnectionRefusedError" in reasons, reasons
    assert PASSWORD not in escalated + (tmp_path / "crashed.wal").read_text() + str(report.to_dict())


async def test_an_inverse_that_refuses_to_overwrite_escalates_on_the_async_path(
    systems: tuple[psycopg.Connection[Any], SalesforceServer, dict[str, Any]], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    db, org, _ = systems
    hops = Hops(monkeypatch)
    try:
        wal = FileWAL(tmp_path / "agent.wal")
        with pytest.raises(RollbackIncomplete) as partial:
            async with saga_scope(wal) as saga:
                await steps(saga)
                db.execute("UPDATE orders SET status = 'shipped'")  # another writer, after the step
                org.touch("Opportunity", OPP, StageName="Negotiation")  # another user's edit
                raise RuntimeError("abort")
        wal.close()
    finally:
        hops.default.shutdown(wait=True)
    assert hops.connector_hops() == [], hops.seen
    report = partial.value.report
    assert report is saga.rollback_report and not report.clean
    errors = sorted(str(s.error) for s in report.not_restored)
    assert len(errors) == 2 and "was modified after the step" in errors[0] and "changed by another writer" in errors[1], errors
    assert (status(db), stage(org)) == ("shipped", "Negotiation")  # neither write was overwritten


async def test_the_async_http_client_answers_as_the_blocking_one(salesforce: SalesforceServer) -> None:
    """Same answers and errors over ``arequest`` as over ``request``: JSON, an empty 204, a
    4xx naming the status (never the token), a refused connection."""
    from agent_saga.connectors._http import HTTPFailure, arequest, request

    salesforce.describe["Account"] = {"Name": True}
    salesforce.add("Account", "001000000000001", Name="Acme")
    base = f"{salesforce.url}/services/data/v60.0/sobjects/Account"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for call in (request, arequest):
        got = call("GET", f"{base}/001000000000001", headers=auth, query={"fields": "Name"})
        got = await got if asyncio.iscoroutine(got) else got
        assert got == {"attributes": {"type": "Account"}, "Name": "Acme"}
    assert await arequest("PATCH", f"{base}/001000000000001", headers=auth, json_body={"Name": "Acme 2"}) is None
    assert salesforce.records[("Account", "001000000000001")]["Name"] == "Acme 2"
    with pytest.raises(HTTPFailure, match="PATCH /services/data/v60.0/sobjects/Account/001000000000001 answered 400") as bad:
        await arequest("PATCH", f"{base}/001000000000001", headers=auth, json_body={"Id": "x"})
    assert bad.value.status == 400 and TOKEN not in str(bad.value)
    with pytest.raises(HTTPFailure, match="answered 401"):
        await arequest("GET", f"{base}/001000000000001", headers={"Authorization": "Bearer wrong"})
    host, port = dead_url()
    with pytest.raises(ConnectionRefusedError):
        await arequest("GET", f"http://{host}:{port}/x", headers=auth)


def test_asyncpg_named_as_the_driver_is_refused_naming_the_choices(monkeypatch: pytest.MonkeyPatch) -> None:
    """The connector speaks psycopg (async or sync): a pin to another client is refused
    with what to set, never silently taken."""
    from agent_saga.errors import ConfigurationError

    monkeypatch.setenv("AGENT_SAGA_PG_DRIVER", "asyncpg")
    with pytest.raises(ConfigurationError, match="must be 'async' or 'thread', got 'asyncpg': 'async' is psycopg's async API"):
        pg.driver()


async def test_behind_an_http_proxy_the_call_goes_through_urllib_which_honours_it(
    salesforce: SalesforceServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The async client does not tunnel: with ``http_proxy`` naming a proxy for the URL, the
    request goes through ``urllib`` on the tool pool, to the proxy. (The sObject server
    stands in for the proxy: it answers the absolute-URI request a proxy receives.)"""
    from agent_saga.connectors._http import arequest

    salesforce.describe["Account"] = {"Name": True}
    salesforce.add("Account", "001000000000001", Name="Acme")
    monkeypatch.setenv("http_proxy", salesforce.url)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    hops = Hops(monkeypatch)
    try:
        got = await arequest("GET", "http://crm.example.invalid/services/data/v60.0/sobjects/Account/001000000000001",
                             headers={"Authorization": f"Bearer {TOKEN}"}, query={"fields": "Name"})
    finally:
        hops.default.shutdown(wait=True)
    assert got == {"attributes": {"type": "Account"}, "Name": "Acme"}  # answered by way of the proxy
    assert [h[0] for h in hops.seen] == ["tool pool"], hops.seen
