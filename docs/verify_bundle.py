#!/usr/bin/env python3
"""Re-check an agent-saga audit bundle with nothing but the Python standard library.

    python3 verify_bundle.py BUNDLE_DIR [--json]

Exit 0: the bundle is intact and the chain it holds verifies. Exit 1: something does not
add up (each problem is printed), or the bundle is labelled broken. Exit 2: usage.

This file is the verification rule in the bundle's manifest, written as code. It imports
nothing from agent-saga on purpose: an archive checkable only by the tool that wrote it is
a dependency, not evidence. Port it to any language with SHA-256 and a JSON parser.
"""

import hashlib
import re
import json
import os
import sys

FORMAT = "agent-saga.audit-bundle/v1"
ZERO = "0" * 64


# ------------------------------------------------------------------ the record rule


def canonical(payload):
    """Keys sorted, ',' ':' separators, UTF-8 (no \\u escapes for non-ASCII), no NaN."""
    return json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def read_record(line, where):
    """The record on one line as a dict, or a string saying why it cannot be read."""
    try:
        d = json.loads(line)
    except ValueError as exc:
        return f"{where}: not valid JSON ({exc})"
    if not isinstance(d, dict):
        return f"{where}: a record must be a JSON object"
    for key in ("v", "seq", "ts", "type", "saga", "step", "payload", "salt", "digest", "prev", "hash"):
        if key not in d:
            return f"{where}: record is missing required field {key!r}"
    if d["v"] != 1:
        return f"{where}: schema version v={d['v']!r} is not 1"
    for key in ("type", "saga", "digest", "prev", "hash"):
        if not isinstance(d[key], str):
            return f"{where}: field {key!r} must be a string"
    for key in ("seq", "ts"):
        if not isinstance(d[key], int) or isinstance(d[key], bool):
            return f"{where}: field {key!r} must be an integer"
    if d["step"] is not None and not isinstance(d["step"], str):
        return f"{where}: field 'step' must be a string or null"
    if d["payload"] is not None and not isinstance(d["payload"], dict):
        return f"{where}: field 'payload' must be an object or null"
    d["redacted"] = bool(d.get("redacted", False))
    return d


def record_problem(r, prev, expected):
    """Why record r does not follow prev / expected seq (None: it does). expected None: skip."""
    if expected is not None and r["seq"] != expected:
        if r["seq"] < expected:
            return f"sequence {r['seq']} repeats or goes backwards (expected {expected})"
        return f"sequence jumps from {expected - 1} to {r['seq']}"
    if r["prev"] != prev:
        return "prev does not match the hash of the record before it"
    if r["redacted"]:
        if r["payload"] is not None or r["salt"] is not None:
            return "record is marked redacted but still carries payload or salt"
    else:
        if r["salt"] is None:
            return "salt is missing on a record that is not redacted"
        if not isinstance(r["salt"], str) or re.fullmatch("[0-9a-f]{32}", r["salt"]) is None:
            return "salt is not 32 lowercase hex digits: the record was altered"
        try:
            text = "null" if r["payload"] is None else canonical(r["payload"])
        except ValueError:
            return "payload holds a value JSON cannot carry (NaN or Infinity)"
        try:
            digest = hashlib.sha256(bytes.fromhex(r["salt"]) + text.encode("utf-8")).hexdigest()
        except (TypeError, ValueError):
            return "salt is not hexadecimal"
        if digest != r["digest"]:
            return "payload does not match its digest"
    header = "\n".join(["1", str(r["seq"]), str(r["ts"]), r["type"], r["saga"], r["step"] or "",
                        r["digest"], r["prev"]])
    if hashlib.sha256(header.encode("utf-8")).hexdigest() != r["hash"]:
        return "hash does not match the record's header"
    return None


def attested_runs(r):
    """The runs [first, last, last_hash] a COMPACTION record of saga 'wal' names, or why not."""
    p = r["payload"]
    if p is None:
        return []
    runs = p.get("removed")
    if not isinstance(runs, list):
        return "compaction attestation has no 'removed' list"
    out, total, floor = [], 0, 0
    for run in runs:
        if (not isinstance(run, list) or len(run) != 3
                or not all(isinstance(x, int) and not isinstance(x, bool) for x in run[:2])
                or not isinstance(run[2], str) or len(run[2]) != 64):
            return f"compaction attestation has a malformed run {run!r}"
        first, last, last_hash = run
        if not floor < first <= last < r["seq"]:
            return f"compaction attestation run {first}..{last} is out of order"
        out.append((first, last, last_hash))
        total += last - first + 1
        floor = last
    if p.get("count") != total:
        return "compaction attestation count does not match its runs"
    return out


