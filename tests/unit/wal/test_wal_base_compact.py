"""A backend that cannot compact says so: BaseWAL.compact raises, it never silently no-ops."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from agent_saga import BaseWAL, Record, SagaError, WALStats


class NoCompaction(BaseWAL):
    def append(self, type: str, saga: str, step: str | None = None, payload: dict[str, Any] | None = None) -> int:
        return 1

    async def barrier(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        return None

    def barrier_sync(self, seq: int | None = None, *, timeout: float | None = None) -> None:
        return None

    async def read_all(self, *, page_size: int = 1000) -> AsyncIterator[Record]:
        return
        yield

    async def read_since(self, seq: int, *, page_size: int = 1000) -> AsyncIterator[Record]:
        return
        yield

    def stats(self) -> WALStats:
        return WALStats("none", "none", 0, 0, 0, 0, 0, None)

    def close(self, *, timeout: float = 10.0) -> None:
        return None


async def test_a_backend_without_compaction_raises() -> None:
    with pytest.raises(SagaError, match="does not implement compact"):
        await NoCompaction().compact()
