"""Shared helpers for the engine tests: a real FileWAL, log readers, tiny real gates."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_saga.gates import GateDecision, StepRequest
from agent_saga.records import Record
from agent_saga.wal.file import FileWAL, iter_file_records


@pytest.fixture(name="wal")
def wal_fixture(tmp_path: Path) -> Iterator[FileWAL]:
    """A real FileWAL in the test's tmp_path (import it to get the ``wal`` fixture)."""
    w = FileWAL(tmp_path / "saga.wal")
    yield w
    w.close()


def read(wal: FileWAL, saga: str | None = None) -> list[Record]:
    """Every record on disk (after flushing what is queued), optionally of one saga."""
    wal.barrier_sync()
    out = []
    for _, item in iter_file_records(wal.path):
        assert not isinstance(item, Exception), item
        if saga is None or item.saga == saga:
            out.append(item)
    return out


def types(wal: FileWAL, saga: str) -> list[str]:
    return [r.type for r in read(wal, saga)]


def of_type(wal: FileWAL, saga: str, type_: str) -> list[Record]:
    return [r for r in read(wal, saga) if r.type == type_]


class AllowGate:
    """A real gate that allows everything and remembers what it was asked."""

    def __init__(self, verdict: str = "ALLOW", allowed: bool | None = None) -> None:
        self.requests: list[StepRequest] = []
        self.verdict = verdict
        self.allowed = allowed

    async def decide(self, request: StepRequest) -> GateDecision:
        self.requests.append(request)
        return GateDecision(self.verdict, "ok by test", "test-gate", self.allowed)  # type: ignore[arg-type]


class BlockGate:
    """A real gate that blocks one tool and allows the rest."""

    def __init__(self, tool: str) -> None:
        self.tool = tool

    async def decide(self, request: StepRequest) -> GateDecision:
        if request.tool == self.tool:
            return GateDecision.block(f"{self.tool} is halted", decided_by="soc@corp")
        return GateDecision.allow(decided_by="soc@corp")


class Wedge:
    """A fault hook that blocks the flusher at ``before_sync`` once armed, until released
    (a device stuck in fdatasync)."""

    def __init__(self) -> None:
        self.armed = threading.Event()
        self.reached = threading.Event()
        self.release = threading.Event()

    def __call__(self, point: str) -> None:
        if point == "before_sync" and self.armed.is_set() and not self.release.is_set():
            self.reached.set()
            self.release.wait(60)


class FakeClock:
    """The time seam: records sleeps and returns at once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


class Boom(Exception):
    """The test's own failure, so nothing else can be mistaken for it."""


def payload(rec: Record) -> dict[str, Any]:
    assert rec.payload is not None
    return rec.payload
