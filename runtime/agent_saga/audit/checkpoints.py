"""Signed checkpoints: an Ed25519 signature over the chain head, so a cut tail is detectable.

A hash chain cannot see records removed from its end: what is left still adds up. A
checkpoint signs ``{log_id, seq, head, records, tree_size, root, ts}`` (the head record's
sequence and hash, and the Merkle audit root at that moment); published somewhere the log's
writer cannot rewrite, it pins the log's length. Verifying a log against it checks:

1. the signature, under the public key the verifier trusts (a forged or altered
   checkpoint fails here);
2. the whole chain (``chain.verify_records``);
3. the log still reaches the checkpointed sequence (else: truncated);
4. the checkpointed record is still there with the signed hash;
5. every record the checkpoint signed is still there, unchanged: the log's records up to
   the checkpointed sequence are ``records`` in number and their Merkle root is ``root``.
   A compaction attested after the checkpoint cannot explain a record inside it away: the
   attestation is the writer's own, unsigned claim, so someone who can rewrite the log
   could forge one to hide records (a denial, an unresolved saga). A compaction before
   the checkpoint is part of what was signed.

Redaction keeps every hash, so it never invalidates a checkpoint. The signed message is
``"agent-saga.checkpoint/v1\\n" + canonical_json(body)``: any Ed25519 implementation can
check it. ``cryptography`` is imported only when a checkpoint is made or checked (``agent_saga._ed25519``).
"""

from __future__ import annotations

import base64
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from .. import _ed25519
from ..chain import VerifyResult, is_attestation, parse_attestation, verify_records
from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import Record, canonical_json
from .merkle import MerkleTree, audit_root, leaf_hash

CHECKPOINT_FORMAT = "agent-saga.checkpoint/v1"
_DOMAIN = b"agent-saga.checkpoint/v1\n"


_MISSING = "signed checkpoints need the 'cryptography' package: pip install 'agent-saga[encryption]'"


@dataclass(frozen=True, slots=True)
class Checkpoint:
    """A signed statement: log ``log_id`` had ``records`` records ending at ``seq`` / ``head``."""

    log_id: str
    seq: int
    head: str
    records: int
    tree_size: int
    root: str
    ts: int
    key_id: str
    signature: str = ""

    def body(self) -> dict[str, Any]:
        """The signed fields (everything but the signature)."""
        return {"format": CHECKPOINT_FORMAT, "log_id": self.log_id, "seq": self.seq,
                "head": self.head, "records": self.records, "tree_size": self.tree_size,
                "root": self.root, "ts": self.ts, "alg": "Ed25519", "key_id": self.key_id}

    def message(self) -> bytes:
        """The exact bytes signed."""
        return _DOMAIN + canonical_json(self.body()).encode("utf-8")

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint as JSON (what ``verify_checkpoint`` reads)."""
        return {**self.body(), "signature": self.signature}

    @classmethod
    def from_dict(cls, d: Any) -> Checkpoint:
        """Read a checkpoint's JSON form; raises ``ConfigurationError`` if it is not one."""
        try:
            if d["format"] != CHECKPOINT_FORMAT or d.get("alg") != "Ed25519":
                raise ValueError(f"format {d['format']!r}")
            cp = cls(str(d["log_id"]), d["seq"], d["head"], d["records"], d["tree_size"],
                     d["root"], d["ts"], str(d["key_id"]), str(d["signature"]))
            if not all(isinstance(x, int) and not isinstance(x, bool)
                       for x in (cp.seq, cp.records, cp.tree_size, cp.ts)):
                raise ValueError("seq, records, tree_size and ts must be integers")
            if not (isinstance(cp.head, str) and isinstance(cp.root, str)):
                raise ValueError("head and root must be strings")
            return cp
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigurationError(
                f"not an agent-saga checkpoint ({CHECKPOINT_FORMAT}): {exc}; make one with "
                f"`agent-saga checkpoint`"
            ) from None


