"""Salesforce connector (COMPENSABLE): patch a record, undone by reverting only what it patched.

    from agent_saga.connectors import salesforce as sf

    await sf.update(saga, credential_ref="sf_prod", sobject="Opportunity",
                    record_id="006xx0000012345", fields={"StageName": "Closed Lost"})

``credential_ref`` resolves (``set_credential_resolver``) to ``{"instance_url": ...,
"access_token": ...}`` (optionally ``"api_version"``, default ``v60.0``). The connector
speaks the sObject REST API: ``GET .../sobjects/{type}/describe`` (which fields are
writable), ``GET .../sobjects/{type}/{id}?fields=...`` and ``PATCH .../sobjects/{type}/{id}``.

- ``salesforce.update`` reads the fields it is about to patch, patches them, and reads
  ``LastModifiedDate`` back: the compensation carries the old values of the patched
  fields only, and that ``LastModifiedDate``.
- ``salesforce.revert_object`` (the compensation) puts the old values back only if the
  record's ``LastModifiedDate`` is still the one the step left (and sends it as
  ``If-Unmodified-Since``): a record someone changed since is not overwritten; the
  compensation raises ``Indeterminate`` and the step is escalated. Only fields the
  describe call says are updateable are written; any other patched field is named in an
  ``Indeterminate`` after the rest is reverted. Already reverted values are success (a
  replay).
- The ``salesforce.revert_object`` reconciler compares only the touched fields with the
  old values, so it catches a workflow rule or trigger that put a value back after the
  revert answered 204.
- ``salesforce.revert_fields`` is the same handler and reconciler under the name older
  logs carry (``REVERT_FIELDS``): a crash recovered from such a log still reverts.
"""

from __future__ import annotations

import email.utils
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from ..compensation import Compensation, compensator
from ..errors import ConfigurationError
from ..recovery.reconcilers import Observation, reconciler
from ..semantics import ActionSemantics
from ._common import Indeterminate, credential_fields
from ._http import request

__all__ = ["REVERT", "REVERT_FIELDS", "observe_revert", "revert_fields", "revert_object", "update", "update_record",
           "writable_fields"]

#: The compensation handler (and reconciler) name new steps record.
REVERT = "salesforce.revert_object"
#: The same handler's earlier name, kept registered so older logs still resolve.
REVERT_FIELDS = "salesforce.revert_fields"

DEFAULT_API_VERSION = "v60.0"
TIMEOUT = 30.0


def _call(credential_ref: str, method: str, path: str, **kw: Any) -> Any:
    cred = credential_fields(credential_ref, "Salesforce", ("instance_url", "access_token"))
    version = str(cred.get("api_version") or DEFAULT_API_VERSION)
    url = f"{str(cred['instance_url']).rstrip('/')}/services/data/{version}{path}"
    headers = {"Authorization": f"Bearer {cred['access_token']}", "Accept": "application/json", **kw.pop("headers", {})}
    return request(method, url, headers=headers, timeout=TIMEOUT, **kw)


def _path(sobject: str, record_id: str | None = None) -> str:
    for what, value in (("sobject", sobject), ("record_id", record_id)):
        if value is not None and (not isinstance(value, str) or not value or not value.replace("_", "").isalnum()):
            raise ConfigurationError(f"{what} {value!r} is not valid: give an sObject API name such as 'Opportunity' and an 15/18-character record id")
    return f"/sobjects/{sobject}" + (f"/{record_id}" if record_id else "")


def writable_fields(*, credential_ref: str, sobject: str) -> set[str]:
    """The fields of ``sobject`` the describe call says are updateable."""
    d = _call(credential_ref, "GET", _path(sobject) + "/describe")
    return {f["name"] for f in d.get("fields", []) if f.get("updateable")}


def _read(credential_ref: str, sobject: str, record_id: str, fields: list[str]) -> dict[str, Any]:
    query = {"fields": ",".join([*fields, "LastModifiedDate"])}
    rec = _call(credential_ref, "GET", _path(sobject, record_id), query=query)
    return {k: rec.get(k) for k in [*fields, "LastModifiedDate"]}


