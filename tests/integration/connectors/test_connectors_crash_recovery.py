"""End to end: a worker SIGKILLed after a Stripe charge and a PostgreSQL update; recovery (a
separate process) compensates both; `agent-saga reconcile` confirms it against the
systems of record (exit 0), and reports drift injected at the provider (exit 1)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest
from fixtures.cli import cli_module
from fixtures.polling import until
from fixtures.stripe_servers import API_KEY, StripeLedger

pytestmark = [pytest.mark.integration, pytest.mark.crash]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
IMPORTS = ["--import", "e2e_credentials", "--import", "agent_saga.connectors.stripe", "--import", "agent_saga.connectors.postgres"]


def env(stripe_url: str, dsn: str) -> dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT / "runtime")])
    e.update(E2E_STRIPE_URL=stripe_url, E2E_STRIPE_KEY=API_KEY, E2E_PG_DSN=dsn)
    return e


def cli(e: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return cli_module(*argv, env=e, timeout=120)


def test_sigkill_after_charge_and_update_is_recovered_and_reconciles(
    stripe_ledger: StripeLedger, postgres_db: str, tmp_path: Path
) -> None:
    with psycopg.connect(postgres_db, autocommit=True) as db:
        db.execute("CREATE TABLE orders (tenant text, id int, status text, PRIMARY KEY (tenant, id))")
        db.execute("INSERT INTO orders VALUES ('t1', 7, 'open')")
        e = env(stripe_ledger.url, postgres_db)
        wal, ready = tmp_path / "agent.wal", tmp_path / "ready"
        worker = subprocess.Popen([sys.executable, str(HERE / "connector_worker.py"), str(wal), str(ready)],
                                  env=e, stderr=subprocess.PIPE, text=True)
        until("the worker's charge and update", ready.exists, proc=worker)
        worker.send_signal(signal.SIGKILL)
        worker.communicate(timeout=30)  # reaps it and closes its stderr pipe
        charge_id = ready.read_text()
        assert stripe_ledger.charges[charge_id]["refunded"] is False
        assert db.execute("SELECT status FROM orders").fetchone() == ("paid",)

        def recovered() -> dict[str, object] | None:
            # The allow-list grants this log's writer the two handlers with the worker's
            # credential references (without one, recovery uses no credential reference).
            r = cli(e, "recover", "--wal-path", str(wal), "--lease-grace", "0", "--json", *IMPORTS,
                    "--allow", "* stripe.*,postgres.* stripe_test,orders_db")
            assert r.returncode in (0, 1), r.stderr
            doc = json.loads(r.stdout)
            return doc if doc.get("recovered") else None

        doc = until("recovery to take the orphan over (its lease is 1s)", recovered, interval=0.2)
        assert doc["recovered"] == 1 and doc["escalations"] == 0, doc
        assert stripe_ledger.charges[charge_id]["refunded"] is True
        assert db.execute("SELECT status FROM orders").fetchone() == ("open",)

        r = cli(e, "reconcile", "--wal-path", str(wal), *IMPORTS)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "2 effect(s) checked: 2 confirmed, 0 drift, 0 unverifiable - clean" in r.stdout

        stripe_ledger.unrefund(charge_id)  # the provider voided the refund after the 200
        db.execute("UPDATE orders SET status = 'paid'")  # and a job re-applied the update
        r = cli(e, "reconcile", "--wal-path", str(wal), "--json", *IMPORTS)
        assert r.returncode == 1, r.stdout + r.stderr
        found = {(f["tool"], f["verdict"]) for f in json.loads(r.stdout)["findings"]}
        assert found == {("stripe.charge", "DRIFT"), ("postgres.update", "DRIFT")}
    assert API_KEY not in wal.read_text()
