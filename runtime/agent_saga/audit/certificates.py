"""Rollback-safety certificates: every effect the log records was accounted for, or it names one.

Chain-intact proves the log was not altered; a certificate proves the stronger property
that the agent left nothing stranded. It reads the log through ``history.fold`` and
classifies every step whose forward call may have taken effect (a step that reached
``STEP_COMMITTED`` or ``STEP_UNKNOWN``, or whose ``STEP_INTENT`` has no outcome):

    accounted, compensated   its compensation ran (COMPENSATION_DONE), or nothing was left
                             to undo (COMPENSATION_SKIPPED with outcome NOTHING_TO_UNDO)
    accounted, terminal      the effect stands by decision, and the log says so:
                             - committed in a saga that COMPLETED (the effect was intended)
                             - ESCALATED to a human (listed: a person owns it now)
                             - COMPENSATION_SKIPPED NOT_UNDOABLE (an IRREVERSIBLE step that ran)
    NOT accounted            anything else, for example
                             - committed in a saga still IN_FLIGHT (its process died or runs on)
                             - committed in a rolled-back saga but never compensated
                             - compensation started with no outcome, or compensation failed
                             - outcome unknown (STEP_UNKNOWN, or an intent with no outcome)
                               and never resolved, even in a saga that completed

A REVERSIBLE step needs accounting only when the log recorded a compensation for it (no
compensation means nothing outside the process changed). A step whose semantics the log
cannot tell (its payloads were redacted) is treated as COMPENSABLE. ``strict`` also
refuses terminal steps that are not intended effects (escalated, not undoable).

``certify_log`` verifies every chain first: a log that fails verification is never
certified, whatever its records say. In a fleet log, a broken agent identity chain holds
back only the sagas that writer owns (the certificate fails naming it, the others are
classified), and a writer an operator quarantined is skipped and named. A saga's records
count only from its own writer and from service writers (``wal.writers``): another
agent's record of it (a forged completion) is ignored and named. A record of a type this version does not know, in
a saga, is an unaccounted finding: what it did cannot be told.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from ..chain import VerifyResult, verify_records
from ..history import (
    COMMITTED,
    COMPENSATED,
    COMPENSATING,
    COMPENSATION_FAILED,
    COMPLETED,
    ESCALATED,
    FAILED,
    IN_FLIGHT,
    INTENT,
    REFUSED,
    SKIPPED,
    UNKNOWN,
    SagaState,
    StepState,
    fold,
)
from ..records import Record, RecordType, is_known_type
from ..wal.readers import FileLogReader, LogReader
from ..wal.writers import SagaOwners, is_identity_writer
from .encryption import PayloadEncryptor, decrypting

CERTIFICATE_FORMAT = "agent-saga.certificate/v1"


@dataclass(frozen=True, slots=True)
class StepFinding:
    """One effect-bearing step and how it was (or was not) accounted for."""

    saga_id: str
    step_id: str
    tool: str
    semantics: str
    state: str
    saga_status: str
    seq: int  # the step's last record
    verdict: str  # "compensated" | "terminal" | "unaccounted"
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """The finding as JSON."""
        return {"saga": self.saga_id, "step": self.step_id, "tool": self.tool,
                "semantics": self.semantics, "state": self.state, "saga_status": self.saga_status,
                "seq": self.seq, "verdict": self.verdict, "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Certificate:
    """The outcome of ``certify``. ``ok`` only if the chain is intact and nothing is stranded.

    ``unaccounted`` names each stranded step; ``terminal`` lists effects that stand by
    decision (a human should know about escalations); ``chains`` holds each chain's
    verification (a failed one makes the certificate fail with no step findings).
    """

    ok: bool
    sagas: int
    effects: int
    compensated: int
    unaccounted: tuple[StepFinding, ...] = ()
    terminal: tuple[StepFinding, ...] = ()
    chains: tuple[tuple[str, VerifyResult], ...] = ()
    strict: bool = False
    #: writers whose sagas were not certified, each "writer W: why" (a broken agent
    #: identity chain, or quarantined by an operator: ``agent-saga wal quarantine``)
    held: tuple[str, ...] = ()
    #: the broken agent identity chains among ``chains`` (their sagas are in ``held``)
    broken: tuple[str, ...] = ()
    #: writers that wrote records of sagas they do not own (ignored: ``wal.writers``)
    foreign: tuple[str, ...] = ()

    @property
    def chain_ok(self) -> bool:
        """True if the hash chain verified (a broken agent identity chain, whose sagas
        are held, aside)."""
        return all(r.ok for n, r in self.chains if n not in self.broken)

    def describe(self) -> str:
        """One line for a human: certified, or what is missing."""
        lines: list[str] = []
        if not self.chain_ok:
            for name, r in self.chains:
                if not r.ok:
                    lines.append(f"NOT CERTIFIED: the log failed verification ({name}): {r.describe()}")
            lines.append("a tampered or damaged log is never certified; run `agent-saga verify`")
            return "\n".join(lines)
        for h in self.held:
            lines.append(f"NOT CERTIFIED {h}" if ": BROKEN" in h or ": CONTESTED" in h else f"SKIPPED      {h}")
        lines.extend(f"IGNORED      {text}" for text in self.foreign)
        for f in self.unaccounted:
            lines.append(f"UNACCOUNTED  saga {f.saga_id} step {f.step_id} ({f.tool}, {f.semantics}) "
                         f"at seq {f.seq}: {f.reason}")
        for f in self.terminal:
            lines.append(f"TERMINAL     saga {f.saga_id} step {f.step_id} ({f.tool}, {f.semantics}): {f.reason}")
        head = (
            f"CERTIFIED: {self.effects} effects in {self.sagas} sagas, every one accounted for "
            f"({self.compensated} compensated, {len(self.terminal)} terminal)"
            if self.ok
            else f"NOT CERTIFIED: {len(self.unaccounted)} of {self.effects} effects in {self.sagas} "
                 f"sagas are not accounted for"
                 + (" (strict: terminal effects that were not intended count)" if self.strict else "")
                 + (f", and the sagas of {len(self.broken)} broken writer(s) cannot be read" if self.broken else "")
        )
        return "\n".join([head, *lines])

    def to_dict(self) -> dict[str, Any]:
        """The certificate as JSON."""
        return {
            "format": CERTIFICATE_FORMAT,
            "ok": self.ok,
            "strict": self.strict,
            "chain_ok": self.chain_ok,
            "chains": [{"chain": n, "ok": r.ok, "records": r.records, "head": r.head,
                        "last_seq": r.last_seq, "reason": r.reason, "location": r.location}
                       for n, r in self.chains],
            "sagas": self.sagas,
            "effects": self.effects,
            "compensated": self.compensated,
            "unaccounted": [f.to_dict() for f in self.unaccounted],
            "terminal": [f.to_dict() for f in self.terminal],
            "held": list(self.held),
            "foreign": list(self.foreign),
        }


_NO_EFFECT = (FAILED, REFUSED)


def _skip_outcomes(records: list[Record]) -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for r in records:
        if r.type == RecordType.COMPENSATION_SKIPPED.value and r.step is not None:
            out[(r.saga, r.step)] = str((r.payload or {}).get("outcome", "?"))
    return out


def _classify(saga: SagaState, step: StepState, skip: str | None) -> tuple[str, str] | None:
    """``(verdict, reason)`` for one step, or None if it never had an effect to account for."""
    state, sem = step.state, step.semantics
    if state in _NO_EFFECT:
        return None
    if sem == "REVERSIBLE" and state in (COMMITTED, INTENT, UNKNOWN) and not step.compensation:
        return None  # nothing outside the process to undo
    if state == COMPENSATED:
        return "compensated", "compensation done"
    if state == SKIPPED:
        if skip == "NOT_UNDOABLE":
            return "terminal", "not undoable (IRREVERSIBLE): the effect stands, as declared"
        return "compensated", "nothing to undo"
    if state == ESCALATED:
        return "terminal", f"escalated to a human: {step.error or 'no reason recorded'}"
    if state == COMMITTED:
        if saga.status == COMPLETED:
            return "terminal", "committed in a completed saga: the effect was intended"
        if saga.status == IN_FLIGHT:
            return "unaccounted", (
                "committed, and its saga never finished (IN_FLIGHT: the process died or is still "
                "running); recover it (compensate or escalate) before release"
            )
        return "unaccounted", f"committed, and the saga ended {saga.status} without compensating it"
    if state == COMPENSATING:
        return "unaccounted", "compensation started and never finished: it may or may not have run"
    if state == COMPENSATION_FAILED:
        return "unaccounted", f"compensation failed and nobody took it over: {step.error or 'no error recorded'}"
    if state == UNKNOWN:
        return "unaccounted", (
            f"outcome unknown (timed out) and never resolved, in a saga that is {saga.status}: "
            f"the effect may have happened"
        )
    if state == INTENT:
        return "unaccounted", (
            f"intent written, no outcome (the process died mid-call?), in a saga that is "
            f"{saga.status}: the effect may have happened"
        )
    return "unaccounted", f"state {state} is not one certify knows"


def _unknown_findings(records: list[Record], sagas: dict[str, SagaState]) -> Iterable[StepFinding]:
    """A record of a type this version does not know, in a saga: what it did cannot be
    told, so its saga is not certified (forward compatibility: docs/wal.md)."""
    for r in records:
        saga = sagas.get(r.saga)
        if saga is None or is_known_type(r.type):
            continue  # the reserved saga ``wal`` holds no effects
        yield StepFinding(
            r.saga, r.step or "-", "?", "?", r.type, saga.status, r.seq, "unaccounted",
            f"a record of type {r.type} (seq {r.seq}) is not one this version of agent-saga knows: "
            f"what it did cannot be told, so the saga is not certified. Upgrade agent-saga to read it",
        )


def certify(records: Iterable[Record], *, strict: bool = False) -> Certificate:
    """Classify every effect in ``records`` (log order, payloads in plaintext).

    Does not verify the chain: use ``certify_log`` (or the CLI) for evidence. ``strict``
    also fails escalated and not-undoable effects.
    """
    recs = list(records)
    sagas = fold(recs)
    skips = _skip_outcomes(recs)
    unaccounted: list[StepFinding] = list(_unknown_findings(recs, sagas))
    terminal: list[StepFinding] = []
    effects, compensated = len(unaccounted), 0  # an unreadable record may hide an effect
    for saga in sagas.values():
        for step in saga.steps.values():
            got = _classify(saga, step, skips.get((saga.saga_id, step.step_id)))
            if got is None:
                continue
            verdict, reason = got
            effects += 1
            finding = StepFinding(saga.saga_id, step.step_id, step.tool, step.semantics, step.state,
                                  saga.status, step.last_seq, verdict, reason)
            if verdict == "compensated":
                compensated += 1
            elif verdict == "terminal" and strict and step.state != COMMITTED:
                unaccounted.append(replace(finding, verdict="unaccounted", reason=f"strict: {reason}"))
            elif verdict == "terminal":
                terminal.append(finding)
            else:
                unaccounted.append(finding)
    return Certificate(
        ok=not unaccounted, sagas=len(sagas), effects=effects, compensated=compensated,
        unaccounted=tuple(unaccounted), terminal=tuple(terminal), strict=strict,
    )


def certify_log(
    reader: LogReader, *, strict: bool = False, encryptor: PayloadEncryptor | None = None
) -> Certificate:
    """Verify every chain of the log, then ``certify`` it. A broken chain is never certified.

    Encrypted payloads are opened with ``encryptor``; without it the first encrypted record
    raises ``WALKeyMissing`` (a certificate over payloads it cannot read would be a guess).
    """
    quarantined = reader.quarantined()
    chains = tuple((name, verify_records(reader.chain(name))) for name in reader.chains() if name not in quarantined)
    fleet = not isinstance(reader, FileLogReader)
    # A broken agent identity chain holds back only the sagas that writer owns; a broken
    # service chain (recovery's, whose records close other agents' sagas) fails the log.
    broken = {n: r for n, r in chains if not r.ok and fleet and is_identity_writer(n)}
    held = tuple(
        [f"writer {n}: BROKEN ({r.location}: {r.reason}); its sagas are not certified until it is repaired "
         f"or quarantined (`agent-saga wal quarantine`)" for n, r in broken.items()]
        + [f"writer {w}: QUARANTINED by {q.get('by') or '?'} ({q.get('reason') or 'no reason given'}); its "
           f"sagas are not certified" for w, q in sorted(quarantined.items())])
    if not all(r.ok for n, r in chains if n not in broken):
        return Certificate(ok=False, sagas=0, effects=0, compensated=0, chains=chains, strict=strict, held=held,
                           broken=tuple(broken))
    owners = SagaOwners()
    bound = [r for r in reader.records(skip=frozenset(broken) | quarantined.keys()) if owners.admit(r)]
    contested = owners.contested  # complete only once every record was read
    cert = certify(decrypting((r for r in bound if r.saga not in contested), encryptor), strict=strict)
    held += tuple(f"saga {s}: CONTESTED: {why}; not certified, a human decides" for s, why in sorted(contested.items()))
    return Certificate(
        ok=cert.ok and not broken and not contested, sagas=cert.sagas, effects=cert.effects,
        compensated=cert.compensated, unaccounted=cert.unaccounted, terminal=cert.terminal, chains=chains,
        strict=strict, held=held, broken=tuple(broken), foreign=tuple(owners.foreign.describe()),
    )
