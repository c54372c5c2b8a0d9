"""Installs the credential resolver of the crash test's processes (the worker, recovery and
reconcile): references to the local servers, read from the environment at use time."""

from __future__ import annotations

import os
from typing import Any

from agent_saga.connectors import set_credential_resolver


def _resolve(ref: str) -> Any:
    if ref == "stripe_test":
        return {"api_key": os.environ["E2E_STRIPE_KEY"], "api_base": os.environ["E2E_STRIPE_URL"]}
    if ref == "orders_db":
        return os.environ["E2E_PG_DSN"]
    return None


set_credential_resolver(_resolve)
