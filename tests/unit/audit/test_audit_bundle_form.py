"""Both bundle verifiers (the CLI's ``agent-saga verify-bundle`` and the standalone
docs/verify_bundle.py, each run as a real process) refuse a bundle whose files are not in
the form an export writes, even when a forger re-summed every checksum: a key repeated in
one JSON object (parsers disagree on which value counts: a reader shown the first value
while the chain verified the last), a UTF-8 byte order mark, CRLF line endings."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest
from agent_saga import FileWAL
from agent_saga.audit import export_bundle
from fixtures.cli import cli

SCRIPT = Path(__file__).resolve().parents[3] / "docs" / "verify_bundle.py"
BOM = b"\xef\xbb\xbf"


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-S", "-I", str(SCRIPT), *args], capture_output=True, text=True,
                          timeout=60)


def _bundle(tmp_path: Path) -> Path:
    p = tmp_path / "a.wal"
    wal = FileWAL(p)
    wal.append("SAGA_STARTED", "pay-1", None, {"name": "pay"})
    wal.append("APPROVAL_DECIDED", "pay-1", "pay-1/0", {"decision": "deny", "by": "cfo@corp"})
    wal.append("SAGA_COMPLETED", "pay-1", None, {})
    wal.barrier_sync()
    wal.close()
    out = tmp_path / "bundle"
    export_bundle(p, out)
    for f in out.iterdir():
        f.chmod(0o644)
    return out


def _resum(out: Path, manifest: bytes | None = None, sums_eol: bytes = b"\n") -> None:
    """What a careful forger does after changing a file: every checksum made to agree."""
    rec = (out / "records.ndjson").read_bytes()
    m = json.loads((out / "manifest.json").read_bytes().lstrip(BOM))
    m["records_sha256"] = hashlib.sha256(rec).hexdigest()
    m["records_bytes"] = len(rec)
    data = manifest if manifest is not None else (json.dumps(m, indent=2, sort_keys=True) + "\n").encode()
    (out / "manifest.json").write_bytes(data)
    (out / "SHA256SUMS").write_bytes(
        f"{hashlib.sha256(rec).hexdigest()}  records.ndjson".encode() + sums_eol
        + f"{hashlib.sha256(data).hexdigest()}  manifest.json".encode() + sums_eol)


def _manifest_text(out: Path) -> str:
    rec = (out / "records.ndjson").read_bytes()
    m = json.loads((out / "manifest.json").read_bytes())
    m["records_sha256"] = hashlib.sha256(rec).hexdigest()
    m["records_bytes"] = len(rec)
    return json.dumps(m, indent=2, sort_keys=True) + "\n"


def _forge(out: Path, attack: str) -> str:
    """Apply ``attack`` to the bundle ``out``; return what the refusal must say."""
    rec = out / "records.ndjson"
    lines = rec.read_bytes().splitlines(keepends=True)
    if attack == "records-duplicate-key":
        # The denial is shown as an approval to a first-wins reader; the chain checks the last.
        lines[1] = lines[1].replace(b'"payload":{', b'"payload":{"decision":"approve","by":"cfo@corp"},"payload":{', 1)
        rec.write_bytes(b"".join(lines))
        _resum(out)
        return "records.ndjson line 2 repeats the key 'payload' in one object"
    if attack == "records-nested-duplicate-key":
        lines[1] = lines[1].replace(b'{"by":"cfo@corp",', b'{"by":"cfo@corp","decision":"approve",', 1)
        assert lines[1].count(b'"decision"') == 2
        rec.write_bytes(b"".join(lines))
        _resum(out)
        return "records.ndjson line 2 repeats the key 'decision' in one object"
    if attack == "records-bom":
        rec.write_bytes(BOM + b"".join(lines))
        _resum(out)
        return "records.ndjson line 1 starts with a UTF-8 byte order mark (BOM)"
    if attack == "records-crlf":
        rec.write_bytes(b"".join(x.replace(b"\n", b"\r\n") for x in lines))
        _resum(out)
        return "records.ndjson line 1 has a CR (CRLF line endings)"
    text = _manifest_text(out)
    if attack == "manifest-duplicate-key":
        fake = '  "head": "' + "0" * 64 + '",\n'
        _resum(out, ("{\n" + fake + text[2:]).encode())
        return "manifest.json repeats the key 'head' in one object"
    if attack == "manifest-bom":
        _resum(out, BOM + text.encode())
        return "manifest.json line 1 starts with a UTF-8 byte order mark (BOM)"
    if attack == "manifest-crlf":
        _resum(out, text.replace("\n", "\r\n").encode())
        return "manifest.json line 1 has a CR (CRLF line endings)"
    assert attack == "sums-crlf"
    _resum(out, sums_eol=b"\r\n")
    return "SHA256SUMS line 1 has a CR (CRLF line endings)"


ATTACKS = ["records-duplicate-key", "records-nested-duplicate-key", "records-bom", "records-crlf",
           "manifest-duplicate-key", "manifest-bom", "manifest-crlf", "sums-crlf"]


@pytest.mark.parametrize("attack", ATTACKS)
def test_both_verifiers_refuse_a_bundle_not_in_export_form(tmp_path: Path, attack: str) -> None:
    out = _bundle(tmp_path)
    assert cli("verify-bundle", str(out)).returncode == 0 and script(str(out)).returncode == 0
    said = _forge(out, attack)
    ours = cli("verify-bundle", str(out), "--json")
    assert ours.returncode == 1, (attack, ours.stdout, ours.stderr)
    assert any(said in p for p in json.loads(ours.stdout)["problems"]), (said, ours.stdout)
    theirs = script(str(out))
    assert theirs.returncode == 1, (attack, theirs.stdout, theirs.stderr)
    assert f"FAILED: {said}" in theirs.stdout, (said, theirs.stdout)
