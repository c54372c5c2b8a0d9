"""Signed checkpoints: an Ed25519 signature over the chain head, so a cut tail is detectable.

A hash chain cannot see records removed from its end: what is left still adds up. A
checkpoint signs ``{log_id, seq, head, records, tree_size, root, ts}`` (the head record's
sequence and hash, and the Merkle audit root at that moment); published somewhere the log's
writer cannot rewrite, it pins the log's length. Verifying a log against it checks:

1. the signature, under the public key the verifier trusts (a forged or altered
   checkpoint fails here);
2. the whole chain (``chain.verify_records``);
3. the log still reaches the checkpointed sequence (else: truncated);
4. the checkpointed record is still the same: present with the signed hash, or removed by
   an attested compaction (a run ending at it carries its hash, which must match; a record
   removed mid-run is accepted on the attestation's word, and refused with ``strict``).

Redaction keeps every hash, so it never invalidates a checkpoint. The signed message is
``"agent-saga.checkpoint/v1\\n" + canonical_json(body)``: any Ed25519 implementation can
check it. ``cryptography`` is imported only here, when a checkpoint is made or checked.
"""

from __future__ import annotations

import base64
import hashlib
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from ..chain import VerifyResult, is_attestation, parse_attestation, verify_records
from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import Record, canonical_json
from .merkle import audit_root

CHECKPOINT_FORMAT = "agent-saga.checkpoint/v1"
_DOMAIN = b"agent-saga.checkpoint/v1\n"


def _crypto() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError as exc:
        raise ConfigurationError(
            "signed checkpoints need the 'cryptography' package: pip install 'agent-saga[encryption]'"
        ) from exc
    return ed25519


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

    ``head_status`` is ``"present"`` (the checkpointed record is in the log, same hash),
    ``"attested"`` (removed by compaction at a run's end, hash compared) or
    ``"attested-unchecked"`` (removed mid-run: taken on the attestation's word).
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
        how = {"present": "still in the log",
               "attested": "removed by an attested compaction, hash matches",
               "attested-unchecked": "removed mid-run by an attested compaction (hash not comparable)",
               }.get(self.head_status or "", self.head_status)
        return (f"OK: the log extends checkpoint seq {cp.seq} ({cp.head[:16]}…, signed by "
                f"{cp.key_id}); the checkpointed record is {how}; {self.appended} records since")


# ---------------------------------------------------------------------- keys


def public_key_id(raw_public: bytes) -> str:
    """A key's id: the first 16 hex of SHA-256 over its 32 raw public bytes."""
    return hashlib.sha256(raw_public).hexdigest()[:16]


def _raw_public(public_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    raw: bytes = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw


def generate_signing_key(path: str | os.PathLike[str]) -> tuple[str, str]:
    """Write a new Ed25519 private key (PEM, mode 0600) to ``path`` and its public key to
    ``path + ".pub"``; return both paths. Refuses to overwrite an existing file."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    p = os.fspath(path)
    key = ed25519.Ed25519PrivateKey.generate()
    priv = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())
    pub = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    for target, data, mode in ((p, priv, 0o600), (p + ".pub", pub, 0o644)):
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
        except FileExistsError:
            raise ConfigurationError(f"{target!r} exists; refusing to overwrite a key") from None
        with open(fd, "wb") as f:
            f.write(data)
    return p, p + ".pub"


def load_private_key(path: str | os.PathLike[str]) -> Any:
    """An Ed25519 private key from a PEM file (``agent-saga keygen checkpoint`` or openssl)."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(_read(path, "private key"), password=None)
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise ConfigurationError(f"{os.fspath(path)!r} is not an Ed25519 private key")
    return key


def load_public_key(path: str | os.PathLike[str]) -> Any:
    """An Ed25519 public key from a PEM file (``KEY.pub``)."""
    ed25519 = _crypto()
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_public_key(_read(path, "public key"))
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise ConfigurationError(f"{os.fspath(path)!r} is not an Ed25519 public key")
    return key


def _read(path: str | os.PathLike[str], what: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except FileNotFoundError:
        raise ConfigurationError(f"{what} file {os.fspath(path)!r} does not exist") from None


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
                    public_key_id(_raw_public(private_key.public_key())))
    sig = private_key.sign(cp.message())
    return replace(cp, signature=base64.b64encode(sig).decode())


def signature_problem(checkpoint: Checkpoint, public_key: Any) -> str | None:
    """Why ``checkpoint`` is not signed by ``public_key``, or None if it is."""
    from cryptography.exceptions import InvalidSignature

    have = public_key_id(_raw_public(public_key))
    if have != checkpoint.key_id:
        return f"the checkpoint names signing key {checkpoint.key_id}, the public key given is {have}"
    try:
        public_key.verify(base64.b64decode(checkpoint.signature, validate=True), checkpoint.message())
    except (InvalidSignature, ValueError):
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

    See the module doc for the four checks. ``strict`` refuses a checkpointed record that
    compaction removed mid-run. Never raises for a bad log or a bad signature: the result
    says which check failed.
    """
    cp = checkpoint

    def fail(reason: str, chain: VerifyResult | None = None) -> CheckpointResult:
        return CheckpointResult(False, reason, cp, chain)

    why = signature_problem(cp, public_key)
    if why is not None:
        return fail(why)

    at_seq: Record | None = None
    runs: list[tuple[int, int, str]] = []
    after = 0

    def watch(its: Iterable[tuple[str, Record | WALCorrupt]]) -> Iterator[tuple[str, Record | WALCorrupt]]:
        nonlocal at_seq, after
        for loc, item in its:
            if isinstance(item, Record):
                if item.seq > cp.seq:
                    after += 1
                elif item.seq == cp.seq:
                    at_seq = item
                if is_attestation(item):
                    parsed = parse_attestation(item)
                    if not isinstance(parsed, str):
                        runs.extend(parsed)
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
    status: str
    if at_seq is not None:
        if at_seq.hash != cp.head:
            return fail(
                f"record seq {cp.seq} is not the one checkpointed (hash {at_seq.hash[:16]}…, signed "
                f"{cp.head[:16]}…): the log was rewritten from that point",
                chain,
            )
        status = "present"
    else:
        run = next(((a, b, h) for a, b, h in runs if a <= cp.seq <= b), None)
        if run is None:  # verify_records accepted the log, so this cannot be a plain gap
            return fail(f"record seq {cp.seq} is missing and no attestation names it", chain)
        if run[1] == cp.seq:
            if run[2] != cp.head:
                return fail(
                    f"record seq {cp.seq} was attested removed with hash {run[2][:16]}…, but the "
                    f"checkpoint signed {cp.head[:16]}…: the log was rewritten from that point",
                    chain,
                )
            status = "attested"
        else:
            if strict:
                return fail(
                    f"record seq {cp.seq} was removed by compaction inside the run {run[0]}..{run[1]}; "
                    f"its hash cannot be compared (strict). Take a checkpoint after each compaction",
                    chain,
                )
            status = "attested-unchecked"
    return CheckpointResult(True, None, cp, chain, status, after)
