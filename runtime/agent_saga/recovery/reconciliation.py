"""The reconciliation pass: ask the system of record whether what the log says is true.

A 200 is an acknowledgement, not a fact about the ledger. ``reconcile_log`` ignores what
the log concluded and, for every effect it should be able to vouch for, asks the
``@reconciler`` registered for it:

    undone    the log says the step was compensated (``COMPENSATION_DONE``): the
              compensation handler's reconciler, over the compensation kwargs (else the
              tool's, over the forward kwargs), must say ``reversed_=True``
    in doubt  the forward call died or timed out (no ``STEP_COMMITTED``) and nothing the
              log holds undid it: the tool's reconciler, over the forward kwargs and the
              forward idempotency key, must say it did not land (``exists=False``) or that
              it is reversed (``reversed_=True``)

Each check ends ``CONFIRMED``, ``DRIFT`` (the system contradicts the log: the refund did
not apply, the timed-out charge landed and stands) or ``UNVERIFIABLE`` (no reconciler,
the reconciler raised, timed out, or answered ``None``). Unverifiable is never counted as
confirmed: ``exit_code`` is 0 only when every check confirmed, 1 on any drift, 3 when no
drift was seen but something could not be verified.

Invariants:
- Reading only: the pass writes nothing to the log and runs no compensation.
- Checks run one at a time, at most ``rate`` per second (each starts at least ``1/rate``
  after the previous one returned), each bounded by ``timeout``.
- A finding's text and JSON carry the observation's detail with credentials redacted.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..executor import ToolExecutor, get_tool_executor
from ..idempotency import COMPENSATION_SCOPE, FORWARD_SCOPE, idempotency_key
from ..invoke import Expired, call
from ..payloads import describe_error
from ..records import TERMINAL_SAGA_TYPES, Record
from .plan import _collect
from .reconcilers import Observation, coerce_observation, get_reconciler

__all__ = ["Check", "Finding", "ReconcileReport", "Verdict", "plan_checks", "reconcile_log", "run_checks"]


class Verdict(enum.StrEnum):
    """What the system of record said about one effect."""

    CONFIRMED = "CONFIRMED"
    DRIFT = "DRIFT"
    UNVERIFIABLE = "UNVERIFIABLE"


@dataclass(frozen=True, slots=True)
class Check:
    """One question for a reconciler: ``kind`` is ``undone`` or ``in_doubt``."""

    saga_id: str
    step_id: str
    tool: str
    kind: str
    handler: str | None  # the compensation handler (undone checks)
    kwargs: Mapping[str, Any]
    key: str
    fallback_kwargs: Mapping[str, Any] | None = None  # the forward kwargs, for the tool's reconciler
    fallback_key: str | None = None
    saga_status: str = "IN_FLIGHT"


@dataclass(frozen=True, slots=True)
class Finding:
    """The answer to one ``Check``: the reconciler asked, what it saw, the verdict."""

    check: Check
    verdict: Verdict
    reconciler: str | None
    message: str
    observed: dict[str, Any] | None = None

    def line(self) -> str:
        """One line for a human, e.g. ``[DRIFT] stripe.charge: ...``."""
        tag = {"CONFIRMED": "OK", "DRIFT": "DRIFT", "UNVERIFIABLE": "UNVERIFIABLE"}[self.verdict.value]
        c = self.check
        live = ", IN_FLIGHT" if c.saga_status == "IN_FLIGHT" else ""
        return f"[{tag}] {c.tool}: {self.message} (saga {c.saga_id}{live}, step {c.step_id}, reconciler {self.reconciler or '-'})"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (``agent-saga reconcile --json``)."""
        c = self.check
        return {
            "saga": c.saga_id, "step": c.step_id, "tool": c.tool, "check": c.kind,
            "handler": c.handler, "reconciler": self.reconciler, "saga_status": c.saga_status,
            "verdict": self.verdict.value, "message": self.message, "observed": self.observed,
        }


@dataclass(slots=True)
class ReconcileReport:
    """Every finding of one pass, in log order (newest step of a saga first)."""

    findings: list[Finding] = field(default_factory=list)

    def count(self, verdict: Verdict) -> int:
        """How many findings have ``verdict``."""
        return sum(1 for f in self.findings if f.verdict is verdict)

    @property
    def exit_code(self) -> int:
        """0 every check confirmed (or nothing to check); 1 drift; 3 something unverifiable."""
        if self.count(Verdict.DRIFT):
            return 1
        return 3 if self.count(Verdict.UNVERIFIABLE) else 0

    def summary(self) -> str:
        """One line: the counts, and what they mean."""
        n, ok = len(self.findings), self.count(Verdict.CONFIRMED)
        drift, unv = self.count(Verdict.DRIFT), self.count(Verdict.UNVERIFIABLE)
        if n == 0:
            return "nothing to reconcile: the log holds no undone or in-doubt effect"
        head = f"{n} effect(s) checked: {ok} confirmed, {drift} drift, {unv} unverifiable"
        if drift:
            return head + " - the system of record contradicts the log"
        if unv == n:
            return head + " - nothing could be verified; this is not a clean result"
        if unv:
            return head + " - not clean: unverifiable is never counted as confirmed"
        return head + " - clean"

    def to_dict(self) -> dict[str, Any]:
        """The JSON form."""
        return {
            "exit_code": self.exit_code, "summary": self.summary(),
            "confirmed": self.count(Verdict.CONFIRMED), "drift": self.count(Verdict.DRIFT),
            "unverifiable": self.count(Verdict.UNVERIFIABLE),
            "findings": [f.to_dict() for f in self.findings],
        }


