"""The calls a log records: each step an agent asked the gate about, as the gate saw it.

A call is one step that reached the gate or ran: its ``STEP_INTENT`` (it ran) or its
``STEP_REFUSED`` (a control refused it). What the gate was asked is rebuilt from three
records:

    SAGA_STARTED    the saga's tags
    GATE_VERDICT    the code's declared semantics (the intent holds the semantics a
                    SagaPolicy tightened them to; a step with no gate has no verdict)
    STEP_INTENT / STEP_REFUSED   the tool and the policy arguments the code passed

Invariants:
- Nothing is guessed. A call whose records cannot be read is an ``Unevaluable`` naming
  the saga, the step and why: a redacted or encrypted record (no key given), a saga
  whose start is not in the log (tags unknown), a refusal written before refusals
  recorded their policy arguments. It is counted by the caller, never dropped.
- Memory is bounded by the sagas still open in the log (their tags) and the steps
  between their verdict and their intent, never by the length of the log.
- A wrong key raises (``WALDecryptFailed``): that is bad input, not an unreadable call.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from ..audit.encryption import PayloadEncryptor, decrypt_record, is_envelope
from ..gates import StepRequest
from ..records import TERMINAL_SAGA_TYPES, Record, RecordType
from ..semantics import ActionSemantics

__all__ = ["RecordedCall", "Unevaluable", "recorded_calls"]

_STARTED = RecordType.SAGA_STARTED.value
_VERDICT = RecordType.GATE_VERDICT.value
_INTENT = RecordType.STEP_INTENT.value
_REFUSED = RecordType.STEP_REFUSED.value
_SEMANTICS = {s.value: s for s in ActionSemantics}
_EMPTY: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class RecordedCall:
    """One call as the gate was asked it: ``request`` (the code's semantics, the policy
    arguments the code passed, the saga's tags) and when (``ts``, microseconds)."""

    request: StepRequest
    ts: int
    #: None: the call ran (a STEP_INTENT); else the gate stage that refused it
    #: (``kill_switch``, ``policy``, ``limits``, ...; "" when the record does not say).
    refused_at: str | None = None


@dataclass(frozen=True, slots=True)
class Unevaluable:
    """A call the log cannot replay: ``why`` is one of ``REASONS``' keys, ``detail`` says more."""

    saga: str
    step: str
    tool: str | None
    ts: int
    why: str
    detail: str


#: Why a call could not be evaluated, in words for a reviewer.
REASONS = {
    "redacted": "a record of the call was redacted (erased): its contents are gone",
    "encrypted": "a record of the call is encrypted and no key was given (--wal-key-file, AGENT_SAGA_WAL_KEY)",
    "no-saga-start": "its saga's SAGA_STARTED is not in the log (compacted, or cut off): the tags are unknown",
    "no-policy-args": "a refusal written by an older agent-saga, which did not record the policy arguments",
    "malformed": "a record of the call does not hold what this version writes",
}


class _Unreadable(Exception):
    def __init__(self, why: str, detail: str) -> None:
        super().__init__(detail)
        self.why = why
        self.detail = detail


def _payload(rec: Record, encryptor: PayloadEncryptor | None) -> dict[str, Any]:
    """The record's payload, or ``_Unreadable`` (redacted, or encrypted with no key)."""
    payload = rec.payload
    if rec.redacted or payload is None:
        raise _Unreadable("redacted", f"{rec.type} seq {rec.seq} is redacted")
    if is_envelope(payload):
        if encryptor is None:
            raise _Unreadable("encrypted", f"{rec.type} seq {rec.seq} is encrypted under key {payload.get('kid')!r}")
        payload = decrypt_record(rec, encryptor).payload
        assert payload is not None
    return payload


def recorded_calls(records: Iterable[Record], *, encryptor: PayloadEncryptor | None = None,
                   since_us: int | None = None) -> Iterator[RecordedCall | Unevaluable]:
    """Every call in ``records`` (a log in order), as ``RecordedCall`` or ``Unevaluable``.
    ``since_us``: only calls at or after this instant (microseconds); earlier records are
    still read for the tags of sagas still open."""
    tags: dict[str, tuple[str, ...] | _Unreadable] = {}
    declared: dict[str, str | _Unreadable] = {}  # step -> the code's semantics (its GATE_VERDICT)
    for rec in records:
        t = rec.type
        if t == _INTENT or t == _REFUSED:
            step = rec.step or ""
            code = declared.pop(step, None)
            if since_us is not None and rec.ts < since_us:
                continue
            yield _call(rec, step, code, tags.get(rec.saga), encryptor)
        elif t == _VERDICT:
            if rec.step:
                try:
                    sem = _payload(rec, encryptor).get("semantics")
                    declared[rec.step] = sem if isinstance(sem, str) else _Unreadable(
                        "malformed", f"GATE_VERDICT seq {rec.seq} has no semantics")
                except _Unreadable as exc:
                    declared[rec.step] = exc
        elif t == _STARTED:
            try:
                raw = _payload(rec, encryptor).get("tags") or ()
                tags[rec.saga] = tuple(str(x) for x in raw) if isinstance(raw, list | tuple) else _Unreadable(
                    "malformed", f"SAGA_STARTED seq {rec.seq} has tags that are not a list")
            except _Unreadable as exc:
                tags[rec.saga] = exc
        elif t in TERMINAL_SAGA_TYPES:
            tags.pop(rec.saga, None)


def _call(rec: Record, step: str, code: str | _Unreadable | None, saga_tags: tuple[str, ...] | _Unreadable | None,
          encryptor: PayloadEncryptor | None) -> RecordedCall | Unevaluable:
    tool: str | None = None
    try:
        payload = _payload(rec, encryptor)
        raw_tool = payload.get("tool")
        tool = raw_tool if isinstance(raw_tool, str) and raw_tool else None
        if tool is None:
            raise _Unreadable("malformed", f"{rec.type} seq {rec.seq} names no tool")
        if isinstance(code, _Unreadable):
            raise _Unreadable(code.why, f"{code.detail} (the code's declared semantics)")
        if isinstance(saga_tags, _Unreadable):
            raise _Unreadable(saga_tags.why, f"{saga_tags.detail} (the saga's tags)")
        if saga_tags is None:
            raise _Unreadable("no-saga-start", f"no SAGA_STARTED of saga {rec.saga} before seq {rec.seq}")
        sem = _SEMANTICS.get(code if code is not None else payload.get("semantics"))  # type: ignore[arg-type]
        if sem is None:
            raise _Unreadable("malformed", f"{rec.type} seq {rec.seq}: unknown semantics")
        if "policy_args" not in payload:
            if rec.type == _REFUSED:
                raise _Unreadable("no-policy-args", f"STEP_REFUSED seq {rec.seq} has no policy_args")
            args: Mapping[str, Any] = _EMPTY
        else:
            given = payload["policy_args"]
            if given is not None and not isinstance(given, dict):
                raise _Unreadable("malformed", f"{rec.type} seq {rec.seq}: policy_args is not an object")
            args = MappingProxyType(given) if given else _EMPTY
    except _Unreadable as exc:
        return Unevaluable(rec.saga, step, tool, rec.ts, exc.why, exc.detail)
    request = StepRequest(rec.saga, step, tool, sem, args, saga_tags, sem is ActionSemantics.COMPENSABLE)
    stage = payload.get("stage")
    return RecordedCall(request, rec.ts, None if rec.type == _INTENT else stage if isinstance(stage, str) else "")
