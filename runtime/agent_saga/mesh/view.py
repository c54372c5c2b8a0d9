"""MeshView: what a merged ``RecordSet`` says -- each device's chain, the conflicts, one order.

- Each device's chain is verified on its own, by the same rules as a single log
  (``chain.verify_records``): the merge never re-chains a record, so a device's records
  verify in the merged view exactly as on the device. A second version of a record under
  the same ``(device, seq)`` is a fork: the chain is reported broken at that seq, naming
  every version and which of them fails its own integrity check (a tampered copy) or
  whether they all hold up (the device's log was rewritten, or two writers used its id).
- Conflicts are reported, never resolved: every side is kept and named.
  ``fork``     one device, one seq, more than one record;
  ``saga``     more than one device started the same saga;
  ``step``     more than one device acted on the same step (intent, commit, failure,
               compensation);
  ``outcome``  a saga ended one way on one device and another way elsewhere;
  ``entity``   more than one saga (or device) claimed the same entity (``MESH_CLAIM``).
- The display order is total and deterministic: ``(lamport, device, seq, fingerprint)``.
  ``lamport`` is the device's Lamport clock stamped in the record's payload (a record a
  device wrote after it observed another record has a larger clock), so the order never
  puts an effect before what its device had seen; a record without a stamp takes the
  clock of the device's record before it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from ..chain import VerifyResult, check_record, verify_records
from ..records import GENESIS, TERMINAL_SAGA_TYPES, Record, RecordType
from .device import MESH_CLAIM
from .gset import Key, RecordSet, stamp

#: Record types by which a device acts on a step.
STEP_ACTS = frozenset(
    t.value
    for t in (
        RecordType.STEP_INTENT, RecordType.STEP_COMMITTED, RecordType.STEP_FAILED,
        RecordType.STEP_UNKNOWN, RecordType.COMPENSATION_STARTED, RecordType.COMPENSATION_DONE,
        RecordType.COMPENSATION_FAILED,
    )
)


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a conflict: a record, where it came from, and its own problem if any."""

    device: str
    seq: int
    type: str
    saga: str
    step: str | None
    hash: str
    problem: str | None = None

    def describe(self) -> str:
        """``device dev-a seq 4 STEP_COMMITTED (saga s-1 step s-1/0) hash 1a2b…``."""
        where = f"saga {self.saga}" + (f" step {self.step}" if self.step else "")
        tail = f": {self.problem}" if self.problem else ""
        return f"device {self.device} seq {self.seq} {self.type} ({where}) hash {self.hash[:12]}…{tail}"

    def to_dict(self) -> dict[str, Any]:
        """The side as JSON."""
        return {
            "device": self.device, "seq": self.seq, "type": self.type, "saga": self.saga,
            "step": self.step, "hash": self.hash, "problem": self.problem,
        }


@dataclass(frozen=True, slots=True)
class Conflict:
    """Two or more records that cannot all stand; every side is kept."""

    kind: str  # fork | saga | step | outcome | entity
    subject: str
    sides: tuple[Side, ...]

    def describe(self) -> str:
        """One line per side under a headline."""
        return f"CONFLICT {self.kind}: {self.subject}\n" + "\n".join(
            f"  - {s.describe()}" for s in self.sides
        )

    def to_dict(self) -> dict[str, Any]:
        """The conflict as JSON."""
        return {"kind": self.kind, "subject": self.subject, "sides": [s.to_dict() for s in self.sides]}


def _side(device: str, rec: Record, problem: str | None = None) -> Side:
    return Side(device, rec.seq, rec.type, rec.saga, rec.step, rec.hash, problem)


