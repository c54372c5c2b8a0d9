"""Merkle selective disclosure: RFC 6962 interop, disclosure privacy, tamper and consistency."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from agent_saga import FileWAL
from agent_saga.audit import (
    AuditRoot,
    audit_root,
    build_consistency,
    build_disclosure,
    redact_records,
    verify_consistency,
    verify_disclosure,
)
from agent_saga.audit.merkle import (
    MerkleTree,
    leaf_hash,
    verify_consistency_path,
    verify_inclusion,
)
from agent_saga.records import Record
from fixtures.cli import cli
from fixtures.wal import records as _records
from hypothesis import given, settings
from hypothesis import strategies as st

# ------------------------------------------------------------------ RFC 6962 reference
# Written from RFC 6962 §2.1 text, recursively, sharing nothing with the implementation.


def _h(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _k(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def ref_mth(d: list[bytes]) -> bytes:
    """MTH(D[n]); d holds the leaf *inputs*."""
    n = len(d)
    if n == 0:
        return _h(b"")
    if n == 1:
        return _h(b"\x00" + d[0])
    k = _k(n)
    return _h(b"\x01" + ref_mth(d[:k]) + ref_mth(d[k:]))


def ref_path(m: int, d: list[bytes]) -> list[bytes]:
    """PATH(m, D[n])."""
    n = len(d)
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return ref_path(m, d[:k]) + [ref_mth(d[k:])]
    return ref_path(m - k, d[k:]) + [ref_mth(d[:k])]


def ref_proof(m: int, d: list[bytes]) -> list[bytes]:
    """PROOF(m, D[n]) = SUBPROOF(m, D[n], true)."""

    def sub(m: int, d: list[bytes], b: bool) -> list[bytes]:
        n = len(d)
        if m == n:
            return [] if b else [ref_mth(d)]
        k = _k(n)
        if m <= k:
            return sub(m, d[:k], b) + [ref_mth(d[k:])]
        return sub(m - k, d[k:], False) + [ref_mth(d[:k])]

    return sub(m, d, True)


def ref_root_from_path(leaf_input: bytes, m: int, n: int, path: list[bytes]) -> bytes:
    """Recompute the root from an audit path by the same recursion PATH was defined with."""
    if n == 1:
        assert not path
        return _h(b"\x00" + leaf_input)
    k = _k(n)
    if m < k:
        return _h(b"\x01" + ref_root_from_path(leaf_input, m, k, path[:-1]) + path[-1])
    return _h(b"\x01" + path[-1] + ref_root_from_path(leaf_input, m - k, n - k, path[:-1]))


def _inputs(n: int) -> list[bytes]:
    return [hashlib.sha256(f"record {i}".encode()).digest() for i in range(n)]


def _tree(inputs: list[bytes]) -> MerkleTree:
    return MerkleTree([leaf_hash(x.hex()) for x in inputs])


# ------------------------------------------------------------------ interop


@pytest.mark.parametrize("n", [*range(0, 34), 63, 64, 65, 100, 127, 129])
def test_root_and_every_inclusion_path_match_the_reference(n: int) -> None:
    d = _inputs(n)
    tree = _tree(d)
    assert tree.root == ref_mth(d)
    for m in range(n):
        path = tree.inclusion_path(m)
        assert path == ref_path(m, d), (m, n)
        assert ref_root_from_path(d[m], m, n, path) == tree.root
        assert verify_inclusion(_h(b"\x00" + d[m]), m, n, path, tree.root)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7, 8, 9, 16, 17, 31, 33])
def test_every_consistency_proof_matches_the_reference(n: int) -> None:
    d = _inputs(n)
    tree = _tree(d)
    for m in range(0, n + 1):
        proof = tree.consistency_proof(m)
        expected = [] if m in (0, n) else ref_proof(m, d)
        assert proof == expected, (m, n)
        assert verify_consistency_path(m, n, ref_mth(d[:m]), tree.root, proof), (m, n)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 300), data=st.data())
def test_random_trees_agree_and_tampering_fails(n: int, data: st.DataObject) -> None:
    d = _inputs(n)
    tree = _tree(d)
    m = data.draw(st.integers(0, n - 1))
    path = tree.inclusion_path(m)
    assert path == ref_path(m, d)
    leaf = _h(b"\x00" + d[m])
    assert verify_inclusion(leaf, m, n, path, tree.root)
    if path:
        i = data.draw(st.integers(0, len(path) - 1))
        bad = list(path)
        bad[i] = _h(bad[i])
        assert not verify_inclusion(leaf, m, n, bad, tree.root)
        assert not verify_inclusion(leaf, m, n, path[:-1], tree.root)
    if n > 1:
        other = data.draw(st.integers(0, n - 1).filter(lambda x: x != m))
        assert not verify_inclusion(leaf, other, n, path, tree.root)
    assert not verify_inclusion(_h(b"\x00" + b"forged"), m, n, path, tree.root)
    # A leaf input hashed as a node (no domain separation) must not verify.
    assert not verify_inclusion(_h(b"\x01" + d[m]), m, n, path, tree.root)
    old = data.draw(st.integers(1, n))
    proof = tree.consistency_proof(old)
    assert proof == ([] if old == n else ref_proof(old, d))
    assert verify_consistency_path(old, n, ref_mth(d[:old]), tree.root, proof)
    if old < n:
        assert not verify_consistency_path(old, n, ref_mth(d[:old]), _h(tree.root), proof)
        changed = [*d[: old - 1], b"rewritten", *d[old:]]
        assert not verify_consistency_path(old, n, ref_mth(changed[:old]), tree.root, proof)


# ------------------------------------------------------------------ disclosure over a real log


def _log(path: Path, sagas: int = 5) -> list[Record]:
    wal = FileWAL(path)
    for i in range(sagas):
        sid = f"checkout_{400 + i}"
        wal.append("SAGA_STARTED", sid, None, {"name": "checkout", "customer": f"cust-{i}"})
        wal.append("STEP_INTENT", sid, f"{sid}/0", {"tool": "stripe.charge", "semantics": "COMPENSABLE"})
        wal.append("STEP_COMMITTED", sid, f"{sid}/0", {"compensation": {"handler": "stripe.refund",
                                                        "kwargs": {"charge_id": f"ch_{i}", "amount": 4200 + i}}})
        wal.append("SAGA_COMPLETED", sid, None, {})
    wal.barrier_sync()
    wal.close()
    return _records(path)


def test_disclosure_verifies_and_reveals_only_one_saga(tmp_path: Path) -> None:
    recs = _log(tmp_path / "a.wal")
    root = audit_root(recs)
    proof = build_disclosure(recs, saga_id="checkout_402")
    result = verify_disclosure(proof, root)
    assert result and result.ok and result.records == 4
    text = json.dumps(proof)
    for i in (0, 1, 3, 4):
        assert f"checkout_40{i}" not in text and f"cust-{i}" not in text and f"ch_{i}" not in text
    other = {r.hash for r in recs if r.saga != "checkout_402"}
    assert not any(h in text for h in other - {r.prev for r in recs if r.saga == "checkout_402"})
    # The hex root alone works too (the proof carries the size).
    assert verify_disclosure(proof, root.root).ok
    assert verify_disclosure(proof, root.to_dict()).ok


@pytest.mark.parametrize("sagas", [1, 3, 7])
def test_disclosure_on_odd_sizes(tmp_path: Path, sagas: int) -> None:
    recs = _log(tmp_path / "a.wal", sagas)[:-1]  # an odd number of leaves
    root = audit_root(recs)
    for r in {r.saga for r in recs}:
        assert verify_disclosure(build_disclosure(recs, saga_id=r), root).ok


def _tamper(proof: dict, fn) -> dict:
    p = json.loads(json.dumps(proof))
    fn(p)
    return p


@pytest.mark.parametrize(
    "what, fn, reason",
    [
        ("payload", lambda p: p["records"][2]["record"]["payload"]["compensation"]["kwargs"].update(amount=1),
         "digest"),
        ("saga relabelled", lambda p: p.update(saga="checkout_401"), "belongs to saga"),
        ("record's saga", lambda p: p["records"][0]["record"].update(saga="checkout_401"), "belongs to saga"),
        ("index", lambda p: p["records"][1].update(index=p["records"][1]["index"] + 1), "not in the tree"),
        ("path node", lambda p: p["records"][0]["path"].__setitem__(0, "00" * 32), "not in the tree"),
        ("tree size", lambda p: p.update(tree_size=p["tree_size"] + 1), "tree of"),
        ("order", lambda p: p["records"].reverse(), "ascend"),
        ("format", lambda p: p.update(format="x"), "not a disclosure"),
        ("dropped field", lambda p: p["records"][0]["record"].pop("salt"), "malformed"),
        ("smuggled field", lambda p: p["records"][0]["record"].update(gseq=9), "does not cover"),
    ],
)
def test_tampered_disclosure_fails(tmp_path: Path, what: str, fn, reason: str) -> None:
    recs = _log(tmp_path / "a.wal")
    root = audit_root(recs)
    proof = build_disclosure(recs, saga_id="checkout_402")
    result = verify_disclosure(_tamper(proof, fn), root)
    assert not result, what
    assert reason in (result.reason or ""), (what, result.reason)


def test_disclosure_against_another_root_fails(tmp_path: Path) -> None:
    recs = _log(tmp_path / "a.wal")
    proof = build_disclosure(recs, saga_id="checkout_402")
    assert not verify_disclosure(proof, audit_root(recs[:-1]))
    assert not verify_disclosure(proof, AuditRoot(len(recs), "ab" * 32))


def test_unknown_saga_is_refused(tmp_path: Path) -> None:
    recs = _log(tmp_path / "a.wal")
    with pytest.raises(Exception, match="no record"):
        build_disclosure(recs, saga_id="nope")


def test_redaction_keeps_the_root_and_disclosure_still_verifies(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    recs = _log(p)
    root = audit_root(recs)
    seqs = [r.seq for r in recs if r.saga == "checkout_402"]
    redact_records(p, seqs, note=False)
    after = _records(p)
    assert audit_root(after) == root
    proof = build_disclosure(after, saga_id="checkout_402")
    assert verify_disclosure(proof, root).ok
    assert all(e["record"]["payload"] is None and e["record"]["redacted"] for e in proof["records"])


async def test_consistency_holds_while_the_log_grows_and_fails_after_compaction(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    recs = _log(p, 3)
    old = audit_root(recs)
    wal = FileWAL(p)
    wal.append("SAGA_STARTED", "open-1", None, {"name": "x"})
    wal.append("STEP_INTENT", "open-1", "open-1/0", {"tool": "t", "semantics": "COMPENSABLE"})
    await wal.barrier()
    grown = _records(p)
    new = audit_root(grown)
    proof = build_consistency(grown, old.size)
    assert verify_consistency(proof, old, new).ok
    assert not verify_consistency(proof, audit_root(recs[:-1]), new)
    await wal.compact()
    for i in range(20):  # grow past the old size again: the old root is still not a prefix
        wal.append("SAGA_STARTED", f"later-{i}", None, {})
    await wal.barrier()
    wal.close()
    compacted = _records(p)
    assert len(compacted) > old.size
    later = audit_root(compacted)
    result = verify_consistency(build_consistency(compacted, old.size), old, later)
    assert not result and "does not extend" in (result.reason or "")


# ------------------------------------------------------------------ CLI


def test_cli_audit_root_prove_verify_proof(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    root_file = tmp_path / "root.json"
    r = cli("audit-root", "--wal-path", str(p), "--out", str(root_file))
    assert r.returncode == 0, r.stderr
    proof_file = tmp_path / "proof.json"
    r = cli("prove", "--wal-path", str(p), "--saga", "checkout_402", "--out", str(proof_file))
    assert r.returncode == 0, r.stderr
    r = cli("verify-proof", str(proof_file), "--root", str(root_file))
    assert r.returncode == 0 and r.stdout.startswith("VALID"), r.stdout + r.stderr
    hex_root = json.loads(root_file.read_text())["root"]
    assert cli("verify-proof", str(proof_file), "--root", hex_root).returncode == 0
    bad = json.loads(proof_file.read_text())
    bad["records"][0]["record"]["payload"] = {"name": "forged"}
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    r = cli("verify-proof", str(tmp_path / "bad.json"), "--root", str(root_file))
    assert r.returncode == 1 and "INVALID" in r.stdout
    # consistency, after the log grew
    wal = FileWAL(p)
    wal.append("SAGA_STARTED", "more", None, {})
    wal.barrier_sync()
    wal.close()
    size = json.loads(root_file.read_text())["tree_size"]
    cons = tmp_path / "cons.json"
    assert cli("prove", "--wal-path", str(p), "--from-size", str(size), "--out", str(cons)).returncode == 0
    new_root = tmp_path / "root2.json"
    assert cli("audit-root", "--wal-path", str(p), "--out", str(new_root)).returncode == 0
    r = cli("verify-proof", str(cons), "--old-root", str(root_file), "--root", str(new_root))
    assert r.returncode == 0 and r.stdout.startswith("CONSISTENT"), r.stdout + r.stderr
    r = cli("verify-proof", str(cons), "--old-root", str(new_root), "--root", str(new_root))
    assert r.returncode == 1


def test_cli_audit_root_refuses_a_broken_chain(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    p.write_bytes(p.read_bytes().replace(b'"cust-1"', b'"cust-9"'))
    r = cli("audit-root", "--wal-path", str(p))
    assert r.returncode == 1 and "does not verify" in r.stderr
    r = cli("prove", "--wal-path", str(p), "--saga", "checkout_402")
    assert r.returncode == 1
