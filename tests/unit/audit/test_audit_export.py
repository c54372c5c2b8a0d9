"""WORM export: sha256sum -c, the standalone docs/verify_bundle.py, and `agent-saga verify` agree."""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from agent_saga import ConfigurationError, FileWAL, WALError, verify_records
from agent_saga.audit import export_bundle, redact_records, verify_bundle
from agent_saga.wal.file import iter_file_records
from fixtures.cli import cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SCRIPT = Path(__file__).resolve().parents[3] / "docs" / "verify_bundle.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("standalone_verify_bundle", SCRIPT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


standalone = _load_script()


def script(*args: str) -> subprocess.CompletedProcess[str]:
    # A bare interpreter with no site-packages: the script cannot import agent_saga.
    return subprocess.run([sys.executable, "-S", "-I", str(SCRIPT), *args],
                          capture_output=True, text=True, timeout=60)


def _log(path: Path, sagas: int = 4, *, done: bool = True) -> None:
    wal = FileWAL(path)
    for i in range(sagas):
        sid = f"s-{i}"
        wal.append("SAGA_STARTED", sid, None, {"name": "pay", "note": "é ü 漢"})
        wal.append("STEP_INTENT", sid, f"{sid}/0", {"tool": "stripe.charge", "semantics": "COMPENSABLE"})
        wal.append("STEP_COMMITTED", sid, f"{sid}/0", {"compensation": {"handler": "stripe.refund",
                                                        "kwargs": {"amount": 4200 + i}}})
        if done or i % 2 == 0:
            wal.append("SAGA_COMPLETED", sid, None, {})
    wal.barrier_sync()
    wal.close()


def _writable(d: Path) -> None:
    for f in d.iterdir():
        f.chmod(0o644)


def test_script_imports_only_the_standard_library() -> None:
    tree = ast.parse(SCRIPT.read_text())
    names = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    names |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert names <= set(sys.stdlib_module_names), names


