"""``agent-saga status``: the live posture of the controls, one section per control.

Sections are registered with ``register_section`` and printed in their ``order``; the
kill switch (order 10) and the breaker (order 20) come before the limits (order 30),
as the gate consults them. Each section returns a ``StatusSection``; the command exits 1
if any section could not read its state (a safety signal that cannot be read is not
reported as fine), else 0.

The limits section reads the fleet-wide store: ``--redis-url``, else
``$AGENT_SAGA_LIMIT_STORE``, else ``$AGENT_SAGA_REDIS_URL`` (the policy plane, as agents
wired by it use); each section says which store it read and why. The in-process store
lives inside each agent process, so there is nothing to read from outside; the section
says so.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..controls.limits import ENV_LIMIT_STORE, LimitSpec, LimitUsage, display_amount

__all__ = ["StatusSection", "register_section"]


@dataclass
class StatusSection:
    """One block of ``agent-saga status``: text lines, a JSON document, and whether the
    state could be read (``ok=False`` makes the command exit 1)."""

    title: str
    lines: list[str] = field(default_factory=list)
    doc: dict[str, Any] = field(default_factory=dict)
    ok: bool = True


Collect = Callable[[argparse.Namespace], StatusSection]
AddArguments = Callable[[argparse.ArgumentParser], None]

_SECTIONS: list[tuple[int, str, Collect, AddArguments | None]] = []


def register_section(name: str, collect: Collect, *, order: int, add_arguments: AddArguments | None = None) -> None:
    """Add (or replace) the section ``name``; ``order`` places it (kill switch 10,
    breaker 20, limits 30). ``add_arguments`` adds the options the section reads."""
    _SECTIONS[:] = [s for s in _SECTIONS if s[1] != name]
    _SECTIONS.append((order, name, collect, add_arguments))
    _SECTIONS.sort(key=lambda s: (s[0], s[1]))


def register(sub: Any) -> None:
    p = sub.add_parser("status", help="the live posture of the controls: kill switch levers, limits' use")
    p.add_argument("--json", action="store_true", help="print one JSON object, a key per section")
    for _, _, _, add in _SECTIONS:
        if add is not None:
            add(p)
    p.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    sections = [(name, collect(args)) for _, name, collect, _ in _SECTIONS]
    if args.json:
        print(json.dumps({name: {"ok": s.ok, **s.doc} for name, s in sections}, indent=2, default=str))
    else:
        for i, (_, s) in enumerate(sections):
            if i:
                print()
            print(s.title.upper())
            for line in s.lines:
                print("  " + line)
    return 0 if all(s.ok for _, s in sections) else 1


# --------------------------------------------------------------------------- limits
def _limits_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--redis-url",
        default=None,
        help=f"the RedisLimitStore to read (default: ${ENV_LIMIT_STORE}, else $AGENT_SAGA_REDIS_URL)",
    )
    p.add_argument("--limit-store-namespace", "--namespace", dest="namespace", default="agent-saga",
                   help="the RedisLimitStore's key namespace, as the agents' (default: agent-saga; "
                   "a Redis key prefix, not a Kubernetes namespace)")


def _num(x: float) -> str:
    return display_amount(x)


def _window(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


def _collect_limits(args: argparse.Namespace) -> StatusSection:
    from ..plane import choose_store

    choice = choose_store(getattr(args, "redis_url", None), ENV_LIMIT_STORE)
    url = choice.target
    if not url:
        return StatusSection(
            "limits",
            [
                "store: InProcessLimitStore (the default): each agent process keeps its own windows,",
                "so there is nothing to read from outside it, and a fleet of N processes grants N",
                f"times every budget. Use RedisLimitStore for a fleet: set {ENV_LIMIT_STORE}=redis://...",
                "in the agents and pass --redis-url here.",
            ],
            {"store": "InProcessLimitStore", "limits": []},
        )
    from ..controls.limits import LimitStoreUnavailable, RedisLimitStore

    store = RedisLimitStore(url, namespace=getattr(args, "namespace", "agent-saga"))

    async def read() -> tuple[list[LimitSpec], list[LimitUsage]]:
        try:
            specs = await store.definitions()
            return specs, await store.usage(specs)
        finally:
            await store.aclose()

    try:
        specs, usage = asyncio.run(read())
    except LimitStoreUnavailable as exc:
        return StatusSection(
            "limits",
            [f"store: {store.describe()} (from {choice.source})", f"UNREADABLE: {exc.message}",
             "limits fail closed: every call a limit applies to is being refused"],
            {"store": store.describe(), "source": choice.source, "error": exc.message, "limits": []},
            ok=False,
        )
    lines = [f"store: {store.describe()} (from {choice.source})"]
    if not specs:
        lines.append("no limits declared in this namespace yet (a gate declares its limits on first use)")
    docs = []
    for spec in specs:
        rows = [u for u in usage if u.name == spec.name]
        what = f"sum of {spec.arg}" if spec.kind == "budget" else "calls"
        extra = ", escalates to a human" if spec.escalate_to_human else ""
        tools = f", tools {','.join(spec.tools)}" if spec.tools else ""
        lines.append(
            f"{spec.name}: {spec.kind}, {what} <= {_num(spec.max_total)} per {_window(spec.window)}, "
            f"scope {spec.scope}{tools}{extra}"
        )
        if not rows:
            lines.append("    (no use in the window)")
        for u in rows:
            pct = 100.0 * u.used / u.max_total if u.max_total else 0.0
            full = "  FULL" if u.used >= u.max_total else ""
            lines.append(
                f"    {u.key:40} {_num(u.used):>14} / {_num(u.max_total):<14} {pct:5.1f}%  "
                f"{u.entries} debit{'s' if u.entries != 1 else ''}{full}"
            )
        docs.append({**spec.to_doc(), "windows": [u.to_doc() for u in rows]})
    return StatusSection("limits", lines, {"store": store.describe(), "source": choice.source, "limits": docs})


register_section("limits", _collect_limits, order=30, add_arguments=_limits_arguments)
