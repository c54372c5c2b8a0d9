"""A record queued by a writer is the same ``Record`` its constructor makes.

``BatchingWAL._queue`` sets each slot itself instead of calling the dataclass's
``__init__``; what this pins: every field is set, to the constructor's default where the
append gives none, so equality, ``repr``, ``asdict``, ``replace`` and the line on disk are
those of ``Record(type, saga, step, payload, seq, ts)``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from agent_saga import FileWAL, Record
from agent_saga.records import encode_line
from agent_saga.wal.file import iter_file_records


class Looking(FileWAL):
    """A FileWAL that compares each record it is handed with the constructor's, unsealed."""

    seen: list[tuple[Record, Record]]

    def _seal(self, batch: Any) -> Any:
        for rec in batch:
            made = Record(rec.type, rec.saga, rec.step, rec.payload, rec.seq, rec.ts, encode=rec.encode)
            self.seen.append((dataclasses.replace(rec), made))
            assert rec == made and repr(rec) == repr(made)
            assert dataclasses.asdict(rec) == dataclasses.asdict(made)
            assert {s: getattr(rec, s) for s in Record.__slots__} == {s: getattr(made, s) for s in Record.__slots__}
            assert rec.extra is not made.extra  # a dict of its own, as default_factory makes
        return super()._seal(batch)


async def test_a_queued_record_is_the_record_its_constructor_makes(tmp_path: Path) -> None:
    Looking.seen = []
    wal = Looking(tmp_path / "q.wal")
    try:
        await wal.barrier(wal.append("STEP_INTENT", "s-1", "s-1/0", {"tool": "t", "n": 1}))
        await wal.barrier(wal.append("SAGA_COMPLETED", "s-1"))
    finally:
        wal.close()
    assert len(Looking.seen) == 2
    for copy, made in Looking.seen:
        assert copy == made
        assert copy.salt is None and copy.digest == copy.prev == copy.hash == ""
        assert copy.redacted is False and copy.extra == {} and copy.encode is None
    on_disk = [r for _, r in iter_file_records(tmp_path / "q.wal")]
    assert [r.type for r in on_disk] == ["STEP_INTENT", "SAGA_COMPLETED"]
    assert encode_line(on_disk[0]).startswith(b'{"v":1,"seq":1,')
