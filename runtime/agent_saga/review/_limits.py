"""Replay a proposed BudgetLimit over the calls a log records: where would this cap have bitten?

    limits = load_limit_file("budget.yaml")          # BudgetLimit manifests (kind Budget or Rate)
    doc = replay_limits(recorded_calls(records), limits)

The recorded calls are charged in time order against the limits, through the gate's own
pricing (``BudgetLimit.charge``, ``RateLimit.charge``: the scope key, the amount, an
amount that cannot be read) and the limit store's own window arithmetic
(``InProcessLimitStore.debit_now``, driven by a clock that reads each call's recorded
time): the sliding windows a fleet's ``RedisLimitStore`` keeps are the same.

As the gate does: a call over a limit is refused and debits nothing; over a limit that
escalates, a human is asked and the call (which ran) is debited; a call a budget applies
to but whose amount cannot be read is refused. Calls the log says were refused by
another control before the limits (kill switch, breaker, policy) are not charged.

Invariants:
- Every call is counted: charged, not reaching the limits, or unevaluable with its reason.
- Memory is the store's windows (bounded by the window length) plus a few examples per
  window, never the length of the log.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from ..clocks import parse_duration
from ..controls.limits import (
    BudgetLimit,
    InProcessLimitStore,
    LimitUnreadable,
    RateLimit,
    ScopeUnreadable,
)
from ..controls.limits._scopes import Scope, by_arg, by_tool, combine, global_scope
from ..errors import ConfigurationError
from ._calls import REASONS, RecordedCall, Unevaluable

__all__ = ["LimitFileError", "load_limit_file", "replay_limits"]

Limit = BudgetLimit | RateLimit
EXAMPLES = 3


class LimitFileError(ConfigurationError):
    """A BudgetLimit file that cannot be replayed; ``field`` names the offending field."""

    def __init__(self, field_path: str, message: str) -> None:
        super().__init__(f"{field_path}: {message}" if field_path else message)
        self.field = field_path


def _documents(text: str, source: str) -> list[Any]:
    try:
        return [json.loads(text)]
    except ValueError:
        pass
    try:
        import yaml
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise LimitFileError("", f"{source} is not JSON, and reading YAML needs PyYAML: pip install pyyaml") from exc
    try:
        return [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.YAMLError as exc:
        raise LimitFileError("", f"{source} is neither JSON nor YAML ({exc})") from None


def load_limit_file(path: str | Path) -> list[Limit]:
    """The limits in a file of BudgetLimit manifests (``---``-separated, or a JSON
    ``List``), named ``<namespace>.<name>`` as the operator names them. Raises
    ``LimitFileError`` naming the document and the field."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise LimitFileError("", f"cannot read limit file {p}: {exc.strerror or exc}") from None
    docs = _documents(text, str(p))
    if len(docs) == 1 and isinstance(docs[0], dict) and docs[0].get("kind") == "List":
        docs = list(docs[0].get("items") or [])
    out: list[Limit] = []
    for i, doc in enumerate(docs):
        where = f"{p} document {i + 1}"
        if not isinstance(doc, dict) or doc.get("kind") != "BudgetLimit":
            kind = doc.get("kind") if isinstance(doc, dict) else type(doc).__name__
            raise LimitFileError("kind", f"{where} is a {kind!r}, not a BudgetLimit manifest")
        out.append(_limit(doc, where))
    if not out:
        raise LimitFileError("", f"{p} holds no BudgetLimit")
    names = [lim.name for lim in out]
    for n in names:
        if names.count(n) > 1:
            raise LimitFileError("metadata.name", f"two limits are named {n!r} in {p}")
    return out


_SPEC = {"kind", "arg", "maxTotal", "maxCalls", "window", "scope", "tools", "escalateToHuman"}


def _limit(doc: dict[str, Any], where: str) -> Limit:
    meta = doc.get("metadata") or {}
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise LimitFileError("metadata.name", f"{where}: required (the limit's name)")
    ns = meta.get("namespace")
    full = f"{ns}.{name}" if isinstance(ns, str) and ns else name
    spec = doc.get("spec")
    if not isinstance(spec, dict):
        raise LimitFileError("spec", f"{where}: required, an object")
    for key in spec:
        if key not in _SPEC:
            raise LimitFileError(f"spec.{key}", f"{where}: unknown field; the fields are {', '.join(sorted(_SPEC))}")
    window_text = spec.get("window")
    try:
        window = parse_duration(str(window_text)) if window_text is not None else None
    except ValueError as exc:
        raise LimitFileError("spec.window", f"{where}: {window_text!r}: {exc}") from None
    if window is None:
        raise LimitFileError("spec.window", f"{where}: required (1d, 24h, 60s)")
    tools = spec.get("tools")
    scope = _scope(spec.get("scope"), where)
    try:
        if spec.get("kind") == "Budget":
            if "arg" not in spec or "maxTotal" not in spec:
                raise LimitFileError("spec.arg" if "arg" not in spec else "spec.maxTotal",
                                     f"{where}: a Budget needs arg and maxTotal")
            return BudgetLimit(full, arg=spec["arg"], max_total=spec["maxTotal"], window=window, scope=scope,
                               escalate_to_human=bool(spec.get("escalateToHuman", False)),
                               tools=tuple(tools) if tools else None)
        if spec.get("kind") == "Rate":
            if "maxCalls" not in spec:
                raise LimitFileError("spec.maxCalls", f"{where}: a Rate needs maxCalls")
            return RateLimit(full, max_calls=spec["maxCalls"], window=window, scope=scope,
                             tools=tuple(tools) if tools else None)
    except LimitFileError:
        raise
    except ConfigurationError as exc:
        raise LimitFileError("spec", f"{where}: {exc}") from None
    raise LimitFileError("spec.kind", f"{where}: {spec.get('kind')!r} is not Budget or Rate")


