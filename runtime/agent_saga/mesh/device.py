"""MeshWAL: one device's own log for offline mesh sagas.

A device runs sagas with no connection to anything: its log is a ``FileWAL`` at
``<directory>/<device>.wal`` (fsync-durable, its own hash chain, one writer), and every
record it writes carries a stamp in its payload, hashed into the chain like the rest::

    {"mesh": {"device": "<device id>", "lamport": <n>}}

``lamport`` is the device's Lamport clock: one more than the larger of its last value and
the largest clock the device has ``observe``d in records from other devices (call
``observe`` after every sync). It is what ``MeshView.ordered`` orders by.

Invariants:
- The clock and the ``seq`` are assigned under one lock, so a device's clocks rise with
  its ``seq``. Reopening resumes the clock from the largest stamp in the file.
- A payload that already has a ``mesh`` key is refused (the stamp would hide it).
- ``compact()`` raises: a mesh device's log is merged record by record; compaction
  attestations are local to one chain and would leave its peers with gaps to explain.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, SagaError
from ..records import ExtensionType, Record
from ..wal.base import WrappedWAL
from ..wal.compaction import CompactionReport
from ..wal.file import FileWAL, iter_file_records
from .gset import MESH_KEY, SUFFIX, RecordSet, stamp, validate_device

MESH_CLAIM = ExtensionType.MESH_CLAIM.value  # a device claims an entity for a saga: payload {"entity": id}


def _clock(rec: Record) -> int:
    s = stamp(rec)
    lam = s.get("lamport") if s else None
    return lam if isinstance(lam, int) and not isinstance(lam, bool) else 0


class MeshWAL(WrappedWAL):
    """A device's local, stamped ``FileWAL`` (see the module doc).

    Args:
        directory: where the device keeps its log (``<device>.wal``); created if absent.
        device: the device id (``[A-Za-z0-9._-]``, it names the file).
        **filewal: passed to ``FileWAL`` (``sync``, ``max_pending``, ``stall_timeout``...).
    """

    def __init__(self, directory: str | os.PathLike[str], device: str, **filewal: Any) -> None:
        self.device = validate_device(device)
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.path = d / f"{device}{SUFFIX}"
        clock = 0
        if self.path.exists():
            for _loc, item in iter_file_records(self.path):
                if isinstance(item, Record):
                    clock = max(clock, _clock(item))
        self._lock = threading.Lock()
        self._clock = clock
        super().__init__(FileWAL(self.path, **filewal))

    @property
    def clock(self) -> int:
        """The device's Lamport clock (the last value it stamped or observed)."""
        return self._clock

    def observe(self, records: RecordSet | Iterable[Record]) -> int:
        """Advance the clock past every record in ``records`` (after a sync); return it."""
        recs = (r for _k, r in records.items()) if isinstance(records, RecordSet) else records
        top = max((_clock(r) for r in recs), default=0)
        with self._lock:
            self._clock = max(self._clock, top)
            return self._clock

    def append(
        self,
        type: str,
        saga: str,
        step: str | None = None,
        payload: dict[str, Any] | None = None,
    ) -> int:
        """Stamp the record with this device and the next clock, and queue it."""
        p = dict(payload or {})
        if MESH_KEY in p:
            raise ConfigurationError(
                f"payload key {MESH_KEY!r} is reserved for the device stamp of a mesh log: "
                f"rename that key"
            )
        with self._lock:
            self._clock += 1
            p[MESH_KEY] = {"device": self.device, "lamport": self._clock}
            return self.inner.append(type, saga, step, p)

    def claim(self, entity: str, saga: str, step: str | None = None) -> int:
        """Record that ``saga`` on this device claims ``entity`` (a seat, an invoice
        number); a merge that finds another claim on it reports an ``entity`` conflict."""
        if not isinstance(entity, str) or not entity:
            raise ConfigurationError("entity must be a non-empty string naming what is claimed")
        return self.append(MESH_CLAIM, saga, step, {"entity": entity})

    async def compact(
        self, keep_sagas: Collection[str] | None = None, *, timeout: float | None = None
    ) -> CompactionReport:
        """Refused: a mesh device's log is merged record by record (see the module doc)."""
        raise SagaError(
            f"MeshWAL does not implement compact(): device {self.device}'s log is merged "
            f"record by record and a compaction would leave its peers gaps; the log was not changed"
        )

    def __repr__(self) -> str:
        return f"<MeshWAL device={self.device} {self.path}>"