def plan_checks(records: Iterable[Record], *, since_us: int | None = None) -> list[Check]:
    """The checks for a log (see the module doc); sagas that started before ``since_us``
    (µs since the epoch) are left out."""
    sagas: dict[str, list[Record]] = {}
    started: dict[str, int] = {}
    status: dict[str, str] = {}
    for rec in records:
        sagas.setdefault(rec.saga, []).append(rec)
        started.setdefault(rec.saga, rec.ts)
        if rec.type in TERMINAL_SAGA_TYPES:
            status[rec.saga] = rec.type.removeprefix("SAGA_")
    out: list[Check] = []
    for saga_id, recs in sagas.items():
        if since_us is not None and started[saga_id] < since_us:
            continue
        for f in _collect(recs):
            if f.intent is None or f.outcome in ("FAILED", "REFUSED"):
                continue
            args = (f.intent or {}).get("policy_args")
            fwd_kwargs = args if isinstance(args, dict) else {}
            fwd_key = str((f.intent or {}).get("idempotency_key") or idempotency_key(saga_id, f.step_id, FORWARD_SCOPE))
            common: dict[str, Any] = {"saga_id": saga_id, "step_id": f.step_id, "tool": f.tool, "saga_status": status.get(saga_id, "IN_FLIGHT")}
            if f.rollback == "DONE" and isinstance(f.descriptor, dict):
                kw = f.descriptor.get("kwargs")
                out.append(Check(
                    **common, kind="undone", handler=f.descriptor.get("handler"),
                    kwargs=kw if isinstance(kw, dict) else {},
                    key=idempotency_key(saga_id, f.step_id, COMPENSATION_SCOPE),
                    fallback_kwargs=fwd_kwargs, fallback_key=fwd_key,
                ))
            elif f.outcome != "COMMITTED":
                out.append(Check(**common, kind="in_doubt", handler=None, kwargs=fwd_kwargs, key=fwd_key))
    return out


async def run_checks(
    checks: Iterable[Check],
    *,
    timeout: float = 10.0,
    rate: float | None = None,
    executor: ToolExecutor | None = None,
) -> ReconcileReport:
    """Ask each check's reconciler, one at a time (at most ``rate`` per second, each within
    ``timeout`` seconds); never raises for what a reconciler does."""
    ex = executor or get_tool_executor()
    report = ReconcileReport()
    interval = 1.0 / rate if rate else 0.0
    next_at = time.monotonic()
    for check in checks:
        if interval:
            # The rate limit: the next call waits 1/rate after the previous one returned, so
            # calls start at least 1/rate apart however late a call's own start is scheduled
            # (the loop may wake a little early: wait until the monotonic clock says so).
            while (delay := next_at - time.monotonic()) > 0:  # noqa: ASYNC110 - a deadline, not an event
                await asyncio.sleep(delay)
        report.findings.append(await _one(check, timeout, ex))
        next_at = time.monotonic() + interval
    return report


def reconcile_log(
    records: Iterable[Record], *, since_us: int | None = None, timeout: float = 10.0, rate: float | None = None
) -> ReconcileReport:
    """``plan_checks`` then ``run_checks``, on a new event loop (the CLI's entry point)."""
    checks = plan_checks(records, since_us=since_us)
    return asyncio.run(run_checks(checks, timeout=timeout, rate=rate))


async def _one(check: Check, timeout: float, ex: ToolExecutor) -> Finding:
    name: str = check.handler or check.tool
    kwargs, key = check.kwargs, check.key
    fn = get_reconciler(name)
    if fn is None and check.handler:  # an undone check: the tool's reconciler, over the forward kwargs
        name, kwargs, key = check.tool, check.fallback_kwargs or {}, check.fallback_key or check.key
        fn = get_reconciler(name)
    if fn is None:
        asked = f"{check.handler!r} or {check.tool!r}" if check.handler else repr(check.tool)
        return Finding(check, Verdict.UNVERIFIABLE, None, f"no @reconciler registered for {asked}: import the module that declares it (--import)")
    try:
        obs = coerce_observation(await call(fn, kwargs, key, ex, timeout), name)
    except Expired:
        return Finding(check, Verdict.UNVERIFIABLE, name, f"the reconciler did not answer within {timeout}s")
    except Exception as exc:  # noqa: BLE001 - could not check: unverifiable, never fine
        err = describe_error(exc)
        return Finding(check, Verdict.UNVERIFIABLE, name, f"the reconciler raised {err['error_type']}: {err['message']}")
    return _judge(check, name, obs)


def _judge(check: Check, name: str, obs: Observation) -> Finding:
    seen = obs.to_dict()
    facts = ", ".join(f"{k}={seen[k]}" for k in ("amount", "detail") if seen[k] not in (None, ""))
    tail = f" ({facts})" if facts else ""
    if check.kind == "undone":
        if obs.reversed_ is True:
            return Finding(check, Verdict.CONFIRMED, name, f"compensated, and the system confirms it is reversed{tail}", seen)
        if obs.reversed_ is False:
            return Finding(
                check, Verdict.DRIFT, name,
                f"the log says COMPENSATED but the effect is still standing: the undo was acknowledged, not applied{tail}", seen,
            )
        return Finding(check, Verdict.UNVERIFIABLE, name, f"the system could not say whether it is reversed{tail}", seen)
    if obs.exists is False:
        return Finding(check, Verdict.CONFIRMED, name, f"the in-doubt step did not land{tail}", seen)
    if obs.reversed_ is True:
        return Finding(check, Verdict.CONFIRMED, name, f"the in-doubt step landed and is reversed{tail}", seen)
    if obs.exists is True and obs.reversed_ is False:
        return Finding(
            check, Verdict.DRIFT, name, f"timed-out step DID land and is still standing — it was never compensated{tail}", seen,
        )
    return Finding(check, Verdict.UNVERIFIABLE, name, f"the system could not say whether the in-doubt step landed and stands{tail}", seen)