def verify_chain(path):
    """Check records.ndjson line by line. Returns a dict: ok, records, head, last_seq,
    first_bad_seq, line, reason. The first problem in log order is reported."""
    prev, expected, count, last_seq = ZERO, 1, 0, 0
    gaps = []  # (first, last, link, seq, line)
    runs = []  # (first, last)
    ends = {}  # last -> last_hash

    def covered(first, last):
        merged = []
        for a, b in sorted(runs):
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        return any(a <= first and b >= last for a, b in merged)

    def gap_problem(g):
        first, last, link = g[0], g[1], g[2]
        if not covered(first, last):
            return f"records {first}..{last} are missing and no compaction attestation accounts for them"
        if ends.get(last) != link:
            return f"records {first}..{last} are attested as removed, but the link across the gap does not match"
        return None

    def result(ok, seq=None, line=None, reason=None):
        return {"ok": ok, "records": count, "head": prev, "last_seq": last_seq,
                "first_bad_seq": seq, "line": line, "reason": reason}

    def broken(seq, line, reason):
        for g in gaps:
            why = gap_problem(g)
            if why is not None:
                return result(False, g[3], g[4], why)
        return result(False, seq, line, reason)

    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.endswith(b"\n"):
                break  # an unterminated fragment is not part of the chain
            if not raw.strip():
                return broken(last_seq + 1, lineno, "empty line inside the log")
            r = read_record(raw, f"line {lineno}")
            if isinstance(r, str):
                return broken(last_seq + 1, lineno, r)
            if r["seq"] > expected:
                why = record_problem(r, r["prev"], None)
                if why is None:
                    gaps.append((expected, r["seq"] - 1, r["prev"], r["seq"], lineno))
            else:
                why = record_problem(r, prev, expected)
            if why is not None:
                return broken(r["seq"], lineno, why)
            if r["type"] == "COMPACTION" and r["saga"] == "wal":
                named = attested_runs(r)
                if isinstance(named, str):
                    return broken(r["seq"], lineno, named)
                for first, last, last_hash in named:
                    runs.append((first, last))
                    ends[last] = last_hash
            prev, expected, last_seq, count = r["hash"], r["seq"] + 1, r["seq"], count + 1
    for g in gaps:
        why = gap_problem(g)
        if why is not None:
            return result(False, g[3], g[4], why)
    return result(True)


# ------------------------------------------------------------------ the Merkle root


def merkle_root(leaves):
    """RFC 6962: leaves already hashed with 0x00; nodes SHA-256(0x01 || left || right)."""
    if not leaves:
        return hashlib.sha256(b"").hexdigest()

    def mth(lo, hi):
        if hi - lo == 1:
            return leaves[lo]
        k = 1
        while k * 2 < hi - lo:
            k *= 2
        return hashlib.sha256(b"\x01" + mth(lo, lo + k) + mth(lo + k, hi)).digest()

    return mth(0, len(leaves)).hex()


def record_facts(path):
    """first_seq and the leaf hashes of every record (for a chain that verified)."""
    first, leaves = None, []
    with open(path, "rb") as f:
        for raw in f:
            if not raw.endswith(b"\n"):
                break
            d = json.loads(raw)
            first = d["seq"] if first is None else first
            leaves.append(hashlib.sha256(b"\x00" + bytes.fromhex(d["hash"])).digest())
    return first, leaves


# ------------------------------------------------------------------ the bundle


BOM = b"\xef\xbb\xbf"


class DuplicateKey(ValueError):
    """A key repeated in one JSON object."""


