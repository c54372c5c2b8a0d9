"""The Router: what one routing decision costs, excluding the model call.

    .venv/bin/python bench/bench_routing.py [--n 20000] [--json]

Target:
    routing decision overhead (excluding the model call) <= 50 µs p50 with 10 candidates

The route: 10 in-process hosts (``CallableHost`` answering a prebuilt ``HostAnswer``) —
3 refused for their context window, 2 for their cost class, the 6th answers, 4 left
untried. The calls are JSON-mode calls (the action check is included) cycling through 64
requests of different sizes (nothing is cached per request; the context-window reasons
name each call's size). Calls run back to back on one thread.

What each figure includes (all measured in the same run, in the same process):

    decision_p50_us     Router.complete with the decision recorded in a real FileWAL:
                        screening, breaker checks, the decision object, the request's
                        SHA-256, the record's payload and its append (seq and chain
                        position fixed, queued for the flusher), with the flusher thread
                        running (sealing, scrubbing, writing, fsyncing) in the same
                        interpreter — minus the median of the host's own ``complete``
                        (the "model call", here a function call). THE TARGET applies to
                        this: it is what the router adds to a call, as documented
                        (docs/agent-runtime.md, "Performance" and "Durability").
    cpu_per_decision_us process CPU time (every thread: the caller's path, the flusher's
                        sealing, scrubbing, writing and fdatasync system time) per decision
                        over a batch ended by a barrier, minus the model call: what a
                        decision costs the machine, reported next to the target.
    caller_cpu_per_decision_us, flusher_cpu_per_decision_us
                        the calling thread's CPU per decision (minus the model call's) and
                        the WAL flusher thread's (building the record's text, sealing,
                        writing, fdatasync system time), from thread CPU clocks.
    ordinary_p50_us     the same decisions on a route marked not screened: each record is
                        encoded and scrubbed whole on the flusher (with its two CPU figures,
                        ordinary_*_cpu_per_decision_us); decision_over_ordinary compares the
                        two paths at the same load.
    durable_p50_us      complete() followed by barrier_sync(): the latency if a caller
                        waited for the decision to be fdatasync'ed before using the answer
                        (``Router(durable=True)``); not the default, reported separately.
    decision_gc_off_p50_us
                        the same decisions with the cyclic garbage collector off during the
                        batch (a diagnostic: what the collector's passes cost the p50; the
                        target applies with it on, as above).
    kept_objects_per_queued_decision
                        objects the garbage collector tracks that a decision keeps alive
                        while its record waits for the flusher (counted with the flusher
                        held back): what makes the collector's passes more frequent and
                        longer. A count: it does not move with the machine's load.
    no_wal_p50_us       Router(wal=None): the decision logic without any record (and
                        cpu_per_decision_no_wal_us its CPU; cpu_per_record_us the difference:
                        what recording one decision costs, mostly the flusher's sealing).
    bytecodes_per_decision, python_calls_per_decision (and *_no_wal)
                        the bytecodes the calling thread executes per decision and the Python
                        functions it enters (a tracer counting opcodes over 640 decisions,
                        the flusher held back; the host's own call included, 2 bytecodes):
                        counts, not timings: they do not move with the machine's load, so
                        they compare two versions on a loaded machine.

Floors, measured in the same run: ``floor_sha256`` (the SHA-256 of one request's canonical
JSON, which every decision computes), ``floor_loop`` (a bare Python loop building one small
dict per candidate), ``floor_append`` (a bare FileWAL append of a small record, queued), and
``floor_fsync`` (a small record appended and barrier_sync'ed). The ratios to them are what
to compare across machines. Each p50 is the best of 5 interleaved batches' p50s (on a
shared machine another process's burst lands in one batch); the load average is printed
at the start and the end of the run (a loaded machine inflates every number; the ratios
much less).
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))

import _common  # noqa: E402
from agent_saga import FileWAL  # noqa: E402
from agent_saga.records import canonical_json  # noqa: E402
from agent_saga.routing import (  # noqa: E402
    CallableHost,
    Capabilities,
    Constraints,
    HostAnswer,
    Message,
    ModelRequest,
    Route,
    Router,
    Usage,
)

TARGET_US = 50.0
ROUNDS = 5
ANSWER = HostAnswer('{"slot": "tue-15"}', usage=Usage(120, 6))  # hosts report usage (chat completions do)


def hosts() -> list[CallableHost]:
    out = []
    for i in range(10):
        if i < 3:
            caps = Capabilities(64, json_mode=True)                       # context too small
        elif i < 5:
            caps = Capabilities(32_000, json_mode=True, cost_class="High")  # too expensive
        else:
            caps = Capabilities(32_000, tools=True, json_mode=True, cost_class="Low")
        out.append(CallableHost(f"host-{i}", lambda r: ANSWER, caps, model=f"model-{i}"))
    return out


def requests() -> list[ModelRequest]:
    system = Message("system", "You book meetings. " * 20)
    return [ModelRequest((system, Message("user", "Tuesday 3pm? " + "please " * i)), json_mode=True, max_tokens=256)
            for i in range(64)]


def timed(fn: Callable[[int], Any], n: int) -> list[float]:
    samples = []
    for i in range(n):
        t0 = time.perf_counter_ns()
        fn(i)
        samples.append((time.perf_counter_ns() - t0) / 1000)
    return samples


def gc_off(fn: Callable[[int], Any]) -> Callable[[int], Any]:
    """``fn`` timed with the cyclic garbage collector off (turned back on after the batch)."""

    def batch(i: int) -> Any:
        return fn(i)

    batch.gc_off = True  # type: ignore[attr-defined]
    return batch


def cpu_per_call(fn: Callable[[int], Any], n: int, wal: FileWAL) -> float:
    """Process CPU (all threads) per call over ``n`` calls and the barrier that ends them."""
    wal.barrier_sync()
    t0 = time.process_time_ns()
    for i in range(n):
        fn(i)
    wal.barrier_sync()
    return (time.process_time_ns() - t0) / 1000 / n


def split_cpu(fn: Callable[[int], Any], n: int, wal: FileWAL) -> tuple[float, float]:
    """CPU per call of the calling thread, and of the WAL's flusher thread (sealing,
    encoding, scrubbing, writing, fdatasync system time) per call, over ``n`` calls and the
    barrier that ends them. Thread CPU clocks: a loaded machine inflates them far less
    than wall-clock latencies."""
    wal.barrier_sync()
    thread = wal._flusher
    ident = None if thread is None else thread.ident
    assert ident is not None, "the WAL's flusher thread has not started"
    flusher = time.pthread_getcpuclockid(ident)
    f0, c0 = time.clock_gettime_ns(flusher), time.thread_time_ns()
    for i in range(n):
        fn(i)
    c1 = time.thread_time_ns()
    wal.barrier_sync()
    return (c1 - c0) / 1000 / n, (time.clock_gettime_ns(flusher) - f0) / 1000 / n


def kept_objects(router: Router, reqs: list[ModelRequest], wal: FileWAL, n: int = 1000) -> float:
    """Tracked objects kept alive per decision queued in ``wal`` (its flusher held back)."""
    wal.barrier_sync()
    linger = wal._linger
    wal._linger = 3600.0  # the flusher waits for a fence or a full batch
    gc.collect()
    gc.disable()
    try:
        before = len(gc.get_objects())
        for i in range(n):
            router.complete(reqs[i & 63])
        kept = (len(gc.get_objects()) - before) / n
    finally:
        gc.enable()
        wal._linger = linger
        wal.barrier_sync()
    return kept


def bytecodes(router: Router, reqs: list[ModelRequest], wal: FileWAL | None, n: int = 640) -> tuple[float, float]:
    """Bytecodes and Python calls per decision on the calling thread (``wal``'s flusher held
    back, so that only the caller's path is counted)."""
    counts = [0, 0]

    def local(frame: Any, event: str, arg: Any) -> Any:
        if event == "opcode":
            counts[0] += 1
        return local

    def tracer(frame: Any, event: str, arg: Any) -> Any:
        if event != "call":
            return None
        counts[1] += 1
        frame.f_trace_opcodes = True
        return local

    if wal is not None:
        wal.barrier_sync()
        linger, wal._linger = wal._linger, 3600.0
    sys.settrace(tracer)
    try:
        for i in range(n):
            router.complete(reqs[i & 63])
    finally:
        sys.settrace(None)
        if wal is not None:
            wal._linger = linger
            wal.barrier_sync()
    return counts[0] / n, counts[1] / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    per = max(args.n // ROUNDS, 100)
    load_start = os.getloadavg()
    reqs = requests()
    names = [f"host-{i}" for i in range(10)]
    with tempfile.TemporaryDirectory() as d:
        wal = FileWAL(Path(d) / "bench.wal")
        floor_wal = FileWAL(Path(d) / "floor.wal")
        route = Route(hosts(), constraints=Constraints(max_cost_class="Medium"))
        router = Router(route, wal=wal)
        # The same route with its names not taken as screened: each record is encoded and
        # scrubbed whole on the flusher (the path of a route whose names the scrubber touches).
        whole = Route(hosts(), constraints=Constraints(max_cost_class="Medium"))
        whole.screened = False
        ordinary = Router(whole, wal=wal)
        durable = Router(route, wal=wal, durable=True)
        bare = Router(route, wal=None)
        host = route.hosts[5]
        assert router.complete(reqs[0]).host == "host-5"

        def call(i: int) -> Any:
            return router.complete(reqs[i & 63])

        measures: dict[str, tuple[Callable[[int], Any], int]] = {
            "decision": (call, per),
            "model_call": (lambda i: host.complete(reqs[i & 63], timeout=60), per),
            "decision_gc_off": (gc_off(call), per),
            "ordinary": (lambda i: ordinary.complete(reqs[i & 63]), per),
            "no_wal": (lambda i: bare.complete(reqs[i & 63]), per),
            "durable": (lambda i: durable.complete(reqs[i & 63]), max(per // 50, 50)),
            "floor_sha256": (lambda i: hashlib.sha256(canonical_json(reqs[i & 63].to_doc()).encode()).hexdigest(),
                             per),
            "floor_loop": (lambda i: [{"host": n, "rank": r, "ok": r > 5} for r, n in enumerate(names)], per),
            "floor_append": (lambda i: floor_wal.append("BENCH", "bench-floor", None, {"i": i}), per),
            "floor_fsync": (lambda i: floor_wal.barrier_sync(floor_wal.append("BENCH", "bench-floor", None, {"i": i})),
                            max(per // 50, 50)),
        }
        for _ in range(2000):  # warm up
            call(0)
        best: dict[str, list[float]] = {}
        cpu: list[float] = []
        split: list[tuple[float, float]] = []
        split_ordinary: list[tuple[float, float]] = []
        for _ in range(ROUNDS):
            for name, (fn, n) in measures.items():
                if getattr(fn, "gc_off", False):
                    gc.disable()
                try:
                    s = timed(fn, n)
                finally:
                    gc.enable()
                if name not in best or _common.pct(s, 0.5) < _common.pct(best[name], 0.5):
                    best[name] = s
            cpu.append(cpu_per_call(call, per, wal))
            split.append(split_cpu(call, per, wal))
            split_ordinary.append(split_cpu(measures["ordinary"][0], per, wal))
        kept = kept_objects(router, reqs, wal)
        ops, pycalls = bytecodes(router, reqs, wal)
        ops_bare, pycalls_bare = bytecodes(bare, reqs, None)
        model_cpu = min(cpu_per_call(measures["model_call"][0], per, wal) for _ in range(3))
        no_wal_cpu = min(cpu_per_call(measures["no_wal"][0], per, wal) for _ in range(3))
        wal.barrier_sync()
        decisions = router.calls + durable.calls + ordinary.calls
        stats = wal.stats()
        wal.close()
        floor_wal.close()
    p50 = {k: _common.pct(v, 0.5) for k, v in best.items()}
    model = p50["model_call"]
    decision = p50["decision"] - model
    cpu_decision = min(cpu) - model_cpu
    out = {
        "loadavg_start": [round(x, 2) for x in load_start],
        "loadavg_end": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "candidates": 10,
        "calls": args.n,
        "decisions_recorded": decisions,
        "wal_batches": stats.batches,
        "wal_syncs": stats.syncs,
        "decision_p50_us": round(decision, 2),
        "decision_p99_us": round(_common.pct(best["decision"], 0.99) - model, 2),
        "cpu_per_decision_us": round(cpu_decision, 2),
        "cpu_per_decision_no_wal_us": round(no_wal_cpu - model_cpu, 2),
        "cpu_per_record_us": round(cpu_decision - (no_wal_cpu - model_cpu), 2),
        "caller_cpu_per_decision_us": round(min(c for c, _ in split) - model_cpu, 2),
        "flusher_cpu_per_decision_us": round(min(f for _, f in split), 2),
        "decision_gc_off_p50_us": round(p50["decision_gc_off"] - model, 2),
        "kept_objects_per_queued_decision": round(kept, 2),
        "bytecodes_per_decision": round(ops, 1),
        "python_calls_per_decision": round(pycalls, 1),
        "bytecodes_per_decision_no_wal": round(ops_bare, 1),
        "python_calls_per_decision_no_wal": round(pycalls_bare, 1),
        "ordinary_p50_us": round(p50["ordinary"] - model, 2),
        "ordinary_caller_cpu_per_decision_us": round(min(c for c, _ in split_ordinary) - model_cpu, 2),
        "ordinary_flusher_cpu_per_decision_us": round(min(f for _, f in split_ordinary), 2),
        "decision_over_ordinary": round(decision / max(p50["ordinary"] - model, 1e-9), 3),
        "durable_p50_us": round(p50["durable"] - model, 2),
        "no_wal_p50_us": round(p50["no_wal"] - model, 2),
        "model_call_p50_us": round(model, 2),
        "floor_sha256_p50_us": round(p50["floor_sha256"], 2),
        "floor_loop_p50_us": round(p50["floor_loop"], 2),
        "floor_append_p50_us": round(p50["floor_append"], 2),
        "floor_fsync_p50_us": round(p50["floor_fsync"], 2),
        "decision_over_floor_sha256": round(decision / max(p50["floor_sha256"], 1e-9), 2),
        "decision_over_floor_loop": round(decision / max(p50["floor_loop"], 1e-9), 2),
        "cpu_per_decision_over_floor_sha256": round(cpu_decision / max(p50["floor_sha256"], 1e-9), 2),
        "durable_over_floor_fsync": round((p50["durable"] - model) / max(p50["floor_fsync"], 1e-9), 2),
        "target_us": TARGET_US,
        "target_applies_to": "decision_p50_us",
        "decision_over_target": round(decision / TARGET_US, 3),
        "ok": decision <= TARGET_US,
    }
    if args.json:
        print(json.dumps(out))
    else:
        for k, v in out.items():
            print(f"{k:36} {v}")
    if not out["ok"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
