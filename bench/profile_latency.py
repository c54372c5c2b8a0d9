"""Where one COMPENSABLE step's wall time goes beyond its two ``fdatasync`` calls.

One saga runs COMPENSABLE steps over a FileWAL that syncs, with timestamps taken at each
stage of both fences: the fence asks (``barrier``), the flusher is asked (``_demand``),
wakes (``_flush``), seals (``_seal``), writes, syncs, hands the fences back to the loop
(``_wake``), the loop wakes them (``_resolve``) and the step's task runs again. It prints
the median of each stage per fence and the sum of its means per step, next to a bare
``write`` + ``fdatasync`` of one line on the same disk, one after each step: what the step
adds to its two syncs, stage by stage, and per fence the spans that do not depend on the
order the two threads' stages interleave in (the fence until the flusher starts its batch,
until the sync returned, and from the sync back to the step's task). A diagnostic: it
wraps the writer's private methods, so it measures this version's stages (the wrappers
add ~1 us each).

    python bench/profile_latency.py [--steps 200] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import agent_saga.wal.batching as batching
import agent_saga.wal.file as walfile
from agent_saga import ActionSemantics, FileWAL, saga_scope
from bench_core import LINE, _async_tool, _undo

EVENTS: list[tuple[str, float]] = []
_now = time.perf_counter
_fdatasync = os.fdatasync
_write = os.write


class _TimedOS:
    """``os`` for the FileWAL module, with ``write`` and ``fdatasync`` timestamped."""

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def write(self, fd: int, data: Any) -> int:
        EVENTS.append(("write", _now()))
        n = _write(fd, data)
        EVENTS.append(("written", _now()))
        return n

    def fdatasync(self, fd: int) -> None:
        EVENTS.append(("sync", _now()))
        _fdatasync(fd)
        EVENTS.append(("synced", _now()))


def _instrument() -> None:
    setattr(walfile, "os", _TimedOS())  # noqa: B010 - the module's own name, replaced
    cls = batching.BatchingWAL
    for name in ("_demand", "_flush", "_seal", "_wake", "_resolve"):
        orig = getattr(cls, name)

        def timed(self: Any, *args: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
            EVENTS.append((_name, _now()))
            return _orig(self, *args, **kw)

        setattr(cls, name, timed)
    fence = cls.fence

    # The engine awaits ``fence``'s future directly (no ``barrier`` coroutine), so the
    # fence is stamped where it is built and where its future is done: a done-callback
    # added before the step's task awaits the future runs just before that task, in the
    # same pass of the loop.
    def timed_fence(self: Any, *args: Any, **kw: Any) -> Any:
        EVENTS.append(("barrier", _now()))
        waiter = fence(self, *args, **kw)
        if waiter is None:
            EVENTS.append(("fence done", _now()))
        else:
            waiter = asyncio.ensure_future(waiter)
            waiter.add_done_callback(lambda _f: EVENTS.append(("fence done", _now())))
        return waiter

    setattr(cls, "fence", timed_fence)  # noqa: B010


async def run(steps: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="agent-saga-latency-", dir=os.environ.get("BENCH_DIR")))
    _instrument()
    wal = FileWAL(tmp / "latency.wal", max_pending=1_000_000)
    step_times: list[float] = []
    floor: list[float] = []
    # The floor is sampled between the steps, on the same disk at the same moments: a
    # disk whose sync time moves by 10 x from one second to the next (a shared machine)
    # moves both alike.
    fd = os.open(tmp / "floor.log", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        async with saga_scope(wal, name="latency") as saga:
            for _ in range(30):  # warm-up
                await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE, _async_tool, _undo)
            EVENTS.clear()
            for _ in range(steps):
                t = _now()
                await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE, _async_tool, _undo)
                t1 = _now()
                step_times.append(t1 - t)
                EVENTS.append(("floor", t1))  # the floor's own stage, out of the step's
                _write(fd, LINE)
                _fdatasync(fd)
                t2 = _now()
                EVENTS.append(("floor done", t2))
                floor.append(t2 - t1)
    finally:
        os.close(fd)
        wal.close()
    gaps: dict[tuple[str, str], list[float]] = collections.defaultdict(list)
    for (a, ta), (b, tb) in zip(EVENTS, EVENTS[1:], strict=False):
        gaps[(a, b)].append(tb - ta)
    stages = sorted(gaps.items(), key=lambda kv: -sum(kv[1]))
    spans = _spans(EVENTS)
    step_p50 = statistics.median(step_times)
    floor_p50 = statistics.median(floor)
    return {
        "steps": steps,
        "load": os.getloadavg(),
        "floor_write_fdatasync_p50_us": round(floor_p50 * 1e6, 1),
        "step_p50_us": round(step_p50 * 1e6, 1),
        "step_over_floor": round(step_p50 / floor_p50, 2),
        "spans_p50_us": {k: round(statistics.median(v) * 1e6, 1) for k, v in spans.items() if v},
        "stages": [
            {"from": a, "to": b, "n": len(v), "p50_us": round(statistics.median(v) * 1e6, 1),
             "us_per_step": round(sum(v) / steps * 1e6, 1)}
            for (a, b), v in stages if len(v) >= steps // 2
        ],
    }


# Per fence, from one event to the first given one after it, whatever came in between (the
# flusher may be woken before the fence asks, so the consecutive stages above can interleave).
SPANS = {
    "fence -> flusher starts the batch": ("barrier", "_flush"),
    "fence -> synced": ("barrier", "synced"),
    "synced -> fence done": ("synced", "fence done"),
    "fence -> fence done": ("barrier", "fence done"),
}


def _spans(events: list[tuple[str, float]]) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {k: [] for k in SPANS}
    for name, (a, b) in SPANS.items():
        start = None
        for ev, t in events:
            if ev == a and start is None:
                start = t
            elif ev == b and start is not None:
                out[name].append(t - start)
                start = None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    result = asyncio.run(run(args.steps))
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"COMPENSABLE step p50 {result['step_p50_us']} us = {result['step_over_floor']} x a bare "
          f"write+fdatasync p50 ({result['floor_write_fdatasync_p50_us']} us); load {result['load']}")
    for name, v in result["spans_p50_us"].items():
        print(f"  {name:>34} p50 {v:>8} us")
    for s in result["stages"]:
        print(f"  {s['from']:>10} -> {s['to']:<10} p50 {s['p50_us']:>8} us  {s['us_per_step']:>8} us/step (n={s['n']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