def unique_keys(pairs):
    """A JSON object that refuses a key repeated in it (parsers disagree on which counts)."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise DuplicateKey(k)
        out[k] = v
    return out


def duplicate_key(text, where):
    """Why the JSON ``text`` repeats a key in one object, or None."""
    try:
        json.loads(text, object_pairs_hook=unique_keys)
    except DuplicateKey as exc:
        return (f"{where} repeats the key {exc.args[0]!r} in one object: JSON parsers disagree on which "
                f"value counts, so a reader could see a value other than the one verified")
    except ValueError:
        pass  # not JSON at all: the chain or manifest check says so
    return None


def form_problem(lines, name, json_lines=False, json_doc=False):
    """Why a bundle file (its lines, read in binary) is not in the form an export writes:
    a UTF-8 byte order mark, a CR (CRLF line endings), or a JSON key repeated in one object.
    None if it is."""
    doc = []
    for i, raw in enumerate(lines, 1):
        if raw.startswith(BOM):
            return (f"{name} line {i} starts with a UTF-8 byte order mark (BOM): bundle files have none; "
                    f"the file was re-saved or converted after export")
        if b"\r" in raw:
            return (f"{name} line {i} has a CR (CRLF line endings): bundle files end lines with LF only; "
                    f"the file was converted after export")
        if json_doc:
            doc.append(raw)
        elif json_lines and raw.strip():
            why = duplicate_key(raw, f"{name} line {i}")
            if why is not None:
                return why
    return duplicate_key(b"".join(doc), name) if json_doc else None


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_bundle(d):
    problems = []
    try:
        with open(os.path.join(d, "manifest.json"), "rb") as f:
            raw = f.read()
        why = form_problem(raw.splitlines(keepends=True), "manifest.json", json_doc=True)
        if why is not None:
            return {"ok": False, "labelled_broken": False, "problems": [why], "chain": None}
        manifest = json.loads(raw)
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            raise ValueError(f"format is not {FORMAT!r}")
    except (OSError, ValueError) as exc:
        return {"ok": False, "labelled_broken": False, "problems": [f"manifest.json is missing or unreadable: {exc}"], "chain": None}
    for name, lines in (("SHA256SUMS", False), ("records.ndjson", True)):
        try:
            with open(os.path.join(d, name), "rb") as f:
                why = form_problem(f, name, json_lines=lines)
        except OSError:
            continue  # missing: said below
        if why is not None:
            problems.append(why)
    listed = {}
    try:
        with open(os.path.join(d, "SHA256SUMS"), encoding="utf-8") as f:
            for line in f:
                want, _, name = line.rstrip("\n").partition("  ")
                listed[name.lstrip("*")] = want
    except OSError as exc:
        problems.append(f"SHA256SUMS is missing or unreadable: {exc}")
    for name in ("records.ndjson", "manifest.json"):
        if listed and name not in listed:
            problems.append(f"SHA256SUMS does not list {name}")
    for name, want in listed.items():
        try:
            if sha256_file(os.path.join(d, name)) != want:
                problems.append(f"{name} does not match its SHA-256 in SHA256SUMS (altered)")
        except OSError:
            problems.append(f"{name} is listed in SHA256SUMS but missing")
    records = os.path.join(d, "records.ndjson")
    if not os.path.exists(records):
        problems.append("records.ndjson is missing")
        return {"ok": False, "labelled_broken": False, "problems": problems, "chain": None}
    if sha256_file(records) != manifest.get("records_sha256"):
        problems.append("records.ndjson does not match records_sha256 in the manifest (altered)")
    with open(records, "rb") as f:
        data_end = f.read()[-1:]
    if data_end and data_end != b"\n":
        problems.append("records.ndjson does not end with a newline (truncated mid-record)")
    chain = verify_chain(records)
    if manifest.get("broken") is True:
        at = manifest.get("broken_at") or {}
        if chain["ok"]:
            problems.append("the manifest labels the chain broken, but it verifies")
        elif at.get("seq") != chain["first_bad_seq"]:
            problems.append(f"the manifest says the chain breaks at seq {at.get('seq')}, it breaks at seq {chain['first_bad_seq']}")
        return {"ok": False, "labelled_broken": True, "problems": problems, "chain": chain}
    if manifest.get("broken") is not False:
        problems.append("the manifest has no broken flag")
    if not chain["ok"]:
        problems.append(f"the chain does not verify: records.ndjson line {chain['line']} (seq {chain['first_bad_seq']}): {chain['reason']}")
    else:
        first, leaves = record_facts(records)
        claims = {"records": chain["records"], "first_seq": first, "last_seq": chain["last_seq"], "head": chain["head"]}
        for key, have in claims.items():
            if manifest.get(key) != have:
                problems.append(f"manifest {key} is {manifest.get(key)!r}, the records say {have!r}")
        if manifest.get("audit_root") != {"tree_size": len(leaves), "root": merkle_root(leaves)}:
            problems.append("manifest audit_root does not match the records' Merkle root")
    return {"ok": not problems, "labelled_broken": False, "problems": problems, "chain": chain}


def main(argv):
    args = [a for a in argv if a != "--json"]
    if len(args) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    out = verify_bundle(args[0])
    if "--json" in argv:
        print(json.dumps(out, indent=2))
    elif out["ok"]:
        c = out["chain"]
        print(f"OK: bundle intact; {c['records']} records, chain intact, head {c['head'][:16]}... (seq {c['last_seq']})")
    elif out["labelled_broken"] and not out["problems"]:
        c = out["chain"]
        print(f"LABELLED BROKEN: the bundle is intact, but the chain it preserves breaks at line {c['line']} (seq {c['first_bad_seq']}): {c['reason']}")
    else:
        for p in out["problems"]:
            print(f"FAILED: {p}")
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
