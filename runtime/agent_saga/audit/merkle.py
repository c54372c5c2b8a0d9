"""Selective disclosure: a Merkle tree over the log, RFC 6962 hashing, so any verifier agrees.

    leaf i   = SHA-256( 0x00 || bytes.fromhex(record_i.hash) )
    node     = SHA-256( 0x01 || left || right )
    MTH([])  = SHA-256( "" )
    MTH(D[n]) splits at k, the largest power of two smaller than n (RFC 6962 §2.1)

The leaf data is a record's chain ``hash`` (32 bytes), not its line: the hash commits to
the record's header and to its salted content digest, so an auditor recomputes the leaf
from a revealed record (salt + payload -> digest -> header hash), and a redaction, which
keeps the hash, never changes a published root. Unhashed stamps (``gseq``) are outside.

``build_disclosure`` reveals one saga's records (payload, salt and header) with an
inclusion proof for each; every other record contributes only audit-path node hashes,
which are one-way over salted digests. ``verify_disclosure`` re-derives every leaf and
checks every path against the published root. ``build_consistency`` /
``verify_consistency`` prove that a later root extends an earlier one (RFC 6962 §2.1.2:
the log only grew). What a disclosure does not prove: that it holds *every* record of the
saga (a discloser can leave one out); see docs/audit.md.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from ..chain import check_record
from ..errors import ConfigurationError, WALCorrupt
from ..records import Record, decode_line

DISCLOSURE_FORMAT = "agent-saga.disclosure/v1"
CONSISTENCY_FORMAT = "agent-saga.consistency/v1"
ROOT_FORMAT = "agent-saga.audit-root/v1"

_HASHED_FIELDS = ("v", "seq", "ts", "type", "saga", "step", "payload", "salt", "digest", "prev", "hash")


def leaf_hash(record_hash: str) -> bytes:
    """RFC 6962 leaf hash of one record: SHA-256(0x00 || the 32 bytes of its chain hash)."""
    return hashlib.sha256(b"\x00" + bytes.fromhex(record_hash)).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    """RFC 6962 interior node hash: SHA-256(0x01 || left || right)."""
    return hashlib.sha256(b"\x01" + left + right).digest()


EMPTY_ROOT = hashlib.sha256(b"").digest()


class MerkleTree:
    """An RFC 6962 tree over leaf hashes, built bottom-up once.

    Carrying an unpaired last node up a level unchanged builds exactly RFC 6962's tree
    (split at the largest power of two), so node ``i`` of level ``j`` is the root of the
    leaves ``[i*2^j, min((i+1)*2^j, n))``.
    """

    __slots__ = ("levels", "size")

    def __init__(self, leaves: Sequence[bytes]) -> None:
        self.size = len(leaves)
        levels = [list(leaves)]
        while len(levels[-1]) > 1:
            below = levels[-1]
            up = [node_hash(below[i], below[i + 1]) for i in range(0, len(below) - 1, 2)]
            if len(below) % 2:
                up.append(below[-1])
            levels.append(up)
        self.levels = levels

    @property
    def root(self) -> bytes:
        """The Merkle root of the leaves (32 bytes)."""
        return self.levels[-1][0] if self.size else EMPTY_ROOT

    def inclusion_path(self, index: int) -> list[bytes]:
        """PATH(index, D[n]) of RFC 6962 §2.1.1, leaf to root."""
        if not 0 <= index < self.size:
            raise ConfigurationError(f"leaf {index} is not in a tree of {self.size} leaves")
        path: list[bytes] = []
        i = index
        for level in self.levels[:-1]:
            sibling = i ^ 1
            if sibling < len(level):
                path.append(level[sibling])
            i >>= 1
        return path

    def subtree(self, start: int, end: int) -> bytes:
        """MTH(D[start:end]) for a range RFC 6962's recursion produces (or any range)."""
        size = end - start
        if size <= 0:
            return EMPTY_ROOT
        j = (size - 1).bit_length()  # smallest j with 2**j >= size
        if start % (1 << j) == 0 and (size == 1 << j or end == self.size):
            return self.levels[j][start >> j]
        k = 1 << ((size - 1).bit_length() - 1)
        return node_hash(self.subtree(start, start + k), self.subtree(start + k, end))

    def consistency_proof(self, old_size: int) -> list[bytes]:
        """PROOF(old_size, D[n]) of RFC 6962 §2.1.2."""
        if not 0 <= old_size <= self.size:
            raise ConfigurationError(
                f"cannot prove consistency from {old_size} leaves: the tree has {self.size}"
            )
        if old_size in (0, self.size):
            return []
        return self._subproof(old_size, 0, self.size, True)

    def _subproof(self, m: int, start: int, end: int, whole: bool) -> list[bytes]:
        n = end - start
        if m == n:
            return [] if whole else [self.subtree(start, end)]
        k = 1 << ((n - 1).bit_length() - 1)
        if m <= k:
            return self._subproof(m, start, start + k, whole) + [self.subtree(start + k, end)]
        return self._subproof(m - k, start + k, end, False) + [self.subtree(start, start + k)]


