"""What the debugger's JSON API answers: sagas, one saga's steps and records, log pages.

Everything is computed from the index and the records read again through it, with the
read model ``agent-saga inspect`` uses (``history.fold``); nothing is executed. Payloads
are passed through as the log holds them (the WAL never holds a credential: a secret is
scrubbed to a reference before it is written); a redacted record is shown as redacted, an
encrypted one as sealed unless the debugger was given the log's key.
"""

from __future__ import annotations

from typing import Any

from ..audit.encryption import PayloadEncryptor, decrypt_record, is_envelope
from ..errors import SagaError, WALCorrupt
from ..history import (
    COMMITTED,
    COMPENSATED,
    COMPENSATING,
    COMPENSATION_FAILED,
    ESCALATED,
    FAILED,
    IN_FLIGHT,
    INTENT,
    REFUSED,
    SKIPPED,
    UNKNOWN,
    fold,
)
from ..records import ExtensionType, Record, RecordType, is_known_type
from .index import QUARANTINED, LogIndex, SagaEntry

#: The colour class of each step state (the timeline's legend).
OUTCOMES = {
    COMMITTED: "committed",
    COMPENSATED: "compensated",
    FAILED: "failed",
    REFUSED: "failed",
    COMPENSATION_FAILED: "failed",
    UNKNOWN: "unknown",
    INTENT: "orphaned",  # started, no outcome: it may have happened
    COMPENSATING: "orphaned",
    SKIPPED: "skipped",
    ESCALATED: "escalated",
}
_GATE = {RecordType.GATE_VERDICT.value, RecordType.STEP_REFUSED.value}
_UNDO = {RecordType.COMPENSATION_STARTED.value, RecordType.COMPENSATION_DONE.value,
         RecordType.COMPENSATION_FAILED.value, RecordType.COMPENSATION_SKIPPED.value,
         ExtensionType.STEP_RECONCILED.value, RecordType.ESCALATED.value}
_INTENT = RecordType.STEP_INTENT.value
MAX_PAGE = 200


def record_view(index: LogIndex, pos: int, item: Record | WALCorrupt,
                encryptor: PayloadEncryptor | None) -> dict[str, Any]:
    """One record as the API shows it, with its place relative to the first broken record."""
    bad = index.damage.position if index.damage is not None else None
    mark = {"broken": bad == pos, "after_break": bad is not None and pos > bad}
    if isinstance(item, WALCorrupt):
        return {"position": pos, "damaged": True, "reason": item.message, "location": item.location, **mark}
    payload: Any = item.payload
    sealed = False
    if is_envelope(payload):
        try:
            payload = decrypt_record(item, encryptor).payload if encryptor is not None else None
        except SagaError:
            payload = None
        sealed = payload is None
    return {
        "position": pos, "seq": item.seq, "ts": item.ts, "type": item.type, "saga": item.saga,
        "step": item.step, "payload": payload, "redacted": item.redacted, "sealed": sealed,
        "known": is_known_type(item.type), "hash": item.hash, "prev": item.prev,
        "gseq": item.extra.get("gseq"), **mark,
    }


def saga_row(index: LogIndex, entry: SagaEntry, asof: int | None) -> dict[str, Any]:
    """A saga in the sidebar (its status as of ``asof``)."""
    return {
        "saga_id": entry.saga_id, "name": entry.name, "tags": list(entry.tags), "tools": list(entry.tools),
        "status": entry.status(asof), "records": index.records_upto(entry, asof),
        "started_ts": entry.started_ts, "unknown_types": entry.unknown > 0,
    }


def list_sagas(index: LogIndex, *, status: str = "", query: str = "", offset: int = 0,
               limit: int = 50, asof: int | None = None) -> dict[str, Any]:
    """One page of the sagas matching ``status`` and ``query`` (id, name, tool or tag)."""
    limit = max(1, min(limit, MAX_PAGE))
    q = query.strip().lower()
    damaged = index.damage.saga if index.damage is not None else None
    matched: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    hay: dict[Any, str] = {}  # the searchable text of each (name, tools, tags): sagas share them
    total = 0
    for entry in index.order[: len(index.order)]:
        if asof is None:
            st: str | None = entry.changes[-1] if entry.changes else IN_FLIGHT
        else:
            st = entry.status(asof)
        if st is None:
            continue
        counts[st] = counts.get(st, 0) + 1
        if status and st != status:
            continue
        if q and q not in entry.saga_id.lower():
            key = (entry.name, entry.tools, entry.tags)
            text = hay.get(key)
            if text is None:
                text = hay[key] = "\n".join((entry.name or "", *entry.tools, *entry.tags)).lower()
            if q not in text:
                continue
        total += 1
        if offset < total <= offset + limit:
            row = saga_row(index, entry, asof)
            row["damaged"] = entry.saga_id == damaged
            matched.append(row)
    return {"total": total, "offset": offset, "limit": limit, "sagas": matched, "counts": counts}


