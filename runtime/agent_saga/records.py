"""WAL records: the types, the value object and the line codec (schema ``v`` = 1).

A record on disk is one line of JSON with a fixed field order::

    {"v":1,"seq":7,"ts":1764470000123456,"type":"STEP_INTENT","saga":"s-1","step":"s-1/0",
     "payload":{...},"salt":"<32 hex>","digest":"<64 hex>","prev":"<64 hex>","hash":"<64 hex>"}

Invariants:
- ``seq`` is assigned by the writer, strictly increasing by one within one writer's log.
- ``ts`` is integer microseconds since the epoch (integers hash identically in every language).
- ``saga`` and ``step`` match ``ID_PATTERN``; ``type`` is an upper snake-case name: the one
  table of those this version writes is ``RecordType`` (the engine's) and
  ``ExtensionType`` (the other writers'); a newer writer may add others, see
  ``is_known_type``. Code names a type through that table, never by a string of its own.
  None of them can contain a newline, which the chain relies on.
- ``payload`` is a JSON object; credentials never appear in it (references only; the
  scrubber run by ``chain.seal`` redacts any that slip in). Ids with a credential format
  are refused by ``validate_id``.
- ``salt``/``digest``/``prev``/``hash`` are the hash chain (see ``agent_saga.chain``).
- A redacted record has ``payload`` and ``salt`` null and ``"redacted": true``.
- Fields stamped after the fact by a backend (for example ``gseq``) are not hashed.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .errors import ConfigurationError, SecretDetected, WALCorrupt
from .scrubber import secret_kind

SCHEMA_VERSION = 1

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:@/+=-]{0,199}$")
TYPE_PATTERN = re.compile(r"^[A-Z][A-Z0-9_]{0,63}$")


class RecordType(enum.StrEnum):
    """What a record says happened. Values are stable: they are the on-disk names."""

    SAGA_STARTED = "SAGA_STARTED"
    STEP_INTENT = "STEP_INTENT"  # durable before the forward call of a non-REVERSIBLE step
    STEP_RETRY = "STEP_RETRY"  # one failed attempt; the step is retried under the same key
    STEP_FALLBACK = "STEP_FALLBACK"  # retries exhausted; fallback_action runs
    STEP_COMMITTED = "STEP_COMMITTED"  # the forward returned; carries the compensation
    STEP_FAILED = "STEP_FAILED"  # the forward raised: it did not complete
    STEP_UNKNOWN = "STEP_UNKNOWN"  # the forward timed out: it may have happened
    STEP_REFUSED = "STEP_REFUSED"  # a control refused the step: it did not happen
    GATE_VERDICT = "GATE_VERDICT"
    COMPENSATION_STARTED = "COMPENSATION_STARTED"
    COMPENSATION_DONE = "COMPENSATION_DONE"
    COMPENSATION_FAILED = "COMPENSATION_FAILED"
    COMPENSATION_SKIPPED = "COMPENSATION_SKIPPED"  # nothing to undo, or not undoable
    ESCALATED = "ESCALATED"  # handed to a human: never guessed
    SAGA_COMPLETED = "SAGA_COMPLETED"
    SAGA_ROLLED_BACK = "SAGA_ROLLED_BACK"  # rollback finished clean
    SAGA_ROLLBACK_PARTIAL = "SAGA_ROLLBACK_PARTIAL"  # rollback left something not restored
    SAGA_LEASE = "SAGA_LEASE"  # the owner is alive (renewed while running)
    COMPACTION = "COMPACTION"  # attestation of sequences removed by compact()


TERMINAL_SAGA_TYPES = frozenset(
    {
        RecordType.SAGA_COMPLETED.value,
        RecordType.SAGA_ROLLED_BACK.value,
        RecordType.SAGA_ROLLBACK_PARTIAL.value,
    }
)

class ExtensionType(enum.StrEnum):
    """Record types written by parts of the library other than the engine (WAL, audit, the
    controls, recovery). Values are stable on-disk names. Writers and readers refer to
    these members; ``tests/unit/chain/test_record_types.py`` pins the table to the writers."""

    # the WAL itself and audit (reserved saga ``wal``)
    WAL_TORN_TAIL = "WAL_TORN_TAIL"
    RECORD_REJECTED = "RECORD_REJECTED"
    COMPACTION_FAILED = "COMPACTION_FAILED"
    REDACTION = "REDACTION"
    # the kill switch and the breaker (reserved saga ``wal``)
    KILL_SWITCH_ENGAGED = "KILL_SWITCH_ENGAGED"
    KILL_SWITCH_LIFTED = "KILL_SWITCH_LIFTED"
    KILL_SWITCH_FAILED_CLOSED = "KILL_SWITCH_FAILED_CLOSED"
    KILL_SWITCH_DEGRADED = "KILL_SWITCH_DEGRADED"
    KILL_SWITCH_RESTORED = "KILL_SWITCH_RESTORED"
    BREAKER_OPENED = "BREAKER_OPENED"
    BREAKER_PROBE = "BREAKER_PROBE"
    BREAKER_CLOSED = "BREAKER_CLOSED"
    # approvals, in the saga that waits
    APPROVAL_REQUESTED = "APPROVAL_REQUESTED"
    APPROVAL_RESUMED = "APPROVAL_RESUMED"
    APPROVAL_ESCALATED = "APPROVAL_ESCALATED"
    APPROVAL_DECIDED = "APPROVAL_DECIDED"
    APPROVAL_BREAK_GLASS = "APPROVAL_BREAK_GLASS"
    # recovery, in the saga it resolves or freezes
    RECOVERY_STARTED = "RECOVERY_STARTED"
    STEP_RECONCILED = "STEP_RECONCILED"
    SAGA_QUARANTINED = "SAGA_QUARANTINED"
    SAGA_QUARANTINE_LIFTED = "SAGA_QUARANTINE_LIFTED"
    # the router and the context broker (reserved saga ``wal``)
    ROUTING_DECISION = "ROUTING_DECISION"
    ROUTING_REFUSED = "ROUTING_REFUSED"
    MODEL_ACTION_REPAIRED = "MODEL_ACTION_REPAIRED"
    MODEL_ACTION_REFUSED = "MODEL_ACTION_REFUSED"
    CONTEXT_SERVED = "CONTEXT_SERVED"
    CONTEXT_EVICTED = "CONTEXT_EVICTED"
    # the agent loop, in the saga of its run
    LOOP_STEP = "LOOP_STEP"
    LOOP_STOPPED = "LOOP_STOPPED"
    # an offline mesh device claims an entity, in the saga that claims it
    MESH_CLAIM = "MESH_CLAIM"


#: The extension types' names (``ExtensionType``): what a reader checks a type against.
EXTENSION_TYPES = frozenset(t.value for t in ExtensionType)

#: Every record type this version of agent-saga writes, so can read.
KNOWN_TYPES = frozenset(t.value for t in RecordType) | EXTENSION_TYPES


def is_known_type(type_: str) -> bool:
    """True if this version knows what a record of ``type_`` means.

    The forward-compatibility rule (docs/wal.md): a record of an unknown type is still
    part of the chain and verified like any other; ``verify`` and ``inspect`` report it,
    ``certify`` does not certify its saga, and recovery does not act on a saga holding one.
    """
    return type_ in KNOWN_TYPES


_ZERO = "0" * 64
GENESIS = _ZERO


@dataclass(slots=True)
class Record:
    """One WAL record. ``seq``/``ts`` and the chain fields are filled in by the writer."""

    type: str
    saga: str
    step: str | None
    payload: dict[str, Any] | None
    seq: int = 0
    ts: int = 0
    salt: str | None = None
    digest: str = ""
    prev: str = ""
    hash: str = ""
    redacted: bool = False
    extra: dict[str, Any] = field(default_factory=dict)  # unhashed stamps, e.g. gseq
    #: Returns the payload's canonical text, built and scrubbed by its producer
    #: (``BaseWAL.append_prepared``; ``payload`` is then None until sealed): the seal takes
    #: the text as it is. Never written itself.
    encode: Callable[[], str] | None = field(default=None, compare=False, repr=False)

    def to_dict(self) -> dict[str, Any]:
        """The record as the JSON object of its line."""
        d: dict[str, Any] = {
            "v": SCHEMA_VERSION,
            "seq": self.seq,
            "ts": self.ts,
            "type": self.type,
            "saga": self.saga,
            "step": self.step,
            "payload": self.payload,
            "salt": self.salt,
            "digest": self.digest,
            "prev": self.prev,
            "hash": self.hash,
        }
        if self.redacted:
            d["redacted"] = True
        if self.extra:
            d.update(self.extra)
        return d


def validate_id(value: str, what: str) -> str:
    """Return ``value`` if it is a valid saga/step id, else raise naming the field and fix.

    An id is a record header, hashed and never redactable, so one that contains a
    credential format raises ``SecretDetected`` (the message does not repeat it).
    """
    if not isinstance(value, str) or not ID_PATTERN.match(value):
        raise ConfigurationError(
            f"{what} {value!r} is not a valid id: use 1-200 characters from "
            f"[A-Za-z0-9._:@/+=-], starting with a letter or digit"
        )
    kind = secret_kind(value)
    if kind is not None:
        raise SecretDetected(
            f"{what} looks like a secret (it contains {kind}); ids are written in every "
            f"record header of the WAL: choose a name that holds no credential",
            key=what,
        )
    return value


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
)


def _c_encoder() -> Any:
    """The C encoder behind ``_CANONICAL``, built directly (``JSONEncoder.encode`` builds
    one per call through two Python frames), or None where this Python's differs."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None

    def build() -> Any:
        # A fresh ``markers`` dict per call: the circular-reference check stays exact.
        return make({}, _CANONICAL.default, json.encoder.encode_basestring, None, ":", ",", True, False, False)

    try:
        probe: Any = {"b": [1, 2.5, None, True], "a": "é\n\"", "c": {"z": 1e300, "y": -0.0}}
        if "".join(build()(probe, 0)) != _CANONICAL.encode(probe):
            return None
    except Exception:  # noqa: BLE001 - another signature: use the public path
        return None
    return build