def verify_inclusion(leaf: bytes, index: int, size: int, path: Sequence[bytes], root: bytes) -> bool:
    """RFC 9162 §2.1.3.2: does ``path`` prove ``leaf`` is leaf ``index`` of the tree ``root``?"""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while not fn & 1 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


def verify_consistency_path(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Sequence[bytes]
) -> bool:
    """RFC 9162 §2.1.4.2: does ``proof`` show the tree ``new_root`` extends ``old_root``?"""
    if not 0 <= old_size <= new_size:
        return False
    if old_size == 0:
        return not proof and old_root == EMPTY_ROOT
    if old_size == new_size:
        return not proof and old_root == new_root
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is a node of the new tree
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node_hash(c, fr)
            sr = node_hash(c, sr)
            while not fn & 1 and fn != 0:
                fn >>= 1
                sn >>= 1
        else:
            sr = node_hash(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


# ---------------------------------------------------------------------- public values


@dataclass(frozen=True, slots=True)
class AuditRoot:
    """A published root: ``size`` records, ``root`` (hex). ``last_seq``/``head`` say where."""

    size: int
    root: str
    last_seq: int = 0
    head: str = ""

    def to_dict(self) -> dict[str, Any]:
        """The proof as JSON (what ``verify_disclosure`` reads)."""
        return {"format": ROOT_FORMAT, "tree_size": self.size, "root": self.root,
                "last_seq": self.last_seq, "head": self.head}

    @classmethod
    def from_dict(cls, d: Any) -> AuditRoot:
        """Read a root from its JSON form; raises ``ConfigurationError`` if it is not one."""
        try:
            size, root = d["tree_size"], d["root"]
            if not isinstance(size, int) or size < 0 or not _is_hex(root, 64):
                raise ValueError
            return cls(size, root, int(d.get("last_seq", 0)), str(d.get("head", "")))
        except (KeyError, TypeError, ValueError):
            raise ConfigurationError(
                "not an audit root: expected {\"tree_size\": N, \"root\": \"<64 hex>\"} as "
                "printed by `agent-saga audit-root --json`"
            ) from None


@dataclass(frozen=True, slots=True)
class DisclosureResult:
    """The outcome of ``verify_disclosure``; truthy only if ``ok``."""

    ok: bool
    saga_id: str
    records: int
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.ok

    def describe(self) -> str:
        """One line for a human: verified, or why not."""
        if self.ok:
            return f"VALID: {self.records} records of saga {self.saga_id} are in the tree under this root"
        return f"INVALID: {self.reason}"


@dataclass(frozen=True, slots=True)
class ConsistencyResult:
    """The outcome of ``verify_consistency``; truthy only if ``ok``."""

    ok: bool
    old_size: int
    new_size: int
    reason: str | None = None

    def __bool__(self) -> bool:
        return self.ok

    def describe(self) -> str:
        """One line for a human: verified, or why not."""
        if self.ok:
            return f"CONSISTENT: the tree of {self.new_size} records extends the tree of {self.old_size}"
        return f"INCONSISTENT: {self.reason}"


def _is_hex(x: Any, n: int) -> bool:
    if not isinstance(x, str) or len(x) != n:
        return False
    try:
        bytes.fromhex(x)
    except ValueError:
        return False
    return True


def _tree(records: Sequence[Record]) -> MerkleTree:
    return MerkleTree([leaf_hash(r.hash) for r in records])


def _records(items: Iterable[Record | tuple[str, Record | WALCorrupt]], what: str) -> list[Record]:
    """``Record`` s, or the ``(location, record)`` pairs ``read_log`` yields, as records.
    Raises ``ConfigurationError`` for a damaged line or anything else, naming the fix."""
    out: list[Record] = []
    for entry in items:
        item: object = entry
        if isinstance(entry, tuple) and len(entry) == 2:
            location, item = entry
            if isinstance(item, WALCorrupt):
                raise ConfigurationError(f"{what}: the log is damaged at {location}: {item}; verify it first (agent-saga verify)")
        if not isinstance(item, Record):
            raise ConfigurationError(
                f"{what} takes the log's records (Record objects, or the (location, record) pairs "
                f"read_log(path) yields), got {type(item).__name__}")
        out.append(item)
    return out


def audit_root(records: Iterable[Record | tuple[str, Record | WALCorrupt]]) -> AuditRoot:
    """The Merkle root over ``records`` in log order (publish it once; disclose against it).

    ``records``: ``Record`` s, or what ``read_log(path)`` yields. They are taken as given:
    check the chain first (``verify_records``; the CLI's ``audit-root`` refuses a broken
    chain) so that the root is over a log worth proving.
    """
    recs = _records(records, "audit_root")
    tree = _tree(recs)
    last = recs[-1] if recs else None
    return AuditRoot(tree.size, tree.root.hex(), last.seq if last else 0, last.hash if last else "")


def _revealed(rec: Record) -> dict[str, Any]:
    d = rec.to_dict()
    out = {k: d[k] for k in _HASHED_FIELDS}
    if rec.redacted:
        out["redacted"] = True
    return out


def build_disclosure(records: Iterable[Record | tuple[str, Record | WALCorrupt]], saga_id: str) -> dict[str, Any]:
    """A proof that saga ``saga_id``'s records are in the tree of ``audit_root(records)``.

    The proof is JSON-ready: the saga's records (hashed fields only) each with its leaf
    index and RFC 6962 audit path, plus the tree size and root. Nothing of another record
    appears but node hashes. ``records`` as ``audit_root`` takes them. Raises
    ``ConfigurationError`` if the saga has no record.
    """
    recs = _records(records, "build_disclosure")
    tree = _tree(recs)
    entries = [
        {"index": i, "record": _revealed(r),
         "path": [h.hex() for h in tree.inclusion_path(i)]}
        for i, r in enumerate(recs)
        if r.saga == saga_id
    ]
    if not entries:
        raise ConfigurationError(
            f"saga {saga_id!r} has no record in this log (of {tree.size}); check the id with "
            f"`agent-saga inspect`"
        )
    return {
        "format": DISCLOSURE_FORMAT,
        "saga": saga_id,
        "tree_size": tree.size,
        "root": tree.root.hex(),
        "leaf": "SHA-256(0x00 || bytes.fromhex(record.hash))",
        "records": entries,
    }


def _root_of(root: AuditRoot | str | dict[str, Any]) -> tuple[bytes, int | None]:
    if isinstance(root, AuditRoot):
        return bytes.fromhex(root.root), root.size
    if isinstance(root, dict):
        r = AuditRoot.from_dict(root)
        return bytes.fromhex(r.root), r.size
    if not _is_hex(root, 64):
        raise ConfigurationError("a root is 64 hex characters (or an AuditRoot)")
    return bytes.fromhex(root), None


def verify_disclosure(proof: dict[str, Any], root: AuditRoot | str | dict[str, Any]) -> DisclosureResult:
    """Check a disclosure against a published root, trusting nothing else in the proof.

    Every revealed record must re-derive its own hash (salted digest, header), belong to
    the disclosed saga, and sit at its index under ``root`` by its audit path; indices
    ascend with ``seq``. Returns a ``DisclosureResult`` naming the first failure.
    """
    want, want_size = _root_of(root)
    saga = proof.get("saga") if isinstance(proof, dict) else None

    def bad(reason: str) -> DisclosureResult:
        return DisclosureResult(False, str(saga), 0, reason)

    if not isinstance(proof, dict) or proof.get("format") != DISCLOSURE_FORMAT:
        return bad(f"not a disclosure (expected format {DISCLOSURE_FORMAT!r})")
    size = proof.get("tree_size")
    entries = proof.get("records")
    if not isinstance(saga, str) or not isinstance(size, int) or not isinstance(entries, list) or not entries:
        return bad("the disclosure is missing its saga, tree_size or records")
    if want_size is not None and size != want_size:
        return bad(f"the disclosure is for a tree of {size} records, the root is of {want_size}")
    last_index, last_seq, last_hash = -1, -1, ""
    for n, e in enumerate(entries):
        try:
            index, path = e["index"], [bytes.fromhex(h) for h in e["path"]]
            rec = decode_line(_line(e["record"]), f"disclosed record {n}")
        except (KeyError, TypeError, ValueError, WALCorrupt) as exc:
            return bad(f"disclosed record {n} is malformed: {exc}")
        if rec.extra:
            return bad(f"disclosed record {n} carries fields the chain does not cover: {sorted(rec.extra)}")
        if rec.saga != saga:
            return bad(f"disclosed record {n} (seq {rec.seq}) belongs to saga {rec.saga!r}, not {saga!r}")
        why = check_record(rec, rec.prev, None)
        if why is not None:
            return bad(f"disclosed record seq {rec.seq}: {why}")
        if not isinstance(index, int) or index <= last_index or rec.seq <= last_seq:
            return bad(f"disclosed record seq {rec.seq}: indices and sequences must ascend")
        if index == last_index + 1 and rec.seq == last_seq + 1 and rec.prev != last_hash:
            return bad(f"disclosed record seq {rec.seq} does not link to the disclosed record before it")
        if not verify_inclusion(leaf_hash(rec.hash), index, size, path, want):
            return bad(f"disclosed record seq {rec.seq} (leaf {index}) is not in the tree under this root")
        last_index, last_seq, last_hash = index, rec.seq, rec.hash
    return DisclosureResult(True, saga, len(entries))


def _line(d: Any) -> str:
    if not isinstance(d, dict):
        raise TypeError("a record must be an object")
    return json.dumps(d)


def build_consistency(records: Iterable[Record | tuple[str, Record | WALCorrupt]], old_size: int) -> dict[str, Any]:
    """A proof that the tree over ``records`` extends the tree over its first ``old_size``.

    Holds only while the log only grew: a compaction (records removed) or any rewrite
    makes the earlier root unprovable, which is the point.
    """
    recs = _records(records, "build_consistency")
    tree = _tree(recs)
    proof = tree.consistency_proof(old_size)
    return {
        "format": CONSISTENCY_FORMAT,
        "old_size": old_size,
        "old_root": tree.subtree(0, old_size).hex(),
        "new_size": tree.size,
        "new_root": tree.root.hex(),
        "path": [h.hex() for h in proof],
    }


def verify_consistency(
    proof: dict[str, Any],
    old_root: AuditRoot | str | dict[str, Any],
    new_root: AuditRoot | str | dict[str, Any],
) -> ConsistencyResult:
    """Check that ``new_root`` extends ``old_root`` by ``proof`` (RFC 6962 §2.1.2)."""
    old, old_n = _root_of(old_root)
    new, new_n = _root_of(new_root)
    try:
        m, n = proof["old_size"], proof["new_size"]
        path = [bytes.fromhex(h) for h in proof["path"]]
        if proof.get("format") != CONSISTENCY_FORMAT or not isinstance(m, int) or not isinstance(n, int):
            raise ValueError
    except (KeyError, TypeError, ValueError, AttributeError):
        return ConsistencyResult(False, 0, 0, f"not a consistency proof (expected format {CONSISTENCY_FORMAT!r})")
    if old_n is not None and old_n != m or new_n is not None and new_n != n:
        return ConsistencyResult(False, m, n, "the proof's sizes do not match the roots' sizes")
    if not verify_consistency_path(m, n, old, new, path):
        return ConsistencyResult(
            False, m, n,
            f"the tree of {n} records does not extend the tree of {m}: records were removed, "
            f"reordered or rewritten (a compaction does this legitimately), or the roots are of different logs",
        )
    return ConsistencyResult(True, m, n)
