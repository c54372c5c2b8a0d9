"""Recovery acts only on records it has verified: each against its digest and its chain.

Every record a daemon reads passes through ``VerifiedReads`` before the daemon sees it.
The check is the one behind ``agent-saga verify`` (``chain.ChainVerifier``: digest, header
hash, link to the previous record, sequence, compaction attestations), one verifier per
writer chain (a file is one chain; a fleet log has one per ``writer``), kept from one read
to the next, so each record is hashed once and a sweep still reads the log once.

Invariants:
- A record that fails a check, a line that cannot be decoded, a sequence that repeats or
  goes backwards, and a gap no compaction attestation accounts for raise
  ``RecoveryHalted`` naming the record and the check; nothing of that read is handed on.
- A gap in a read that continues an earlier one means records left the log after this
  reader last read it (a compaction): sagas it had half read may have lost their ends, so
  the read is discarded and the whole log is read again (``Rescan``). A gap in a whole
  read must be accounted for by the end of that read (one more whole read is allowed, for
  a compaction that landed between the pages of a server read).
- A whole re-read must continue what was read before: every chain still holds the head
  this reader last verified (the same hash at that ``seq``, or the next record or an
  attestation linking to it) and reaches at least as far; otherwise the log was truncated
  or replaced, and recovery halts.
- In a fleet log, a failure in an agent identity writer's chain (``NS/POD[@...]``, see
  ``wal.writers``) halts only that writer: it is ``broken`` from then on, nothing more of
  it is handed on, and the daemon acts on none of the sagas it owns. Its records of other
  sagas never counted (they are foreign), so the others are recovered. A failure in a
  service writer's chain (a recovery daemon's, whose records close other agents' sagas)
  still halts the whole log.
- A file log is one chain: a ``writer`` or ``gseq`` stamp on a line is not covered by the
  chain and is dropped before anything reads it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import NoReturn

from ..chain import ChainVerifier, VerifyResult, is_attestation, parse_attestation
from ..errors import WALCorrupt
from ..records import Record
from ..wal.writers import is_identity_writer
from .errors import RecoveryHalted
from .scan import where

__all__ = ["Rescan", "VerifiedReads"]

Item = tuple[str, Record | WALCorrupt]

log = logging.getLogger("agent_saga.recovery")


class Rescan(Exception):  # noqa: N818 - a signal between the reader and its source, not an error
    """Read the whole log again: what was read before can no longer be trusted to be whole."""


@dataclass(slots=True)
class _Anchor:
    """The head a chain had when this reader last read it, to be found again on a re-read."""

    seq: int
    hash: str
    found: bool = False


@dataclass(slots=True)
class _Chains:
    verifiers: dict[str, ChainVerifier] = field(default_factory=dict)
    anchors: dict[str, _Anchor] = field(default_factory=dict)


class VerifiedReads:
    """The verification state of one log across reads (see the module doc).

    ``fleet``: one chain per ``writer`` stamp (a RedisWAL or PostgresWAL), else one chain
    (a file). ``broken``: the identity writers whose chain failed, each with why.
    """

    def __init__(self, description: str, *, fleet: bool = False) -> None:
        self.description = description
        self.fleet = fleet
        self._state = _Chains()
        self._gaps_before: dict[str, int] | None = None  # at the start of the read in progress
        self.rescans = 0
        self.broken: dict[str, str] = {}

    def chain_of(self, rec: Record) -> str:
        """The writer (chain) a record belongs to (``""`` for a file log, whose records
        lose any unchained ``writer``/``gseq`` stamp here)."""
        if not self.fleet:
            if rec.extra:
                rec.extra.pop("writer", None)
                rec.extra.pop("gseq", None)
            return ""
        w = rec.extra.get("writer")
        return w if isinstance(w, str) else ""

    def writer_unreadable(self, writer: str, exc: WALCorrupt) -> None:
        """An entry of ``writer``'s chain cannot be read: that writer is broken (an
        identity writer), or the log's recovery halts (a service writer)."""
        if self.fleet and is_identity_writer(writer):
            self._break(writer, exc.message)
            return
        self._halt_undecodable(exc.location or self.description, exc)

    @property
    def started(self) -> bool:
        """True once any record was verified (a later read continues it)."""
        return bool(self._state.verifiers)

    def restart(self) -> None:
        """Forget the chains' progress before a whole re-read; keep their heads as anchors
        (an anchor not met again in an interrupted re-read is kept as it was)."""
        st = self._state
        anchors = {name: _Anchor(v.last_seq, v.prev) for name, v in st.verifiers.items() if v.count}
        for name, old in st.anchors.items():
            if name not in anchors or not old.found:
                anchors[name] = _Anchor(old.seq, old.hash)
        self._state = _Chains(anchors=anchors)
        self._gaps_before = None
        self.rescans += 1

    def check(self, items: Iterable[Item], *, whole: bool, last_try: bool) -> list[Record]:
        """Verify one read (``whole``: from the start of the log) and return its records.

        Raises ``RecoveryHalted`` (see the module doc), or ``Rescan`` when the log must be
        read again whole (never when ``last_try``).
        """
        self.begin()
        out = self.page(items)
        self.end(whole=whole, last_try=last_try)
        return out

    def mark(self) -> _Chains:
        """The verification state now, for ``reset`` (a read that failed is forgotten)."""
        st = self._state
        return _Chains(verifiers={k: v.snapshot() for k, v in st.verifiers.items()},
                       anchors={k: _Anchor(a.seq, a.hash, a.found) for k, a in st.anchors.items()})

    def reset(self, mark: _Chains) -> None:
        """Back to ``mark``: the read since is forgotten (it is read again)."""
        self._state = mark
        self._gaps_before = None

    def begin(self) -> None:
        """Start a read that comes in pages (``page`` each, then ``end``). A read that was
        interrupted (no ``end``) is continued by the next: its gaps still count as new."""
        if self._gaps_before is None:
            self._gaps_before = {name: v.gaps for name, v in self._state.verifiers.items()}

    def page(self, items: Iterable[Item]) -> list[Record]:
        """Verify the next page of the read begun with ``begin`` and return its records:
        each one checked against its digest and its chain. What only the whole read can
        show (a gap accounted for, the anchors met) is checked by ``end``, before anything
        read is acted on."""
        st = self._state
        out: list[Record] = []
        for location, item in items:
            if isinstance(item, WALCorrupt):
                # A damaged entry: without its chain name, it belongs to no verifier.
                self._halt_undecodable(location, item)
            name = self.chain_of(item)
            verifier = st.verifiers.get(name)
            if verifier is None:
                if name in self.broken:
                    continue  # nothing more of a broken writer is handed on
                verifier = st.verifiers[name] = ChainVerifier()
            failure = verifier.feed(location, item)
            if failure is not None:
                if self.fleet and is_identity_writer(name):
                    self._break(name, f"{failure.location}: {failure.reason}")
                    continue
                self._halt(failure, item if failure.location == location else None)
            anchor = st.anchors.get(name)
            if anchor is not None:
                self._meet_anchor(anchor, item, location)
            out.append(item)
        return out

    def end(self, *, whole: bool, last_try: bool) -> None:
        """End the read begun with ``begin`` (``whole``: from the start of the log).

        Raises ``RecoveryHalted`` (see the module doc), or ``Rescan`` when the log must be
        read again whole (never when ``last_try``).
        """
        st = self._state
        gaps_before, self._gaps_before = self._gaps_before or {}, None
        for name, verifier in list(st.verifiers.items()):
            if not whole and verifier.gaps > gaps_before.get(name, 0):
                # Records left the log since the last read: read it again, whole.
                raise Rescan(name)
            unexplained = verifier.unexplained()
            if unexplained is not None:
                if last_try:
                    if self.fleet and is_identity_writer(name):
                        self._break(name, f"{unexplained.location}: {unexplained.reason}")
                        continue
                    self._halt(unexplained)
                raise Rescan(name)
        if whole:
            self._check_anchors()

    # ------------------------------------------------------------------ checks

    def _break(self, writer: str, why: str) -> None:
        """``writer`` is broken from now on (see the module doc)."""
        self._state.verifiers.pop(writer, None)
        self._state.anchors.pop(writer, None)
        if writer not in self.broken:
            self.broken[writer] = why
            log.critical(
                "%s: writer %s is BROKEN (%s). Recovery acts on none of the sagas it owns until it "
                "is repaired, or quarantined with `agent-saga wal quarantine`; the other writers' "
                "sagas are recovered", self.description, writer, why)

    def _meet_anchor(self, anchor: _Anchor, rec: Record, location: str) -> None:
        if is_attestation(rec):
            runs = parse_attestation(rec)
            for _first, last, last_hash in runs if isinstance(runs, list) else []:
                if last == anchor.seq and last_hash != anchor.hash:
                    self._replaced(location, f"its attestation names another hash for seq {last} than recovery verified before")
        if anchor.found or rec.seq < anchor.seq:
            return
        if rec.seq == anchor.seq and rec.hash != anchor.hash:
            self._replaced(location, f"record seq {rec.seq} is not the one recovery verified before (its hash differs)")
        if rec.seq == anchor.seq + 1 and rec.prev != anchor.hash:
            # The old head was compacted away: its successor still links to it.
            self._replaced(location, f"record seq {rec.seq} does not link to seq {anchor.seq} as recovery verified it")
        # Beyond seq + 1: the old head and its successor were both compacted away; the
        # chain's own attestation checks bind what is left.
        anchor.found = True

    def _check_anchors(self) -> None:
        for name, anchor in self._state.anchors.items():
            if name in self.broken:
                continue
            verifier = self._state.verifiers.get(name)
            last = verifier.last_seq if verifier is not None else 0
            if last < anchor.seq:
                chain = f"chain {name!r}" if name else "the log"
                raise RecoveryHalted(
                    f"{self.description}: {chain} now ends at seq {last}, but recovery already "
                    f"verified it up to seq {anchor.seq}: records were removed from its end (the "
                    f"log was truncated, or replaced by an older copy). Recovery stopped without "
                    f"acting on any saga; find out what happened to the log before restarting it",
                    location=f"{self.description} seq {anchor.seq}",
                )

    def _replaced(self, location: str, what: str) -> NoReturn:
        raise RecoveryHalted(
            f"{location}: {what}: the log was rewritten since recovery last read it. Recovery "
            f"stopped without acting on any saga; run `agent-saga verify` and find out who "
            f"rewrote the log before restarting it",
            location=location,
        )

    def _halt(self, failure: VerifyResult, rec: Record | None = None) -> NoReturn:
        what = where(rec) if rec is not None else f"seq {failure.first_bad_seq}"
        raise RecoveryHalted(
            f"{failure.location}: {what} fails verification: {failure.reason}. "
            f"Recovery acts only on records it has verified, so it stopped without acting on "
            f"any saga of {self.description}; run `agent-saga verify` on the log, and restart "
            f"recovery once the log is repaired or the damage explained",
            location=failure.location or self.description,
        )

    def _halt_undecodable(self, location: str, exc: WALCorrupt) -> NoReturn:
        raise RecoveryHalted(
            f"{exc.message}. Recovery acts only on records it has verified, so it stopped "
            f"without acting on any saga of {self.description}",
            location=location,
        ) from exc