_BUILD = _c_encoder()


def canonical_json(obj: Any) -> str:
    """The canonical text of a payload: sorted keys, no spaces, UTF-8, no NaN."""
    if _BUILD is None or obj.__class__ is str:
        return _CANONICAL.encode(obj)
    return "".join(_BUILD()(obj, 0))


def encode_line(rec: Record, canonical_payload: str | None = None) -> bytes:
    """Encode ``rec`` as one newline-terminated JSON line (fixed field order)."""
    return (line_text(rec, canonical_payload) + "\n").encode()


def line_text(rec: Record, canonical_payload: str | None = None) -> str:
    """``encode_line`` as text, without its newline (a writer encodes a batch at once)."""
    if canonical_payload is None:
        canonical_payload = "null" if rec.payload is None else canonical_json(rec.payload)
    step = "null" if rec.step is None else f'"{rec.step}"'
    salt = "null" if rec.salt is None else f'"{rec.salt}"'
    tail = ""
    if rec.redacted:
        tail += ',"redacted":true'
    if rec.extra:
        tail += "," + canonical_json(rec.extra)[1:-1]
    # saga/step/type match patterns with no characters that need JSON escaping.
    return (
        f'{{"v":{SCHEMA_VERSION},"seq":{rec.seq},"ts":{rec.ts},"type":"{rec.type}",'
        f'"saga":"{rec.saga}","step":{step},"payload":{canonical_payload},"salt":{salt},'
        f'"digest":"{rec.digest}","prev":"{rec.prev}","hash":"{rec.hash}"{tail}}}'
    )