@dataclass(frozen=True, slots=True)
class CheckpointResult:
    """The outcome of ``verify_checkpoint``: ``ok`` only if every check passed.

    ``head_status`` is ``"present"`` when ``ok`` (the checkpointed record is in the log,
    same hash, and so is every record before it that the checkpoint signed).
    """

    ok: bool
    reason: str | None
    checkpoint: Checkpoint
    chain: VerifyResult | None = None
    head_status: str | None = None
    appended: int = 0  # records after the checkpointed one

    def describe(self) -> str:
        """One line for a human: valid, or why not."""
        cp = self.checkpoint
        if not self.ok:
            return f"FAILED against checkpoint seq {cp.seq} ({cp.head[:16]}…): {self.reason}"
        return (f"OK: the log extends checkpoint seq {cp.seq} ({cp.head[:16]}…, signed by "
                f"{cp.key_id}); the {cp.records} records it signed are all there, unchanged; "
                f"{self.appended} records since")


# ---------------------------------------------------------------------- keys


def public_key_id(raw_public: bytes) -> str:
    """A key's id: the first 16 hex of SHA-256 over its 32 raw public bytes."""
    return _ed25519.raw_key_id(raw_public)


def generate_signing_key(path: str | os.PathLike[str]) -> tuple[str, str]:
    """Write a new Ed25519 private key (PEM, mode 0600) to ``path`` and its public key to
    ``path + ".pub"``; return both paths. Refuses to overwrite an existing file."""
    return _ed25519.generate(path, _MISSING)


def load_private_key(path: str | os.PathLike[str]) -> Any:
    """An Ed25519 private key from a PEM file (``agent-saga keygen checkpoint`` or openssl)."""
    return _ed25519.load_private_key(path, what="private key", make="agent-saga keygen checkpoint --out FILE",
                                     missing=_MISSING)


def load_public_key(path: str | os.PathLike[str]) -> Any:
    """An Ed25519 public key from a PEM file (``KEY.pub``)."""
    _ed25519.ed25519(_MISSING)
    return _ed25519.load_public_key(_ed25519.read_key_file(path, "public key"), where=repr(os.fspath(path)),
                                    missing=_MISSING)


# ---------------------------------------------------------------------- make and check


def _records(items: Iterable[tuple[str, Record | WALCorrupt]], into: list[Record]) -> Iterator[
    tuple[str, Record | WALCorrupt]
]:
    for loc, item in items:
        if isinstance(item, Record):
            into.append(item)
        yield loc, item


def make_checkpoint(
    items: Iterable[tuple[str, Record | WALCorrupt]],
    private_key: Any,
    *,
    log_id: str,
    ts: int | None = None,
) -> Checkpoint:
    """Sign the head of a chain given as ``(location, record)`` pairs (e.g. ``reader.chain``).

    Raises ``WALError`` if the chain does not verify (a checkpoint of a broken log would
    certify the damage) or is empty.
    """
    recs: list[Record] = []
    result = verify_records(_records(items, recs))
    if not result.ok:
        raise WALError(f"the log does not verify ({result.describe()}); refusing to sign its head")
    if not recs:
        raise WALError("the log is empty: there is no head to sign")
    root = audit_root(recs)
    cp = Checkpoint(log_id, result.last_seq, result.head, result.records, root.size, root.root,
                    time.time_ns() // 1000 if ts is None else ts,
                    _ed25519.key_id(private_key.public_key()))
    return replace(cp, signature=_ed25519.sign_b64(private_key, cp.message()))


def signature_problem(checkpoint: Checkpoint, public_key: Any) -> str | None:
    """Why ``checkpoint`` is not signed by ``public_key``, or None if it is."""
    have = _ed25519.key_id(public_key)
    if have != checkpoint.key_id:
        return f"the checkpoint names signing key {checkpoint.key_id}, the public key given is {have}"
    try:
        signature = base64.b64decode(checkpoint.signature, validate=True)
    except ValueError:
        signature = b""
    if not _ed25519.verifies(public_key, signature, checkpoint.message()):
        return "the signature does not verify: the checkpoint was forged or altered"
    return None


