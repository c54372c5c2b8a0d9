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

The step, the compensation and the reconciler speak HTTP on the event loop
(``_http.arequest``, the standard library only): the registered handlers are the
``*_async`` functions, so neither a rollback, the recovery daemon nor ``agent-saga
reconcile`` takes a pool thread for them. Each call's logic is written once, as a plan
(``_common``); the plain sync functions (``update_record``, ``revert_object``,
``observe_revert``) run the same plans over ``urllib`` for sync code.
"""

from __future__ import annotations

import email.utils
import functools
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar

from ..compensation import Compensation, compensator
from ..errors import ConfigurationError
from ..recovery.reconcilers import Observation, reconciler
from ..semantics import ActionSemantics
from ._common import Indeterminate, Plan, arun_plan, credential_fields, first_request, run_plan
from ._http import arequest, request

__all__ = ["REVERT", "REVERT_FIELDS", "observe_revert", "observe_revert_async", "revert_fields", "revert_object",
           "revert_object_async", "update", "update_record", "update_record_async", "writable_fields"]

T = TypeVar("T")

#: The compensation handler (and reconciler) name new steps record.
REVERT = "salesforce.revert_object"
#: The same handler's earlier name, kept registered so older logs still resolve.
REVERT_FIELDS = "salesforce.revert_fields"

DEFAULT_API_VERSION = "v60.0"
TIMEOUT = 30.0


# A call's logic is a plan (``_common``): it yields ``(method, path, kw)`` and receives the
# parsed answer. ``_run`` answers it over ``_http.request`` (blocking), ``_arun`` over
# ``_http.arequest`` (on the event loop).
def _endpoint(credential_ref: str, method: str, path: str, kw: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    cred = credential_fields(credential_ref, "Salesforce", ("instance_url", "access_token"))
    version = str(cred.get("api_version") or DEFAULT_API_VERSION)
    url = f"{str(cred['instance_url']).rstrip('/')}/services/data/{version}{path}"
    headers = {"Authorization": f"Bearer {cred['access_token']}", "Accept": "application/json", **kw.get("headers", {})}
    return url, {**kw, "headers": headers, "timeout": TIMEOUT}


def _run(credential_ref: str, plan: Plan[T]) -> T:
    done, first = first_request(plan)
    if done:
        return first  # type: ignore[no-any-return]

    def answer(req: tuple[str, str, dict[str, Any]]) -> Any:
        url, kw = _endpoint(credential_ref, *req)
        return request(req[0], url, **kw)

    return run_plan(plan, first, answer)


async def _arun(credential_ref: str, plan: Plan[T]) -> T:
    done, first = first_request(plan)
    if done:
        return first  # type: ignore[no-any-return]

    async def answer(req: tuple[str, str, dict[str, Any]]) -> Any:
        url, kw = _endpoint(credential_ref, *req)
        return await arequest(req[0], url, **kw)

    return await arun_plan(plan, first, answer)


def _path(sobject: str, record_id: str | None = None) -> str:
    for what, value in (("sobject", sobject), ("record_id", record_id)):
        if value is not None and (not isinstance(value, str) or not value or not value.replace("_", "").isalnum()):
            raise ConfigurationError(f"{what} {value!r} is not valid: give an sObject API name such as 'Opportunity' and an 15/18-character record id")
    return f"/sobjects/{sobject}" + (f"/{record_id}" if record_id else "")


def _writable(sobject: str) -> Plan[set[str]]:
    d = yield "GET", _path(sobject) + "/describe", {}
    return {f["name"] for f in d.get("fields", []) if f.get("updateable")}


def writable_fields(*, credential_ref: str, sobject: str) -> set[str]:
    """The fields of ``sobject`` the describe call says are updateable."""
    return _run(credential_ref, _writable(sobject))


def _read(sobject: str, record_id: str, fields: list[str]) -> Plan[dict[str, Any]]:
    query = {"fields": ",".join([*fields, "LastModifiedDate"])}
    rec = yield "GET", _path(sobject, record_id), {"query": query}
    return {k: rec.get(k) for k in [*fields, "LastModifiedDate"]}


def _http_date(last_modified: str) -> str:
    t = datetime.strptime(last_modified.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z")
    return email.utils.format_datetime(t, usegmt=True)


def _update(sobject: str, record_id: str, fields: Mapping[str, Any]) -> Plan[dict[str, Any]]:
    if not isinstance(fields, Mapping) or not fields:
        raise ConfigurationError(f"fields must be a non-empty mapping of field name -> value, got {fields!r}")
    names = list(fields)
    before = yield from _read(sobject, record_id, names)
    yield "PATCH", _path(sobject, record_id), {"json_body": dict(fields)}
    after = yield from _read(sobject, record_id, names)
    return {
        "sobject": sobject, "record_id": record_id,
        "before": {n: before[n] for n in names}, "after": {n: after[n] for n in names},
        "last_modified": after["LastModifiedDate"],
    }


def update_record(*, credential_ref: str, sobject: str, record_id: str, fields: Mapping[str, Any], **_: Any) -> dict[str, Any]:
    """Patch ``fields``; return ``{sobject, record_id, before, after, last_modified}``
    (``before``: the old values of the patched fields, read just before the patch)."""
    return _run(credential_ref, _update(sobject, record_id, fields))


async def update_record_async(*, credential_ref: str, sobject: str, record_id: str, fields: Mapping[str, Any],
                              **_: Any) -> dict[str, Any]:
    """``update_record`` on the event loop (``_http.arequest``)."""
    return await _arun(credential_ref, _update(sobject, record_id, fields))


def _differs(want: Mapping[str, Any], seen: Mapping[str, Any]) -> list[str]:
    return [f"{k}={seen.get(k)!r} (expected {v!r})" for k, v in want.items() if seen.get(k) != v]


def _revert(sobject: str, record_id: str, before: Mapping[str, Any], last_modified: str) -> Plan[str]:
    if not before:
        return "nothing to revert"
    now = yield from _read(sobject, record_id, list(before))
    if not _differs(before, now):
        return "already reverted"
    if now["LastModifiedDate"] != last_modified:
        raise Indeterminate(
            f"{sobject} {record_id} was modified after the step (LastModifiedDate {now['LastModifiedDate']}, "
            f"the step left {last_modified}); not overwriting it"
        )
    writable = yield from _writable(sobject)
    revert = {k: v for k, v in before.items() if k in writable}
    if revert:
        yield "PATCH", _path(sobject, record_id), {
            "json_body": revert, "headers": {"If-Unmodified-Since": _http_date(last_modified)}}
    stuck = sorted(set(before) - set(revert))
    if stuck:
        raise Indeterminate(
            f"reverted {sorted(revert)} of {sobject} {record_id}, but {stuck} are not writable (describe): "
            f"a human must put them back"
        )
    return "reverted"


def revert_object(
    *, credential_ref: str, sobject: str, record_id: str, before: Mapping[str, Any], last_modified: str, **_: Any
) -> str:
    """Put ``before`` back - the writable fields only - if nobody modified the record
    since the step (module doc). Raises ``Indeterminate`` if it was modified, or (after
    reverting the rest) naming patched fields that are no longer writable."""
    return _run(credential_ref, _revert(sobject, record_id, before, last_modified))


@compensator(REVERT_FIELDS)
@compensator(REVERT)
async def revert_object_async(
    *, credential_ref: str, sobject: str, record_id: str, before: Mapping[str, Any], last_modified: str, **_: Any
) -> str:
    """``revert_object`` as the registered compensation: on the event loop."""
    return await _arun(credential_ref, _revert(sobject, record_id, before, last_modified))


def _observe(sobject: str, record_id: str, before: Mapping[str, Any]) -> Plan[Observation]:
    if not before:
        return Observation(reversed_=True, exists=True, detail="no writable field was patched")
    now = yield from _read(sobject, record_id, list(before))
    wrong = _differs(before, now)
    if wrong:
        return Observation(reversed_=False, exists=True, detail="not reverted: " + ", ".join(wrong))
    return Observation(reversed_=True, exists=True, detail="reverted")


def observe_revert(*, credential_ref: str, sobject: str, record_id: str, before: Mapping[str, Any], **_: Any) -> Observation:
    """Are the touched fields back to their old values? (only those are compared)"""
    return _run(credential_ref, _observe(sobject, record_id, before))


@reconciler(REVERT_FIELDS)
@reconciler(REVERT)
async def observe_revert_async(
    *, credential_ref: str, sobject: str, record_id: str, before: Mapping[str, Any], **_: Any
) -> Observation:
    """``observe_revert`` as the registered reconciler: on the event loop."""
    return await _arun(credential_ref, _observe(sobject, record_id, before))


#: The earlier name of ``revert_object`` (same function).
revert_fields = revert_object


async def update(saga: Any, *, credential_ref: str, sobject: str, record_id: str, fields: Mapping[str, Any]) -> dict[str, Any]:
    """``update_record`` as a COMPENSABLE saga step (tool ``salesforce.update``), on the event loop."""
    args: dict[str, Any] = {"credential_ref": credential_ref, "sobject": sobject, "record_id": record_id, "fields": dict(fields)}
    return await saga.execute(  # type: ignore[no-any-return]
        "salesforce.update", ActionSemantics.COMPENSABLE, functools.partial(update_record_async, **args),
        lambda r: None if r is None else Compensation(
            handler=REVERT, description=f"revert {sobject} {record_id} {sorted(r['before'])}",
            kwargs={"credential_ref": credential_ref, "sobject": sobject, "record_id": record_id,
                    "before": r["before"], "last_modified": r["last_modified"]},
        ),
        policy_args=args,
    )