class MeshView:
    """The merged view of a ``RecordSet``: per-device verification, conflicts, order."""

    def __init__(self, records: RecordSet) -> None:
        self.records = records
        self._by_device: dict[str, list[tuple[Key, Record]]] = defaultdict(list)
        for key, rec in records.items():
            self._by_device[key[0]].append((key, rec))
        self.chains: dict[str, VerifyResult] = {}
        forks: list[Conflict] = []
        for device, items in sorted(self._by_device.items()):
            result, fork = _verify_device(device, items)
            self.chains[device] = result
            forks.extend(fork)
        self.conflicts: list[Conflict] = sorted(
            forks + self._cross_device(), key=lambda c: (c.kind, c.subject)
        )

    @property
    def ok(self) -> bool:
        """Every device's chain verifies and nothing conflicts."""
        return not self.conflicts and all(r.ok for r in self.chains.values())

    def ordered(self) -> list[tuple[str, Record]]:
        """Every record as ``(device, record)`` in the display order (module doc)."""
        keyed: list[tuple[tuple[int, str, int, str], Record]] = []
        for device, items in self._by_device.items():
            clock = 0
            for key, rec in items:
                s = stamp(rec)
                lam = s.get("lamport") if s else None
                if isinstance(lam, int) and not isinstance(lam, bool):
                    clock = max(clock, lam)
                keyed.append(((clock, device, rec.seq, key[2]), rec))
        keyed.sort(key=lambda x: x[0])
        return [(k[1], rec) for k, rec in keyed]

    def _cross_device(self) -> list[Conflict]:
        started: dict[str, dict[str, Record]] = defaultdict(dict)
        acted: dict[tuple[str, str], dict[str, Record]] = defaultdict(dict)
        ended: dict[str, dict[tuple[str, str], Record]] = defaultdict(dict)
        claims: dict[str, dict[tuple[str, str], Record]] = defaultdict(dict)
        for (device, _seq, _fp), rec in self.records.items():
            if rec.type == RecordType.SAGA_STARTED.value:
                started[rec.saga].setdefault(device, rec)
            elif rec.type in STEP_ACTS and rec.step is not None:
                acted[(rec.saga, rec.step)].setdefault(device, rec)
            elif rec.type in TERMINAL_SAGA_TYPES:
                ended[rec.saga].setdefault((rec.type, device), rec)
            elif rec.type == MESH_CLAIM and isinstance(rec.payload, dict):
                entity = rec.payload.get("entity")
                if isinstance(entity, str):
                    claims[entity].setdefault((device, rec.saga), rec)
        out: list[Conflict] = []
        for saga, devs in started.items():
            if len(devs) > 1:
                out.append(Conflict(
                    "saga", f"saga {saga} was started on {len(devs)} devices",
                    tuple(_side(d, r) for d, r in sorted(devs.items())),
                ))
        for (saga, step), devs in acted.items():
            if len(devs) > 1:
                out.append(Conflict(
                    "step", f"saga {saga} step {step} was acted on by {len(devs)} devices",
                    tuple(_side(d, r) for d, r in sorted(devs.items())),
                ))
        for saga, ends in ended.items():
            if len({t for t, _d in ends}) > 1:
                out.append(Conflict(
                    "outcome", f"saga {saga} ended as {' and '.join(sorted({t for t, _ in ends}))}",
                    tuple(_side(d, r) for (_t, d), r in sorted(ends.items(), key=lambda x: (x[0][1], x[0][0]))),
                ))
        for entity, by in claims.items():
            if len(by) > 1:
                out.append(Conflict(
                    "entity", f"entity {entity} was claimed {len(by)} times",
                    tuple(_side(d, r) for (d, _s), r in sorted(by.items())),
                ))
        return out


def _verify_device(device: str, items: list[tuple[Key, Record]]) -> tuple[VerifyResult, list[Conflict]]:
    """Verify one device's chain; a fork breaks it at the first forked seq."""
    by_seq: dict[int, list[Record]] = defaultdict(list)
    for _key, rec in items:
        by_seq[rec.seq].append(rec)
    forks = {s: recs for s, recs in by_seq.items() if len(recs) > 1}
    loc = f"device {device}"
    if not forks:
        return verify_records((f"{loc} seq {r.seq}", r) for _k, r in items), []
    conflicts: list[Conflict] = []
    for seq in sorted(forks):
        before = by_seq.get(seq - 1, [])
        prev = GENESIS if seq == 1 else (before[0].hash if len(before) == 1 else None)
        sides = []
        for rec in forks[seq]:
            problem = check_record(rec, rec.prev if prev is None else prev, None)
            sides.append(_side(device, rec, problem))
        conflicts.append(Conflict("fork", f"device {device} has {len(sides)} versions of seq {seq}", tuple(sides)))
    first = min(forks)
    prefix = verify_records((f"{loc} seq {r.seq}", r) for _k, r in items if r.seq < first)
    if not prefix.ok:
        return prefix, conflicts
    versions = conflicts[0].sides
    bad = [s for s in versions if s.problem]
    why = (
        f"{len(bad)} of the {len(versions)} versions fail their own check "
        f"({'; '.join(f'hash {s.hash[:12]}…: {s.problem}' for s in bad)}): a copy was tampered with"
        if bad else
        f"all {len(versions)} versions hold up on their own (hashes "
        f"{', '.join(s.hash[:12] + '…' for s in versions)}): the device's log was rewritten, "
        f"or two writers used its id"
    )
    return VerifyResult(
        False, prefix.records, prefix.head, prefix.last_seq, first, f"{loc} seq {first}",
        f"the chain forks at seq {first}: {why}",
    ), conflicts