def test_export_is_checkable_with_sha256sum_and_the_script(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    out = tmp_path / "audit-2026-07"
    r = cli("export", "--wal-path", str(p), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert sorted(os.listdir(out)) == ["SHA256SUMS", "manifest.json", "records.ndjson"]
    for f in out.iterdir():
        assert stat.S_IMODE(f.stat().st_mode) == 0o444
    assert (out / "records.ndjson").read_bytes() == p.read_bytes()  # the exact lines
    s = subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True, text=True)
    assert s.returncode == 0 and "records.ndjson: OK" in s.stdout and "manifest.json: OK" in s.stdout
    m = json.loads((out / "manifest.json").read_text())
    assert m["records_sha256"] == hashlib.sha256(p.read_bytes()).hexdigest()
    assert m["broken"] is False and m["records"] == 16 and m["first_seq"] == 1 and m["last_seq"] == 16
    assert m["head"] == json.loads(p.read_bytes().splitlines()[-1])["hash"]
    assert any("sha256sum -c SHA256SUMS" in line for line in m["rule"])
    r = script(str(out))
    assert r.returncode == 0 and r.stdout.startswith("OK"), r.stdout + r.stderr
    assert cli("verify-bundle", str(out)).returncode == 0
    r = cli("verify", "--wal-path", str(out / "records.ndjson"), "--head", m["head"])
    assert r.returncode == 0, r.stdout


def test_export_refuses_a_broken_chain_and_leaves_nothing(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    p.write_bytes(p.read_bytes().replace(b'"amount":4202', b'"amount":1'))
    out = tmp_path / "bundle"
    r = cli("export", "--wal-path", str(p), "--out", str(out))
    assert r.returncode == 1 and "refusing to export a broken chain" in r.stderr
    assert "--allow-broken" in r.stderr
    assert not out.exists() and os.listdir(tmp_path) == ["a.wal"]


def test_allow_broken_labels_the_bundle(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    p.write_bytes(p.read_bytes().replace(b'"amount":4202', b'"amount":1'))
    out = tmp_path / "bundle"
    r = cli("export", "--wal-path", str(p), "--out", str(out), "--allow-broken")
    assert r.returncode == 1 and "BROKEN" in r.stdout
    m = json.loads((out / "manifest.json").read_text())
    assert m["broken"] is True and m["broken_at"]["seq"] == 11 and m["audit_root"] is None
    assert m["broken_at"]["location"] == "records.ndjson line 11"
    assert subprocess.run(["sha256sum", "-c", "SHA256SUMS"], cwd=out, capture_output=True).returncode == 0
    r = script(str(out))
    assert r.returncode == 1 and "LABELLED BROKEN" in r.stdout and "seq 11" in r.stdout
    res = verify_bundle(out)
    assert not res.ok and res.labelled_broken and not res.problems
    # Relabelling it as intact (and fixing the sums) does not make it pass.
    _writable(out)
    m["broken"], m["broken_at"] = False, None
    _rewrite_manifest(out, m)
    assert script(str(out)).returncode == 1 and not verify_bundle(out).ok


def _rewrite_manifest(out: Path, m: dict) -> None:
    data = (json.dumps(m, indent=2, sort_keys=True, ensure_ascii=False) + "\n").encode()
    (out / "manifest.json").write_bytes(data)
    rec = hashlib.sha256((out / "records.ndjson").read_bytes()).hexdigest()
    (out / "SHA256SUMS").write_text(f"{rec}  records.ndjson\n{hashlib.sha256(data).hexdigest()}  manifest.json\n")


def test_export_refuses_a_non_empty_target(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p, 1)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "x").write_text("x")
    with pytest.raises(ConfigurationError, match="written once"):
        export_bundle(p, tmp_path / "out")
    (tmp_path / "empty").mkdir()
    export_bundle(p, tmp_path / "empty")  # an empty directory is fine
    assert verify_bundle(tmp_path / "empty").ok


def test_torn_tail_is_not_exported(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p, 1)
    whole = p.read_bytes()
    p.write_bytes(whole + b'{"v":1,"seq":5,"ts":')
    m = export_bundle(p, tmp_path / "b")
    assert (tmp_path / "b" / "records.ndjson").read_bytes() == whole
    assert m["records"] == 4 and verify_bundle(tmp_path / "b").ok


@pytest.mark.parametrize(
    "attack",
    ["edit-records", "edit-manifest-head", "truncate-records", "delete-sums", "delete-line-resum",
     "edit-line-resum", "head-resum", "count-resum", "root-resum", "records-missing"],
)
def test_tampered_bundles_fail_both_verifiers(tmp_path: Path, attack: str) -> None:
    p = tmp_path / "a.wal"
    _log(p)
    out = tmp_path / "b"
    export_bundle(p, out)
    _writable(out)
    rec = out / "records.ndjson"
    m = json.loads((out / "manifest.json").read_text())
    lines = rec.read_bytes().splitlines(keepends=True)
    if attack == "edit-records":
        rec.write_bytes(rec.read_bytes().replace(b'"amount":4201', b'"amount":9'))
    elif attack == "edit-manifest-head":
        (out / "manifest.json").write_text((out / "manifest.json").read_text().replace(m["head"], "0" * 64))
    elif attack == "truncate-records":
        rec.write_bytes(rec.read_bytes()[:-30])
    elif attack == "delete-sums":
        (out / "SHA256SUMS").unlink()
    elif attack == "records-missing":
        rec.unlink()
    else:
        # A careful forger: changes the records, then recomputes every checksum.
        if attack == "delete-line-resum":
            del lines[5]
        elif attack == "edit-line-resum":
            lines[5] = lines[5].replace(b"stripe.charge", b"stripe.chargx")
        rec.write_bytes(b"".join(lines))
        m["records_sha256"] = hashlib.sha256(rec.read_bytes()).hexdigest()
        if attack == "head-resum":  # drop the last record and claim the earlier head
            rec.write_bytes(b"".join(lines[:-1]))
            m["records_sha256"] = hashlib.sha256(rec.read_bytes()).hexdigest()
        if attack == "count-resum":
            m["records"] += 1
        if attack == "root-resum":
            m["audit_root"]["root"] = "ab" * 32
        _rewrite_manifest(out, m)
    ours = verify_bundle(out)
    theirs = script(str(out), "--json")
    assert not ours.ok, attack
    assert theirs.returncode == 1, (attack, theirs.stdout, theirs.stderr)
    assert bool(json.loads(theirs.stdout)["problems"]) == bool(ours.problems)
    if attack not in ("delete-sums", "records-missing", "edit-manifest-head"):
        sums = subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=out, capture_output=True)
        if attack.endswith("resum"):
            assert sums.returncode == 0  # the checksums alone cannot catch a re-summed forgery...
            assert any("manifest" in x or "chain" in x for x in ours.problems)  # ...the rule does


def _export(tmp_path: Path, name: str) -> Path:
    out = tmp_path / name
    export_bundle(tmp_path / "a.wal", out)
    return out


async def test_compacted_and_redacted_logs_export_and_verify_everywhere(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p, 6, done=False)
    wal = FileWAL(p)
    await wal.compact()
    wal.append("SAGA_STARTED", "after", None, {"name": "late"})
    await wal.barrier()
    wal.close()
    redact_records(p, [next(r.seq for _, r in iter_file_records(p) if r.saga == "s-1")], reason="T-1")
    assert verify_records(iter_file_records(p)).ok
    out = _export(tmp_path, "b")
    m = json.loads((out / "manifest.json").read_text())
    assert m["first_seq"] > 1 and m["attested_missing"] > 0
    assert script(str(out)).returncode == 0
    assert verify_bundle(out).ok
    c = json.loads(cli("verify", "--wal-path", str(out / "records.ndjson"), "--json").stdout)
    s = json.loads(script(str(out), "--json").stdout)["chain"]
    assert (c["ok"], c["records"], c["head"], c["last_seq"]) == (s["ok"], s["records"], s["head"], s["last_seq"])


# ------------------------------------------------------------------ agreement, by hypothesis


@pytest.fixture(scope="module")
def compacted_log(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    import asyncio

    p = tmp_path_factory.mktemp("agree") / "a.wal"
    _log(p, 6, done=False)

    async def more() -> None:
        wal = FileWAL(p)
        await wal.compact()
        wal.append("SAGA_STARTED", "late", None, {"x": 1})
        wal.append("SAGA_COMPLETED", "late", None, {})
        await wal.barrier()
        wal.close()

    asyncio.run(more())
    redact_records(p, [r.seq for _, r in iter_file_records(p) if r.saga == "s-1"][:2], note=True)
    return p.read_bytes()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_script_agrees_with_verify_on_any_tampering(compacted_log: bytes, tmp_path: Path, data: st.DataObject) -> None:
    lines = compacted_log.splitlines(keepends=True)
    op = data.draw(st.sampled_from(["none", "byte", "swap", "delete", "duplicate", "truncate"]))
    blob = compacted_log
    if op == "byte":
        pos = data.draw(st.integers(0, len(blob) - 1))
        blob = blob[:pos] + bytes([data.draw(st.integers(0, 255))]) + blob[pos + 1 :]
    elif op in ("swap", "delete", "duplicate"):
        i = data.draw(st.integers(0, len(lines) - 1))
        j = data.draw(st.integers(0, len(lines) - 1))
        if op == "swap":
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "delete":
            del lines[i]
        else:
            lines.insert(j, lines[i])
        blob = b"".join(lines)
    elif op == "truncate":
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    f = tmp_path / "t.ndjson"
    f.write_bytes(blob)
    ours = verify_records(iter_file_records(f))
    theirs = standalone.verify_chain(str(f))
    assert ours.ok == theirs["ok"], (op, ours, theirs)
    assert (ours.records, ours.head, ours.last_seq) == (theirs["records"], theirs["head"], theirs["last_seq"])
    assert ours.first_bad_seq == theirs["first_bad_seq"], (op, ours, theirs)


def test_export_refuses_missing_log(tmp_path: Path) -> None:
    r = cli("export", "--wal-path", str(tmp_path / "nope.wal"), "--out", str(tmp_path / "b"))
    assert r.returncode == 2 and "does not exist" in r.stderr
    assert not (tmp_path / "b").exists()


def test_library_export_raises_wal_error_on_broken(tmp_path: Path) -> None:
    p = tmp_path / "a.wal"
    _log(p, 1)
    p.write_bytes(p.read_bytes().replace(b"stripe.charge", b"stripe.chargf"))
    with pytest.raises(WALError, match="broken chain"):
        export_bundle(p, tmp_path / "b")