def verify_checkpoint(
    checkpoint: Checkpoint,
    public_key: Any,
    items: Iterable[tuple[str, Record | WALCorrupt]],
    *,
    strict: bool = False,
) -> CheckpointResult:
    """Check that the log (``(location, record)`` pairs) extends ``checkpoint``.

    See the module doc for the checks. Every record the checkpoint signed must still be
    there, unchanged: a compaction attested after the checkpoint cannot explain away a
    record inside it (``strict`` is accepted for callers of earlier versions, where it
    was optional; it changes nothing). Never raises for a bad log or a bad signature: the
    result says which check failed.
    """
    del strict  # always strict: see the docstring
    cp = checkpoint

    def fail(reason: str, chain: VerifyResult | None = None) -> CheckpointResult:
        return CheckpointResult(False, reason, cp, chain)

    why = signature_problem(cp, public_key)
    if why is not None:
        return fail(why)

    signed: list[tuple[int, str]] = []  # (seq, hash) of every record up to the checkpointed seq
    late: list[tuple[int, list[tuple[int, int, str]]]] = []  # attestations written after it
    after = 0

    def watch(its: Iterable[tuple[str, Record | WALCorrupt]]) -> Iterator[tuple[str, Record | WALCorrupt]]:
        nonlocal after
        for loc, item in its:
            if isinstance(item, Record):
                if item.seq > cp.seq:
                    after += 1
                    if is_attestation(item):
                        parsed = parse_attestation(item)
                        if not isinstance(parsed, str):
                            late.append((item.seq, parsed))
                else:
                    signed.append((item.seq, item.hash))
            yield loc, item

    chain = verify_records(watch(items))
    if not chain.ok:
        return fail(f"the chain is broken: {chain.describe()}", chain)
    if chain.last_seq < cp.seq:
        return fail(
            f"the log ends at seq {chain.last_seq}, before the checkpointed seq {cp.seq}: "
            f"{cp.seq - chain.last_seq} or more records were cut off its end (truncated)",
            chain,
        )
    if not signed or signed[-1][0] != cp.seq:
        return fail(
            f"record seq {cp.seq}, the checkpointed head, is missing{_removed_by(late, cp.seq, cp.seq)}. "
            f"{_PINNED}",
            chain,
        )
    if signed[-1][1] != cp.head:
        return fail(
            f"record seq {cp.seq} is not the one checkpointed (hash {signed[-1][1][:16]}…, signed "
            f"{cp.head[:16]}…): the log was rewritten from that point",
            chain,
        )
    if len(signed) != cp.records or len(signed) != cp.tree_size:
        gaps = _missing(signed)
        missing = [g for g in gaps if _removed_by(late, *g)] or gaps
        span = ", ".join(f"{a}..{b}" if a != b else str(a) for a, b in missing[:5]) or "?"
        if len(missing) > 5:
            span += f" and {len(missing) - 5} more runs"
        return fail(
            f"the log holds {len(signed)} records up to the checkpointed seq {cp.seq}, the "
            f"checkpoint signed {cp.records}: records inside the signed range are missing "
            f"(gaps at {span}){_removed_by(late, missing[0][0], missing[-1][1]) if missing else ''}. "
            f"{_PINNED}",
            chain,
        )
    root = MerkleTree([leaf_hash(h) for _, h in signed]).root.hex()
    if root != cp.root:
        return fail(
            f"the records up to seq {cp.seq} are not the ones signed: their Merkle root is "
            f"{root[:16]}…, the checkpoint signed {cp.root[:16]}… (records inside the signed range "
            f"were replaced or removed)",
            chain,
        )
    return CheckpointResult(True, None, cp, chain, "present", after)


_PINNED = (
    "A checkpoint pins every record it signed: a compaction attested after it cannot vouch "
    "for them (the attestation is the writer's own, unsigned claim). If a compaction of "
    "yours removed them, verify against a checkpoint taken after that compaction"
)


def _missing(signed: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """The runs of sequences absent from ``signed`` (ascending ``(seq, hash)`` pairs)."""
    out: list[tuple[int, int]] = []
    expected = 1
    for seq, _ in signed:
        if seq > expected:
            out.append((expected, seq - 1))
        expected = seq + 1
    return out


def _removed_by(late: list[tuple[int, list[tuple[int, int, str]]]], first: int, last: int) -> str:
    """``" (removed by the compaction attested at seq N, after the checkpoint)"``, or ""."""
    seqs = [at for at, runs in late if any(a <= last and b >= first for a, b, _ in runs)]
    if not seqs:
        return ""
    which = ", ".join(map(str, seqs[:5]))
    return f" (removed by the compaction attested at seq {which}, written after the checkpoint)"
