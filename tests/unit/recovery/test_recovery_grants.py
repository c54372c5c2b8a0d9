"""The recovery allow-list: which writer may have which compensation run, with which
credential references (``agent_saga.recovery.grants``)."""

from __future__ import annotations

import pytest
from agent_saga.errors import ConfigurationError
from agent_saga.records import Record
from agent_saga.recovery.grants import DEFAULT_GRANTS, Grants
from agent_saga.wal.writers import (
    SagaOwners,
    check_identity,
    identity_of,
    identity_writer,
    is_identity_writer,
)


def test_without_an_allow_list_any_handler_runs_but_never_with_a_credential_ref() -> None:
    assert Grants.parse(None) is DEFAULT_GRANTS
    assert DEFAULT_GRANTS.refuses("pay/a@1", "stripe.refund", {"charge_id": "ch_1"}) is None
    why = DEFAULT_GRANTS.refuses("pay/a@1", "stripe.refund", {"charge_id": "ch_1", "credential_ref": "stripe_admin"})
    assert why is not None and "no recovery allow-list is configured" in why
    assert "'pay/a@1'" in why and "'stripe.refund'" in why and "'stripe_admin'" in why
    assert DEFAULT_GRANTS.refuses("pay/a@1", "x.y", {"source_credential_ref": "r"}) is not None


def test_a_rule_grants_its_writers_its_handlers_and_its_refs_only() -> None:
    g = Grants.parse(["pay/* stripe.refund,stripe.void stripe_payments", "search/* cache.*"])
    assert g.refuses("pay/p-1@9-ab", "stripe.refund", {"credential_ref": "stripe_payments"}) is None
    assert g.refuses("pay/p-1@9-ab", "stripe.void", {}) is None
    assert g.refuses("search/s@1", "cache.evict", {}) is None
    for writer, handler, kwargs in (
        ("pay/p-1@9-ab", "stripe.refund", {"credential_ref": "stripe_prod_admin"}),  # a ref not granted
        ("pay/p-1@9-ab", "wire.send", {}),  # a handler not granted
        ("search/s@1", "stripe.refund", {}),  # another writer's handler
        ("search/s@1", "cache.evict", {"credential_ref": "x"}),  # a rule with no refs grants none
    ):
        why = g.refuses(writer, handler, kwargs)
        assert why is not None and f"'{writer}'" in why and f"'{handler}'" in why, (writer, handler)


@pytest.mark.parametrize("rule", ["pay/*", "pay/* a b c", "pay/* ,", ""])
def test_a_malformed_rule_names_the_form(rule: str) -> None:
    with pytest.raises(ConfigurationError, match="WRITERS HANDLERS"):
        Grants.parse([rule])


def test_writer_ids_of_identities() -> None:
    w = identity_writer("pay/p-1")
    assert w.startswith("pay/p-1@") and is_identity_writer(w) and identity_of(w) == "pay/p-1"
    assert not is_identity_writer("host-12-ab") and identity_of("host-12-ab") is None
    for bad in ("pay", "pay/p/1", "pay/p-*", "pay/p@1", "/p"):
        with pytest.raises(ConfigurationError, match="<namespace>/<pod>"):
            check_identity(bad)


def test_a_saga_belongs_to_its_first_identity_writer_and_service_writers_may_close_it() -> None:
    def rec(saga: str, writer: str | None) -> Record:
        return Record("SAGA_STARTED", saga, None, None, seq=1, extra={} if writer is None else {"writer": writer})

    owners = SagaOwners()
    assert owners.admit(rec("s", "recovery-1"))  # a service writer first: owns nothing
    assert owners.admit(rec("s", "pay/a@1"))
    assert owners.admit(rec("s", "recovery-2")) and owners.admit(rec("s", "pay/a@1"))
    assert not owners.admit(rec("s", "pay/b@1"))
    assert owners.admit(rec("s", None))  # a file log: one writer
    assert owners.foreign.describe()[0].startswith("writer pay/b@1: 1 record(s) of sagas it does not own")