def saga_detail(index: LogIndex, entry: SagaEntry, asof: int | None,
                encryptor: PayloadEncryptor | None) -> dict[str, Any]:
    """One saga as of ``asof``: its steps (folded as ``inspect`` folds them), the
    compensations that ran in the order they ran, and every record."""
    recs = index.saga_records(entry, asof)
    views = [record_view(index, p, r, encryptor) for p, r in recs]
    plain = [_plain(r, v) for (_p, r), v in zip(recs, views, strict=True)]
    state = fold(plain).get(entry.saga_id)
    status = entry.status(asof)
    steps: dict[str, dict[str, Any]] = {}
    for st in (state.steps.values() if state else ()):
        outcome = OUTCOMES.get(st.state, "unknown")
        if status == QUARANTINED and outcome in ("committed", "orphaned"):
            outcome = "quarantined"
        steps[st.step_id] = {
            "step_id": st.step_id, "tool": st.tool, "semantics": st.semantics, "state": st.state,
            "outcome": outcome, "compensation": st.compensation, "error": st.error,
            "policy_args": None, "idempotency_key": None,
            "gate": [], "approvals": [], "undo": [], "records": [],
        }
    undo: list[dict[str, Any]] = []
    for v in views:
        step = steps.get(v.get("step") or "")
        raw = v.get("payload")
        p: dict[str, Any] = raw if isinstance(raw, dict) else {}
        if step is None:
            continue
        step["records"].append(v["position"])
        kind = v["type"]
        if kind == _INTENT:
            step["policy_args"] = p.get("policy_args")
            step["idempotency_key"] = p.get("idempotency_key")
        elif kind in _GATE:
            step["gate"].append({"type": kind, "position": v["position"], **p})
        elif kind.startswith("APPROVAL_"):
            # what an approver was asked, as a human reads it: no control, bidi or zero-width characters
            step["approvals"].append({"type": kind, "position": v["position"], **_escaped(p)})
        elif kind in _UNDO:
            run = {"type": kind, "position": v["position"], "step": step["step_id"], "tool": step["tool"], **p}
            step["undo"].append(run)
            undo.append(run)
    return {
        "saga_id": entry.saga_id, "name": entry.name, "tags": list(entry.tags), "status": status,
        "asof": asof, "records_total": entry.count,
        "steps": list(steps.values()), "undo": undo, "records": views,
        "damaged": index.damage is not None and index.damage.saga == entry.saga_id,
    }


def _escaped(value: Any) -> Any:
    """``value`` with every string escaped for a human's eyes (``escape_text``)."""
    from ..controls.approvals._render import escape_text

    if isinstance(value, str):
        return escape_text(value)
    if isinstance(value, dict):
        return {escape_text(str(k)): _escaped(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escaped(v) for v in value]
    return value


def _plain(rec: Record, view: dict[str, Any]) -> Record:
    """``rec`` with the payload the view shows (decrypted, or none if sealed), for ``fold``."""
    if view.get("payload") is rec.payload:
        return rec
    return Record(rec.type, rec.saga, rec.step, view.get("payload"), rec.seq, rec.ts)


def log_page(index: LogIndex, number: int, encryptor: PayloadEncryptor | None) -> dict[str, Any]:
    """Page ``number`` of the whole log (for the record scrubber and the broken record)."""
    items = index.page(number)
    return {"page": number, "records": [record_view(index, p, r, encryptor) for p, r in items],
            "total": index.count}


def events(index: LogIndex, asof: int | None, encryptor: PayloadEncryptor | None) -> dict[str, Any]:
    """Kill-switch, breaker and WAL records as of ``asof``."""
    return {"events": [record_view(index, p, r, encryptor) for p, r in index.events_upto(asof)]}