_KNOWN = frozenset(
    {"v", "seq", "ts", "type", "saga", "step", "payload", "salt", "digest", "prev", "hash", "redacted"}
)


_DECODE = json.JSONDecoder().decode  # what ``json.loads`` of a ``str`` runs, without its frame


def decode_line(line: bytes | str, location: str) -> Record:
    """Decode one JSON line into a ``Record``.

    Raises ``WALCorrupt`` naming ``location`` (for example ``"wal.jsonl line 12"``) and
    the missing or malformed field; nothing is guessed.
    """
    # The common line, read as ``json.loads`` reads it: UTF-8 bytes (an object's first
    # byte, then no NUL: what ``json.detect_encoding`` calls UTF-8) with every field of
    # the type it must have and nothing beyond the known ones. Anything else takes the
    # full path below, which names what is wrong.
    d: Any = None
    try:
        if line.__class__ is bytes:
            if line[:1] == b"{" and line[1:2] != b"\x00":
                d = _DECODE(line.decode("utf-8", "surrogatepass"))
        elif line.__class__ is str:
            d = _DECODE(line)
    except ValueError:  # UnicodeDecodeError and JSONDecodeError both: the full path names it
        d = None
    if d.__class__ is dict and d.keys() <= _KNOWN and d.get("v") == SCHEMA_VERSION:
        try:
            step, payload, seq, ts = d["step"], d["payload"], d["seq"], d["ts"]
            if (
                seq.__class__ is int and ts.__class__ is int
                and d["type"].__class__ is str and d["saga"].__class__ is str
                and d["digest"].__class__ is str and d["prev"].__class__ is str and d["hash"].__class__ is str
                and (step is None or step.__class__ is str) and (payload is None or payload.__class__ is dict)
            ):
                return Record(
                    type=d["type"], saga=d["saga"], step=step, payload=payload, seq=seq, ts=ts,
                    salt=d["salt"], digest=d["digest"], prev=d["prev"], hash=d["hash"],
                    redacted=bool(d.get("redacted", False)), extra={},
                )
        except KeyError:
            pass
    return _decode_line(line, location)


