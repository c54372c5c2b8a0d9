"""The Stripe connector: conformance against stripe-mock, behaviour against a stateful ledger.

stripe-mock (Stripe's OpenAPI spec, built from github.com/stripe/stripe-mock) proves each
call the connector makes is one Stripe accepts and that the connector reads Stripe's
answers; it keeps no state. The stateful ``StripeLedger`` (tests/fixtures/stripe_servers.py)
proves the logic: idempotency, ``charge_already_refunded``, and the drift reconciliation
must catch (a refund acknowledged but not applied, a partial refund, a timed-out charge
that landed). Both are driven through the connector's own HTTP client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_saga import FileWAL, RollbackIncomplete, saga_scope
from agent_saga.cli import main
from agent_saga.connectors import set_credential_resolver, stripe
from agent_saga.connectors._http import HTTPFailure
from fixtures.stripe_servers import API_KEY, StripeLedger, StripeMock

pytestmark = pytest.mark.integration

REF = "stripe_test"


def use(url: str) -> Iterator[None]:
    prev = set_credential_resolver(lambda ref: {"api_key": API_KEY, "api_base": url} if ref == REF else None)
    yield
    set_credential_resolver(prev)


@pytest.fixture
def mock(stripe_mock: StripeMock) -> Iterator[StripeMock]:
    yield from (stripe_mock for _ in use(stripe_mock.url))


@pytest.fixture
def ledger(stripe_ledger: StripeLedger) -> Iterator[StripeLedger]:
    yield from (stripe_ledger for _ in use(stripe_ledger.url))


# ------------------------------------------------------------------ conformance (stripe-mock)
def test_every_call_the_connector_makes_is_one_stripe_accepts(mock: StripeMock) -> None:
    c = stripe.create_charge(amount=4200, currency="usd", customer="cus_1", description="order 7",
                             credential_ref=REF, idempotency_key="k" * 64)
    assert c["id"].startswith("ch_") and isinstance(c["amount"], int) and c["status"] == "succeeded"
    assert set(c) == {"id", "amount", "amount_refunded", "currency", "refunded", "status"}
    assert stripe.refund(charge_id=c["id"], credential_ref=REF, idempotency_key="r" * 64) == "succeeded"
    assert stripe.refund(charge_id=c["id"], credential_ref=REF, idempotency_key="p" * 64, amount=100) == "succeeded"
    obs = stripe.observe_refund(charge_id=c["id"], credential_ref=REF)
    assert obs.exists is True and obs.reversed_ is False  # stateless: its fixture charge is never refunded
    seen = stripe.observe_charge(credential_ref=REF, idempotency_key="k" * 64, customer="cus_1")
    assert seen.exists is False  # the list call is accepted; its fixture carries no agent-saga key


def test_stripe_mock_rejects_what_stripe_would_so_conformance_means_something(mock: StripeMock) -> None:
    with pytest.raises(HTTPFailure, match="answered 400") as exc:
        stripe._call(REF, "POST", "/v1/refunds", form={"charge": "ch_1", "not_a_parameter": "1"})
    assert API_KEY not in str(exc.value)


# ------------------------------------------------------------------ behaviour (stateful ledger)
def test_the_forward_key_makes_a_charge_happen_once(ledger: StripeLedger) -> None:
    a = stripe.create_charge(amount=4200, currency="usd", credential_ref=REF, idempotency_key="k1")
    b = stripe.create_charge(amount=4200, currency="usd", credential_ref=REF, idempotency_key="k1")
    assert a["id"] == b["id"] and len(ledger.charges) == 1
    assert ledger.charges[a["id"]]["metadata"] == {"agent_saga_key": "k1"}


def test_charge_already_refunded_is_success_for_a_late_daemon(ledger: StripeLedger) -> None:
    c = stripe.create_charge(amount=4200, currency="usd", credential_ref=REF, idempotency_key="k1")
    assert stripe.refund(charge_id=c["id"], credential_ref=REF, idempotency_key="r1") == "succeeded"
    assert stripe.refund(charge_id=c["id"], credential_ref=REF, idempotency_key="r2") == "already refunded"
    obs = stripe.observe_refund(charge_id=c["id"], credential_ref=REF)
    assert (obs.reversed_, obs.amount) == (True, 4200)


def test_a_refund_acknowledged_but_not_applied_is_not_a_reversal(ledger: StripeLedger) -> None:
    c = stripe.create_charge(amount=4200, currency="usd", credential_ref=REF, idempotency_key="k1")
    ledger.ack_refund_without_applying = True
    assert stripe.refund(charge_id=c["id"], credential_ref=REF, idempotency_key="r1") == "succeeded"  # the 200
    obs = stripe.observe_refund(charge_id=c["id"], credential_ref=REF)
    assert obs.reversed_ is False and "nothing refunded" in obs.detail


def test_a_partial_refund_is_not_a_reversal(ledger: StripeLedger) -> None:
    c = stripe.create_charge(amount=4200, currency="usd", credential_ref=REF, idempotency_key="k1")
    stripe.refund(charge_id=c["id"], credential_ref=REF, idempotency_key="r1", amount=1000)
    obs = stripe.observe_refund(charge_id=c["id"], credential_ref=REF)
    assert obs.reversed_ is False and "partially refunded: 1000 of 4200" in obs.detail


def test_the_charge_reconciler_finds_a_landed_charge_by_its_key(ledger: StripeLedger) -> None:
    c = stripe.create_charge(amount=4200, currency="usd", customer="cus_1", credential_ref=REF, idempotency_key="k1")
    obs = stripe.observe_charge(credential_ref=REF, idempotency_key="k1", customer="cus_1")
    assert (obs.exists, obs.reversed_, obs.amount) == (True, False, 4200)
    assert obs.undo("stripe.charge").kwargs == {"charge_id": c["id"], "credential_ref": REF}  # type: ignore[union-attr]
    assert stripe.observe_charge(credential_ref=REF, idempotency_key="k2").exists is False


async def test_a_timed_out_charge_that_landed_is_drift_in_reconcile(
    ledger: StripeLedger, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ledger.drop_answer_after_charge = 1.0
    wal = FileWAL(tmp_path / "w")
    with pytest.raises(RollbackIncomplete, match="outcome unknown"):
        async with saga_scope(wal) as saga:
            await stripe.charge(saga, amount=4200, currency="usd", credential_ref=REF, timeout=0.3)
    wal.close()
    assert len(ledger.charges) == 1  # it landed; the saga could only escalate it
    code = await asyncio.to_thread(main, ["reconcile", "--wal-path", str(tmp_path / "w"), "--import", "agent_saga.connectors.stripe"])
    out = capsys.readouterr().out
    assert code == 1
    assert "[DRIFT] stripe.charge: timed-out step DID land and is still standing — it was never compensated (amount=4200" in out
    assert API_KEY not in (tmp_path / "w").read_text()


async def test_a_rolled_back_charge_reconciles_clean_until_the_refund_is_undone(
    ledger: StripeLedger, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wal = FileWAL(tmp_path / "w")
    with pytest.raises(RuntimeError):
        async with saga_scope(wal) as saga:
            c = await stripe.charge(saga, amount=4200, currency="usd", credential_ref=REF)
            raise RuntimeError("the model changed its mind")
    wal.close()
    assert ledger.charges[c["id"]]["refunded"] is True
    argv = ["reconcile", "--wal-path", str(tmp_path / "w"), "--import", "agent_saga.connectors.stripe"]
    assert await asyncio.to_thread(main, argv) == 0, capsys.readouterr().out
    ledger.unrefund(c["id"])  # the refund is voided at the provider after the 200
    assert await asyncio.to_thread(main, argv) == 1
    out = capsys.readouterr().out
    assert "[DRIFT] stripe.charge: the log says COMPENSATED but the effect is still standing" in out
    assert "IN_FLIGHT" not in out  # the saga closed ROLLED_BACK
    text = (tmp_path / "w").read_text()
    assert "stripe.refund" in text and API_KEY not in text
