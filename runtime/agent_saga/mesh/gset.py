"""RecordSet: the grow-only set (G-Set CRDT) of records that offline devices exchange.

An element is one record of one device, identified by ``(device, seq, fingerprint)``
where the fingerprint is the SHA-256 of the record's line (every hashed field, payload and
salt included; backend stamps such as ``gseq`` are dropped first). Merge is set union,
so it is commutative, associative and idempotent: devices may sync in any order, through
any partition, any number of times, and every replica that has seen the same records
holds the same set.

Invariants:
- A record is never rewritten, re-chained or dropped by a merge: what a replica writes is
  the byte-exact line each device wrote. Two different records under one device and
  ``seq`` (a fork, or a tampered copy) are both kept; ``MeshView`` names them.
- The device of a record is the one stamped in its payload (``{"mesh": {"device": ...}}``,
  hashed into the chain) or, for a record without a stamp (a torn-tail note, a redacted
  record), the device whose file it was read from.
- On disk a replica is a directory of ``<device>.wal`` files, one per device, each in
  ``seq`` order (the ``FileWAL`` line format); ``write`` replaces each file atomically and
  refuses a file a live ``FileWAL`` holds (a device's own log is never overwritten).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigurationError, WALCorrupt
from ..records import Record, encode_line

MESH_KEY = "mesh"  # the payload key of a device's stamp: {"device": id, "lamport": n}
DEVICE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SUFFIX = ".wal"

Key = tuple[str, int, str]  # (device, seq, fingerprint)


def validate_device(device: str) -> str:
    """Return ``device`` if it is a valid device id (it names a file), else raise."""
    if not isinstance(device, str) or not DEVICE_PATTERN.match(device):
        raise ConfigurationError(
            f"device {device!r} is not a valid device id: use 1-100 characters from "
            f"[A-Za-z0-9._-], starting with a letter or digit"
        )
    return device


def stamp(rec: Record) -> dict[str, Any] | None:
    """The mesh stamp in ``rec``'s payload, or None."""
    p = rec.payload
    s = p.get(MESH_KEY) if isinstance(p, dict) else None
    return s if isinstance(s, dict) else None


def device_of(rec: Record, default: str) -> str:
    """The device that wrote ``rec``: its stamp's, else ``default`` (the file's device)."""
    s = stamp(rec)
    d = s.get("device") if s else None
    return d if isinstance(d, str) and DEVICE_PATTERN.match(d) else default


def fingerprint(rec: Record) -> str:
    """SHA-256 of ``rec``'s line without backend stamps: equal only for identical records."""
    return hashlib.sha256(encode_line(replace(rec, extra={}))).hexdigest()


@dataclass(frozen=True, slots=True)
class Damage:
    """A line that could not be read as a record (it cannot join the set)."""

    location: str
    message: str


class RecordSet:
    """A G-Set of device records. ``merge`` (``|``) is the CRDT join: set union."""

    __slots__ = ("_items",)

    def __init__(self, items: Iterable[tuple[str, Record]] = ()) -> None:
        self._items: dict[Key, Record] = {}
        for device, rec in items:
            self.add(device, rec)

    def add(self, device: str, rec: Record) -> bool:
        """Add ``rec`` of ``device`` (its stamp wins); return False if it was already in."""
        rec = replace(rec, extra={})
        key = (device_of(rec, validate_device(device)), rec.seq, fingerprint(rec))
        if key in self._items:
            return False
        self._items[key] = rec
        return True

    def merge(self, *others: RecordSet) -> RecordSet:
        """A new set holding every record of this one and of ``others``."""
        out = RecordSet()
        out._items = dict(self._items)
        for o in others:
            for k, v in o._items.items():
                out._items.setdefault(k, v)
        return out

    __or__ = merge

    def keys(self) -> frozenset[Key]:
        """The elements' identities."""
        return frozenset(self._items)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RecordSet) and self._items.keys() == other._items.keys()

    def __hash__(self) -> int:
        return hash(self.keys())

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def devices(self) -> list[str]:
        """Every device with a record in the set, sorted."""
        return sorted({k[0] for k in self._items})

    def items(self) -> Iterator[tuple[Key, Record]]:
        """``(key, record)`` in key order: device, seq, fingerprint."""
        for k in sorted(self._items):
            yield k, self._items[k]

    def of(self, device: str) -> list[tuple[Key, Record]]:
        """One device's records in ``seq`` order (a fork's versions by fingerprint)."""
        return [(k, r) for k, r in self.items() if k[0] == device]

    # ------------------------------------------------------------------ on disk

    @classmethod
    def load(cls, *paths: str | os.PathLike[str]) -> tuple[RecordSet, list[Damage]]:
        """The union of the replicas at ``paths`` (directories of ``<device>.wal`` files, or
        single files) and the lines that could not be read. A missing path raises."""
        from ..wal.file import iter_file_records

        out = cls()
        damage: list[Damage] = []
        for p in paths:
            path = Path(p)
            if path.is_dir():
                files = sorted(path.glob(f"*{SUFFIX}"))
            elif path.is_file():
                files = [path]
            else:
                raise ConfigurationError(
                    f"{path} does not exist: give a replica directory or a device's .wal file"
                )
            for f in files:
                device = validate_device(f.name[: -len(SUFFIX)] if f.name.endswith(SUFFIX) else f.stem)
                for location, item in iter_file_records(f):
                    if isinstance(item, WALCorrupt):
                        damage.append(Damage(location, item.message))
                    else:
                        out.add(device, item)
        return out, damage

    def write(self, directory: str | os.PathLike[str]) -> list[Path]:
        """Write one ``<device>.wal`` per device into ``directory`` (created if absent),
        each replaced atomically. Raises ``ConfigurationError`` for a file a live FileWAL
        holds. Returns the files written."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        by_device: dict[str, list[bytes]] = {}
        for (device, _seq, _fp), rec in self.items():
            by_device.setdefault(device, []).append(encode_line(rec))
        written = []
        for device, lines in by_device.items():
            target = d / f"{device}{SUFFIX}"
            with _unless_live(target):
                fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{device}.", suffix=".tmp")
                try:
                    with os.fdopen(fd, "wb") as fh:
                        fh.write(b"".join(lines))
                        fh.flush()
                        os.fsync(fh.fileno())
                    os.replace(tmp, target)
                except BaseException:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(tmp)
                    raise
            written.append(target)
        dfd = os.open(d, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
        return written


@contextlib.contextmanager
def _unless_live(path: Path) -> Iterator[None]:
    """Hold ``path``'s writer lock while replacing it; refuse if a FileWAL holds it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ConfigurationError(
                f"{path} is a device's live log (a FileWAL holds it): write the merged view "
                f"to another directory; a merge never overwrites a device's own log"
            ) from None
        yield
    finally:
        os.close(fd)