def _decode_line(line: bytes | str, location: str) -> Record:
    try:
        d = json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise WALCorrupt(
            f"{location}: not valid JSON ({exc}); the record cannot be read. Run "
            f"`agent-saga verify` to locate damage; do not delete the line by hand, a gap "
            f"breaks the hash chain",
            location=location,
        ) from exc
    if not isinstance(d, dict):
        raise WALCorrupt(f"{location}: a record must be a JSON object", location=location)
    try:
        if d["v"] != SCHEMA_VERSION:
            raise WALCorrupt(
                f"{location}: schema version v={d['v']!r} is not supported by this reader "
                f"(supports v={SCHEMA_VERSION}); upgrade agent-saga to read it",
                location=location,
            )
        rec = Record(
            type=_str(d, "type", location),
            saga=_str(d, "saga", location),
            step=d["step"],
            payload=d["payload"],
            seq=_int(d, "seq", location),
            ts=_int(d, "ts", location),
            salt=d["salt"],
            digest=_str(d, "digest", location),
            prev=_str(d, "prev", location),
            hash=_str(d, "hash", location),
            redacted=bool(d.get("redacted", False)),
            extra={k: v for k, v in d.items() if k not in _KNOWN},
        )
    except KeyError as exc:
        raise WALCorrupt(
            f"{location}: record is missing required field {exc.args[0]!r}", location=location
        ) from exc
    if rec.step is not None and not isinstance(rec.step, str):
        raise WALCorrupt(f"{location}: field 'step' must be a string or null", location=location)
    if rec.payload is not None and not isinstance(rec.payload, dict):
        raise WALCorrupt(f"{location}: field 'payload' must be an object or null", location=location)
    return rec


def _str(d: dict[str, Any], key: str, location: str) -> str:
    v = d[key]
    if not isinstance(v, str):
        raise WALCorrupt(f"{location}: field {key!r} must be a string, got {v!r}", location=location)
    return v


def _int(d: dict[str, Any], key: str, location: str) -> int:
    v = d[key]
    if not isinstance(v, int) or isinstance(v, bool):
        raise WALCorrupt(f"{location}: field {key!r} must be an integer, got {v!r}", location=location)
    return v