def _scope(raw: Any, where: str) -> Scope:
    if raw is None:
        return global_scope
    if not isinstance(raw, dict) or not set(raw) <= {"byTool", "byArgs"}:
        raise LimitFileError("spec.scope", f"{where}: an object with byTool and/or byArgs")
    parts: list[Scope] = [by_tool] if raw.get("byTool") else []
    parts.extend(by_arg(str(a)) for a in raw.get("byArgs") or ())
    return combine(*parts) if parts else global_scope


class _RecordedClock:
    """The store's clock, set to each recorded call's time (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:  # pragma: no cover - the store never sleeps
        self.now += seconds


def _window_doc(key: str) -> dict[str, Any]:
    return {"key": key, "refused": 0, "refused_amount": 0.0, "escalated": 0, "escalated_amount": 0.0,
            "first": None, "last": None, "peak": 0.0, "examples": []}


#: The gate stages before the limits: a call they refused was never priced.
BEFORE_LIMITS = frozenset({"kill_switch", "breaker", "policy"})


def replay_limits(calls: Iterable[RecordedCall | Unevaluable], limits: Sequence[Limit]) -> dict[str, Any]:
    """Charge ``calls`` in order against ``limits`` (see the module doc). The answer is the
    ``--json`` document: per limit, the calls charged, refused and sent to a human, and
    each window (scope key) where it bit."""
    clock = _RecordedClock()
    store = InProcessLimitStore(clock=clock)
    docs: dict[str, dict[str, Any]] = {lim.name: {"name": lim.name, "kind": lim.kind, "max": lim.max_total, "window": lim.window,
                       "charged": 0, "refused": 0, "refused_amount": 0.0, "escalated": 0,
                       "escalated_amount": 0.0, "unreadable": 0, "windows": {}} for lim in limits}
    total = skipped = 0
    unevaluable: dict[str, dict[str, Any]] = {}
    n = 0
    for c in calls:
        total += 1
        if isinstance(c, Unevaluable):
            e = unevaluable.setdefault(c.why, {"count": 0, "reason": REASONS[c.why], "examples": []})
            e["count"] += 1
            if len(e["examples"]) < EXAMPLES:
                e["examples"].append(c.saga)
            continue
        req = c.request
        if c.refused_at in BEFORE_LIMITS:
            skipped += 1
            continue
        # A fleet log is read in its global order, which writers' clocks may not quite
        # follow: the store's clock never goes backwards.
        clock.now = max(clock.now, c.ts / 1e6)
        for lim in limits:
            if not lim.applies_to(req):
                continue
            d = docs[lim.name]
            try:
                charge = lim.charge(req)
            except (LimitUnreadable, ScopeUnreadable):
                d["unreadable"] += 1
                continue
            n += 1
            result = store.debit_now([charge], f"replay-{n}")
            d["charged"] += 1
            if result.ok:
                continue
            # Over: the gate refuses (nothing debited) or, escalating, asks a human; the
            # call ran, so an approved escalation is debited as the gate debits it.
            w: dict[str, Any] = d["windows"].setdefault(charge.key, _window_doc(charge.key))
            w["peak"] = max(w["peak"], result.used[0])
            if charge.escalate_to_human:
                store.debit_now([charge], f"replay-{n}", frozenset({0}))
                d["escalated"] += 1
                d["escalated_amount"] += charge.amount
                w["escalated"] += 1
                w["escalated_amount"] += charge.amount
            else:
                d["refused"] += 1
                d["refused_amount"] += charge.amount
                w["refused"] += 1
                w["refused_amount"] += charge.amount
            w["first"] = c.ts if w["first"] is None else w["first"]
            w["last"] = c.ts
            if len(w["examples"]) < EXAMPLES and req.saga_id not in w["examples"]:
                w["examples"].append(req.saga_id)
    out = []
    for d in docs.values():
        d["windows"] = sorted(d["windows"].values(), key=lambda w: (-(w["refused"] + w["escalated"]), w["key"]))
        out.append(d)
    bit = sum(d["refused"] + d["unreadable"] for d in out)
    held = sum(d["escalated"] for d in out)
    headline = (f"BITES: {bit} recorded call(s) would have been refused" + (f", {held} sent to a human" if held else "")
                if bit or held else "FITS: no recorded call would have been refused or sent to a human")
    return {"headline": headline, "calls": total, "not_reaching_limits": skipped, "limits": out, "unevaluable": unevaluable,
            "refused": bit, "escalated": held}
