"""The Salesforce connector against a protocol-level sObject REST server.

tests/fixtures/salesforce_server.py speaks the subset the connector uses (describe, GET
with fields, PATCH with If-Unmodified-Since) with Salesforce's semantics for it, over real
HTTP, driven by the connector's own HTTP client. Workflow rules and other users' edits
are how drift is made.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga import FileWAL, saga_scope
from agent_saga.connectors import Indeterminate, set_credential_resolver
from agent_saga.connectors import salesforce as sf
from agent_saga.connectors._http import HTTPFailure
from fixtures.salesforce_server import TOKEN, SalesforceServer

pytestmark = pytest.mark.integration

REF = "sf_test"
OPP = "006000000000001"


@pytest.fixture
def org(salesforce: SalesforceServer) -> Iterator[SalesforceServer]:
    salesforce.describe["Opportunity"] = {"Id": False, "StageName": True, "Amount": True, "Description": True,
                                          "IsClosed": False, "LastModifiedDate": False}
    salesforce.add("Opportunity", OPP, StageName="Prospecting", Amount=5000, Description="d", IsClosed=False)
    creds = {"instance_url": salesforce.url, "access_token": TOKEN}
    prev = set_credential_resolver(lambda ref: creds if ref == REF else None)
    yield salesforce
    set_credential_resolver(prev)


def kwargs(r: dict[str, Any]) -> dict[str, Any]:
    return {"credential_ref": REF, "sobject": "Opportunity", "record_id": OPP, "before": r["before"], "last_modified": r["last_modified"]}


def rec(org: SalesforceServer) -> dict[str, Any]:
    return org.records[("Opportunity", OPP)]


def test_the_revert_puts_back_only_the_patched_fields_guarded_by_last_modified(org: SalesforceServer) -> None:
    r = sf.update_record(credential_ref=REF, sobject="Opportunity", record_id=OPP, fields={"StageName": "Closed Lost"})
    assert r["before"] == {"StageName": "Prospecting"} and r["after"] == {"StageName": "Closed Lost"}
    assert sf.observe_revert(**kwargs(r)).reversed_ is False
    assert sf.revert_fields(**kwargs(r)) == "reverted"
    assert rec(org)["StageName"] == "Prospecting" and rec(org)["Amount"] == 5000
    rid, body, guard = org.patches[-1]
    assert body == {"StageName": "Prospecting"} and guard is not None  # only the touched field, conditionally
    assert sf.revert_fields(**kwargs(r)) == "already reverted"
    assert sf.observe_revert(**kwargs(r)).reversed_ is True


def test_a_record_modified_since_the_step_is_not_overwritten(org: SalesforceServer) -> None:
    r = sf.update_record(credential_ref=REF, sobject="Opportunity", record_id=OPP, fields={"StageName": "Closed Lost"})
    org.touch("Opportunity", OPP, Amount=7000)  # another user
    with pytest.raises(Indeterminate, match="was modified after the step"):
        sf.revert_fields(**kwargs(r))
    assert rec(org)["StageName"] == "Closed Lost" and rec(org)["Amount"] == 7000


def test_a_field_no_longer_writable_is_not_written_and_is_named(org: SalesforceServer) -> None:
    r = sf.update_record(credential_ref=REF, sobject="Opportunity", record_id=OPP, fields={"StageName": "Closed Lost", "Amount": 1})
    org.describe["Opportunity"]["Amount"] = False  # e.g. the record entered an approval lock
    with pytest.raises(Indeterminate, match=r"\['Amount'\] are not writable"):
        sf.revert_fields(**kwargs(r))
    assert org.patches[-1][1] == {"StageName": "Prospecting"}
    obs = sf.observe_revert(**kwargs(r))
    assert obs.reversed_ is False and "Amount=1 (expected 5000)" in obs.detail


def test_the_reconciler_catches_a_workflow_rule_that_put_the_value_back(org: SalesforceServer) -> None:
    r = sf.update_record(credential_ref=REF, sobject="Opportunity", record_id=OPP, fields={"StageName": "Closed Lost"})

    def reopen_is_escalated(record: dict[str, Any]) -> None:  # a workflow field update
        if record["StageName"] == "Prospecting":
            record["StageName"] = "Needs Review"

    org.workflow.append(reopen_is_escalated)
    assert sf.revert_fields(**kwargs(r)) == "reverted"  # the PATCH answered 204
    obs = sf.observe_revert(**kwargs(r))
    assert obs.reversed_ is False and "StageName='Needs Review' (expected 'Prospecting')" in obs.detail


def test_the_reconciler_compares_only_the_touched_fields(org: SalesforceServer) -> None:
    r = sf.update_record(credential_ref=REF, sobject="Opportunity", record_id=OPP, fields={"StageName": "Closed Lost"})
    sf.revert_fields(**kwargs(r))
    org.touch("Opportunity", OPP, Description="edited later by someone")
    assert sf.observe_revert(**kwargs(r)).reversed_ is True


def test_salesforce_errors_surface_with_the_status_and_never_the_token(org: SalesforceServer) -> None:
    with pytest.raises(HTTPFailure, match="answered 400.*INVALID_FIELD_FOR_INSERT_UPDATE") as exc:
        sf.update_record(credential_ref=REF, sobject="Opportunity", record_id=OPP, fields={"IsClosed": True})
    assert TOKEN not in str(exc.value)


async def test_a_saga_rolls_back_through_the_handler_and_the_log_holds_only_the_reference(
    org: SalesforceServer, tmp_path: Path
) -> None:
    wal = FileWAL(tmp_path / "w")
    with pytest.raises(RuntimeError):
        async with saga_scope(wal) as saga:
            await sf.update(saga, credential_ref=REF, sobject="Opportunity", record_id=OPP, fields={"StageName": "Closed Won"})
            raise RuntimeError("the model changed its mind")
    wal.close()
    assert rec(org)["StageName"] == "Prospecting"
    text = (tmp_path / "w").read_text()
    assert "salesforce.revert_object" in text and "salesforce.revert_fields" not in text and TOKEN not in text


async def test_a_log_naming_the_earlier_handler_still_reverts(org: SalesforceServer, tmp_path: Path) -> None:
    """Steps recorded before the handler was named ``salesforce.revert_object`` carry
    ``salesforce.revert_fields``: that name still resolves to the same handler and reconciler."""
    from agent_saga import ActionSemantics, Compensation
    from agent_saga.compensation import get_compensator
    from agent_saga.recovery.reconcilers import get_reconciler

    assert get_compensator(sf.REVERT_FIELDS) is get_compensator(sf.REVERT) is sf.revert_object_async
    assert get_reconciler(sf.REVERT_FIELDS) is get_reconciler(sf.REVERT) is sf.observe_revert_async
    wal = FileWAL(tmp_path / "w")
    with pytest.raises(RuntimeError):
        async with saga_scope(wal) as saga:
            await saga.execute(
                "salesforce.update", ActionSemantics.COMPENSABLE,
                lambda: sf.update_record(credential_ref=REF, sobject="Opportunity", record_id=OPP,
                                         fields={"StageName": "Closed Won"}),
                lambda r: Compensation(handler=sf.REVERT_FIELDS, kwargs=kwargs(r)),
            )
            raise RuntimeError("the model changed its mind")
    wal.close()
    assert saga.rollback_report is not None and saga.rollback_report.clean
    assert rec(org)["StageName"] == "Prospecting"
