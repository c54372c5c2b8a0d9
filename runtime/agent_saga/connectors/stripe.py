"""Stripe connector (COMPENSABLE): a charge, undone by a refund, both idempotent.

    from agent_saga.connectors import stripe

    charge = await stripe.charge(saga, amount=4200, currency="usd", customer="cus_123",
                                 credential_ref="stripe_prod")

``credential_ref`` resolves (``set_credential_resolver``) to the secret API key, or to
``{"api_key": ..., "api_base": ...}`` (``api_base`` defaults to https://api.stripe.com).

- ``stripe.charge`` posts ``/v1/charges`` with ``Idempotency-Key`` = the step's
  deterministic forward key (also stored as ``metadata[agent_saga_key]``), so a retry or a
  replay after a crash can never charge twice.
- ``stripe.refund`` (the compensation) posts ``/v1/refunds`` under the compensation's
  deterministic key and treats ``charge_already_refunded`` as success, so a daemon that
  returns late does not loop.

Reconcilers (``agent-saga reconcile``, and recovery for an in-doubt charge):

- ``stripe.refund`` re-reads the charge: reversed only if ``refunded`` is true. A refund
  acknowledged but never applied (nothing refunded) and a partial refund are reported as
  not reversed - a partial refund is not a reversal.
- ``stripe.charge`` looks for the charge carrying the forward key in the charge list
  (strongly consistent, unlike search), within Stripe's 24-hour idempotency window: found
  -> it landed (with the refund to run if it stands); not found -> it did not land.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from ..compensation import Compensation, compensator
from ..errors import ConfigurationError
from ..recovery.reconcilers import Observation, reconciler
from ..semantics import ActionSemantics
from ._common import credential_fields
from ._http import HTTPFailure, request

__all__ = ["charge", "create_charge", "get_charge", "observe_charge", "observe_refund", "refund"]

DEFAULT_API_BASE = "https://api.stripe.com"
KEY_METADATA = "agent_saga_key"
IDEMPOTENCY_WINDOW = 25 * 3600  # Stripe keeps keys 24h; an hour of slack for clocks
TIMEOUT = 30.0


def _call(credential_ref: str, method: str, path: str, **kw: Any) -> Any:
    cred = credential_fields(credential_ref, "Stripe", ("api_key",), plain="api_key")
    base = str(cred.get("api_base") or DEFAULT_API_BASE).rstrip("/")
    headers = {"Authorization": f"Bearer {cred['api_key']}", **kw.pop("headers", {})}
    return request(method, base + path, headers=headers, timeout=float(cred.get("timeout") or TIMEOUT), **kw)


def _summary(c: Mapping[str, Any]) -> dict[str, Any]:
    return {k: c.get(k) for k in ("id", "amount", "amount_refunded", "currency", "refunded", "status")}


def create_charge(
    *,
    amount: int,
    currency: str,
    credential_ref: str,
    idempotency_key: str,
    customer: str | None = None,
    source: str | None = None,
    description: str | None = None,
    **_: Any,
) -> dict[str, Any]:
    """Create the charge under ``idempotency_key``; return its id, amount and status."""
    if isinstance(amount, bool) or not isinstance(amount, int) or amount <= 0:
        raise ConfigurationError(f"amount must be a positive integer in the currency's minor unit (cents), got {amount!r}")
    form: dict[str, Any] = {"amount": amount, "currency": currency, f"metadata[{KEY_METADATA}]": idempotency_key}
    for name, value in (("customer", customer), ("source", source), ("description", description)):
        if value is not None:
            form[name] = value
    c = _call(credential_ref, "POST", "/v1/charges", form=form, headers={"Idempotency-Key": idempotency_key})
    return _summary(c)


def get_charge(*, charge_id: str, credential_ref: str) -> dict[str, Any]:
    """The charge as Stripe has it now."""
    return dict(_call(credential_ref, "GET", f"/v1/charges/{charge_id}"))


@compensator("stripe.refund")
def refund(*, charge_id: str, credential_ref: str, idempotency_key: str, amount: int | None = None, **_: Any) -> str:
    """Refund the charge (all of it unless ``amount``); ``charge_already_refunded`` is success."""
    form: dict[str, Any] = {"charge": charge_id, f"metadata[{KEY_METADATA}]": idempotency_key}
    if amount is not None:
        form["amount"] = amount
    try:
        r = _call(credential_ref, "POST", "/v1/refunds", form=form, headers={"Idempotency-Key": idempotency_key})
    except HTTPFailure as exc:
        err = exc.body.get("error", {}) if isinstance(exc.body, dict) else {}
        if err.get("code") == "charge_already_refunded":
            return "already refunded"
        raise
    return str(r.get("status") or "refunded")


@reconciler("stripe.refund")
def observe_refund(*, charge_id: str, credential_ref: str, **_: Any) -> Observation:
    """Is the charge refunded in full? (see the module doc)"""
    c = get_charge(charge_id=charge_id, credential_ref=credential_ref)
    amount, refunded = c.get("amount"), int(c.get("amount_refunded") or 0)
    if c.get("refunded") is True:
        return Observation(reversed_=True, exists=True, detail=f"refunded ({c.get('status')})", amount=amount)
    if refunded:
        return Observation(
            reversed_=False, exists=True, amount=amount,
            detail=f"partially refunded: {refunded} of {amount} - a partial refund is not a reversal",
        )
    return Observation(reversed_=False, exists=True, amount=amount, detail=f"nothing refunded (charge {c.get('status')})")


def _find_by_key(credential_ref: str, key: str, customer: str | None) -> dict[str, Any] | None:
    query: dict[str, Any] = {"limit": 100, "created[gte]": int(time.time()) - IDEMPOTENCY_WINDOW}
    if customer:
        query["customer"] = customer
    while True:
        page = _call(credential_ref, "GET", "/v1/charges", query=query)
        data = page.get("data") or []
        for c in data:
            if (c.get("metadata") or {}).get(KEY_METADATA) == key:
                return dict(c)
        if not page.get("has_more") or not data:
            return None
        query["starting_after"] = data[-1]["id"]


@reconciler("stripe.charge")
def observe_charge(*, credential_ref: str, idempotency_key: str, customer: str | None = None, **_: Any) -> Observation:
    """Did the charge under the forward key land, and does it stand? (see the module doc)"""
    c = _find_by_key(credential_ref, idempotency_key, customer)
    if c is None:
        return Observation(exists=False, detail="no charge carries the step's idempotency key")
    undo = Compensation(handler="stripe.refund", kwargs={"charge_id": c["id"], "credential_ref": credential_ref})
    if c.get("refunded") is True:
        return Observation(exists=True, reversed_=True, amount=c.get("amount"), detail=f"{c['id']} refunded", compensation=undo)
    return Observation(exists=True, reversed_=False, amount=c.get("amount"), detail=f"{c['id']} {c.get('status')}", compensation=undo)


async def charge(
    saga: Any,
    *,
    amount: int,
    currency: str,
    credential_ref: str,
    customer: str | None = None,
    source: str | None = None,
    description: str | None = None,
    timeout: float | None = None,
) -> dict[str, Any]:
    """``create_charge`` as a COMPENSABLE saga step (tool ``stripe.charge``)."""
    args: dict[str, Any] = {"amount": amount, "currency": currency, "credential_ref": credential_ref}
    for name, value in (("customer", customer), ("source", source), ("description", description)):
        if value is not None:
            args[name] = value
    return await saga.execute(  # type: ignore[no-any-return]
        "stripe.charge", ActionSemantics.COMPENSABLE,
        lambda idempotency_key: create_charge(**args, idempotency_key=idempotency_key),
        lambda r: None if r is None else Compensation(
            handler="stripe.refund", description=f"refund {r['id']} ({r['amount']} {r['currency']})",
            kwargs={"charge_id": r["id"], "credential_ref": credential_ref},
        ),
        timeout=timeout, policy_args=args,
    )