def _http_date(last_modified: str) -> str:
    t = datetime.strptime(last_modified.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    return email.utils.format_datetime(t, usegmt=True)


def update_record(*, credential_ref: str, sobject: str, record_id: str, fields: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Patch ``fields``; return ``{sobject, record_id, before, after, last_modified}``
    (``before``: the old values of the patched fields, read just before the patch)."""
    if not isinstance(fields, Mapping) or not fields:
        raise ConfigurationError(f"fields must be a non-empty mapping of field name -> value, got {fields!r}")
    names = list(fields)
    before = _read(credential_ref, sobject, record_id, names)
    _call(credential_ref, "PATCH", _path(sobject, record_id), json_body=dict(fields))
    after = _read(credential_ref, sobject, record_id, names)
    return {
        "sobject": sobject, "record_id": record_id,
        "before": {n: before[n] for n in names}, "after": {n: after[n] for n in names},
        "last_modified": after["LastModifiedDate"],
    }


def _differs(want: Mapping[str, Any], seen: Mapping[str, Any]) -> list[str]:
    return [f"{k}={seen.get(k)!r} (expected {v!r})" for k, v in want.items() if seen.get(k) != v]


@compensator(REVERT_FIELDS)
@compensator(REVERT)
def revert_object(
    *, credential_ref: str, sobject: str, record_id: str, before: Mapping[str, Any], last_modified: str, **_: Any
) -> str:
    """Put ``before`` back - the writable fields only - if nobody modified the record
    since the step (module doc). Raises ``Indeterminate`` if it was modified, or (after
    reverting the rest) naming patched fields that are no longer writable."""
    if not before:
        return "nothing to revert"
    now = _read(credential_ref, sobject, record_id, list(before))
    if not _differs(before, now):
        return "already reverted"
    if now["LastModifiedDate"] != last_modified:
        raise Indeterminate(
            f"{sobject} {record_id} was modified after the step (LastModifiedDate {now['LastModifiedDate']}, "
            f"the step left {last_modified}); not overwriting it"
        )
    writable = writable_fields(credential_ref=credential_ref, sobject=sobject)
    revert = {k: v for k, v in before.items() if k in writable}
    if revert:
        _call(
            credential_ref, "PATCH", _path(sobject, record_id), json_body=revert,
            headers={"If-Unmodified-Since": _http_date(last_modified)},
        )
    stuck = sorted(set(before) - set(revert))
    if stuck:
        raise Indeterminate(
            f"reverted {sorted(revert)} of {sobject} {record_id}, but {stuck} are not writable (describe): "
            f"a human must put them back"
        )
    return "reverted"


@reconciler(REVERT_FIELDS)
@reconciler(REVERT)
def observe_revert(*, credential_ref: str, sobject: str, record_id: str, before: Mapping[str, Any], **_: Any) -> Observation:
    """Are the touched fields back to their old values? (only those are compared)"""
    if not before:
        return Observation(reversed_=True, exists=True, detail="no writable field was patched")
    now = _read(credential_ref, sobject, record_id, list(before))
    wrong = _differs(before, now)
    if wrong:
        return Observation(reversed_=False, exists=True, detail="not reverted: " + ", ".join(wrong))
    return Observation(reversed_=True, exists=True, detail="reverted")


#: The earlier name of ``revert_object`` (same function).
revert_fields = revert_object


async def update(saga: Any, *, credential_ref: str, sobject: str, record_id: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``update_record`` as a COMPENSABLE saga step (tool ``salesforce.update``)."""
    args: dict[str, Any] = {"credential_ref": credential_ref, "sobject": sobject, "record_id": record_id, "fields": dict(fields)}
    return await saga.execute(  # type: ignore[no-any-return]
        "salesforce.update", ActionSemantics.COMPENSABLE, lambda: update_record(**args),
        lambda r: None if r is None else Compensation(
            handler=REVERT, description=f"revert {sobject} {record_id} {sorted(r['before'])}",
            kwargs={"credential_ref": credential_ref, "sobject": sobject, "record_id": record_id,
                    "before": r["before"], "last_modified": r["last_modified"]},
        ),
        policy_args=args,
    )

