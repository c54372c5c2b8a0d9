"""The audit subcommands: export, verify-bundle, certify, redact, audit-root, prove,
verify-proof, checkpoint, verify-checkpoint, keygen.

Exit codes as everywhere: 0 the check passed, 1 it failed (a broken chain, an uncertified
log, an invalid proof, a forged checkpoint; ``export --allow-broken`` of a broken chain
writes the labelled bundle and still exits 1), 2 bad usage or unreadable input (a missing
key included). Payload-reading commands (certify) take the key as every command does
(``--wal-key-file``, ``AGENT_SAGA_WAL_KEY_FILE`` or ``AGENT_SAGA_WAL_KEY``: ``cli.keys``);
the others never need it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

from ..audit import bundles as _export
from ..audit import certificates as _certify
from ..audit import checkpoints as _cp
from ..audit import encryption as _enc
from ..audit import merkle as _merkle
from ..audit import redaction as _redact
from ..chain import verify_records
from ..errors import ConfigurationError, WALCorrupt, WALError
from ..records import Record
from ..wal.readers import FileLogReader, LogReader, open_reader
from .keys import add_key_option, encryptor_from_args

_HEX64 = re.compile(r"^[0-9a-fA-F]{64}$")


def _source(p: Any, what: str, *, url: bool = True) -> None:
    if not url:
        p.add_argument("--wal-path", required=True, help=f"the FileWAL log {what}")
        return
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--wal-path", help=f"the FileWAL log {what}")
    g.add_argument("--wal-url", help=f"the log {what}, by URL (see `agent-saga verify --help`); "
                   "one writer's chain: add &writer=NAME to a fleet URL")


def _open(args: argparse.Namespace) -> LogReader:
    if getattr(args, "wal_url", None):
        return open_reader(args.wal_url)
    return FileLogReader(args.wal_path)


def _one_chain(reader: LogReader) -> str:
    chains = reader.chains()
    if len(chains) != 1:
        raise ConfigurationError(
            f"{reader.description} holds {len(chains)} writer chains; this command works on one: "
            f"add &writer=NAME to the URL"
        )
    return chains[0]


def _verified(reader: LogReader, name: str) -> list[Record]:
    """The records of one chain, or ``WALError`` if it does not verify."""
    recs: list[Record] = []

    def watch(items: Iterator[tuple[str, Record | WALCorrupt]]) -> Iterator[tuple[str, Record | WALCorrupt]]:
        for loc, item in items:
            if isinstance(item, Record):
                recs.append(item)
            yield loc, item

    result = verify_records(watch(reader.chain(name)))
    if not result.ok:
        raise _Broken(f"the chain does not verify, refusing: {result.describe()}")
    return recs


class _Broken(WALError):
    """A check this command depends on failed (exit 1, not a usage error)."""


def _emit(obj: Any, out: str | None) -> None:
    text = json.dumps(obj, indent=2, sort_keys=True) + "\n"
    if out:
        try:
            with open(out, "x", encoding="utf-8") as f:
                f.write(text)
        except FileExistsError:
            raise ConfigurationError(f"{out!r} exists; write to a new file (nothing was overwritten)") from None
    else:
        sys.stdout.write(text)


def _load_json(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        raise ConfigurationError(f"{what} file {path!r} does not exist") from None
    except ValueError as exc:
        raise ConfigurationError(f"{what} file {path!r} is not JSON: {exc}") from None


def register(sub: Any) -> None:
    """Add the audit commands (export, certify, redact, prove, checkpoint...)."""
    p = sub.add_parser("export", help="write a WORM audit bundle (records, manifest, SHA256SUMS)")
    _source(p, "to export", url=False)
    p.add_argument("--out", required=True, help="the bundle directory (must not exist, or be empty)")
    p.add_argument("--allow-broken", action="store_true",
                   help="export a chain that does not verify, labelled broken (exit 1 all the same)")
    p.add_argument("--json", action="store_true", help="print the manifest")
    p.set_defaults(handler=cmd_export)

    p = sub.add_parser("verify-bundle", help="re-check an exported bundle: checksums, chain, manifest")
    p.add_argument("bundle", help="the bundle directory")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_verify_bundle)

    p = sub.add_parser("certify", help="prove every committed effect was compensated or is terminal")
    _source(p, "to certify")
    p.add_argument("--strict", action="store_true",
                   help="also fail on escalated and not-undoable effects (only intended effects pass)")
    p.add_argument("--json", action="store_true")
    add_key_option(p)
    p.set_defaults(handler=cmd_certify)

    p = sub.add_parser("redact", help="erase records' payloads (GDPR); the chain still verifies")
    _source(p, "to rewrite (its writer must be stopped)", url=False)
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--seq", type=int, action="append", help="a record to redact (repeatable)")
    g.add_argument("--saga", help="redact every record of this saga")
    p.add_argument("--reason", help="a ticket reference recorded in the REDACTION note (no personal data)")
    p.add_argument("--no-note", action="store_true", help="do not append a REDACTION note record")
    p.set_defaults(handler=cmd_redact)

    p = sub.add_parser("audit-root", help="the Merkle root over the log, to publish")
    _source(p, "to root")
    p.add_argument("--json", action="store_true")
    p.add_argument("--out", help="write the root as JSON to this new file")
    p.set_defaults(handler=cmd_audit_root)

    p = sub.add_parser("prove", help="a disclosure proof for one saga, or a consistency proof")
    _source(p, "to prove from")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--saga", help="disclose this saga's records, and nothing else")
    g.add_argument("--from-size", type=int, metavar="N",
                   help="prove the log extends its first N records (the tree_size of an older root)")
    p.add_argument("--out", help="write the proof to this new file (default: stdout)")
    p.set_defaults(handler=cmd_prove)

    p = sub.add_parser("verify-proof", help="check a disclosure or consistency proof against roots")
    p.add_argument("proof", help="the proof file (from `agent-saga prove`)")
    p.add_argument("--root", required=True,
                   help="the published root: 64 hex, or a JSON file from audit-root, a bundle "
                   "manifest, or a checkpoint (with --pubkey)")
    p.add_argument("--old-root", help="for a consistency proof: the older root (same forms)")
    p.add_argument("--pubkey", help="the public key a checkpoint given as a root must verify under")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_verify_proof)

    p = sub.add_parser("checkpoint", help="sign the current head (Ed25519) so truncation is detectable")
    _source(p, "to checkpoint")
    p.add_argument("--key", required=True, help="the Ed25519 private key (PEM; `agent-saga keygen checkpoint`)")
    p.add_argument("--out", required=True, help="the checkpoint file to write (new)")
    p.add_argument("--log-id", help="a name for the log (default: the file name or writer)")
    p.set_defaults(handler=cmd_checkpoint)

    p = sub.add_parser("verify-checkpoint", help="check the log still extends a signed checkpoint")
    _source(p, "to check")
    p.add_argument("--checkpoint", required=True, help="the checkpoint file")
    p.add_argument("--pubkey", required=True, help="the signer's public key (PEM)")
    p.add_argument("--strict", action="store_true",
                   help="accepted for older scripts: every record the checkpoint signed is always checked")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=cmd_verify_checkpoint)

    p = sub.add_parser("keygen", help="make a checkpoint or approver signing key, or a WAL encryption key")
    p.add_argument("kind", choices=["checkpoint", "approver", "wal"],
                   help="checkpoint: an Ed25519 key pair to sign log checkpoints; approver: an Ed25519 key pair to "
                   "sign CLI approval decisions; wal: a WAL encryption key")
    p.add_argument("--out", help="checkpoint, approver: the private key file to create (KEY and KEY.pub)")
    p.add_argument("--kid", help="wal: the key id (default: a fingerprint)")
    p.add_argument("--approver", action="append", default=None, metavar="NAME",
                   help="approver: the name the key approves as (repeat for more); written into KEY.pub, which "
                        "agents then trust for these names only")
    p.set_defaults(handler=cmd_keygen)


# ---------------------------------------------------------------------- handlers


def _checked(fn: Any) -> Any:
    """Run a handler; a failed dependent check is exit 1, not a usage error."""
    def run(args: argparse.Namespace) -> int:
        try:
            code: int = fn(args)
        except _Broken as exc:
            print(f"agent-saga {args.command}: {exc.message}", file=sys.stderr)
            return 1
        return code
    return run


@_checked
def cmd_export(args: argparse.Namespace) -> int:
    """``agent-saga export``: write an evidence bundle."""
    try:
        manifest = _export.export_bundle(args.wal_path, args.out, allow_broken=args.allow_broken)
    except WALError as exc:
        raise _Broken(exc.message) from exc
    if args.json:
        _emit(manifest, None)
    elif manifest["broken"]:
        at = manifest["broken_at"]
        print(f"exported a BROKEN chain to {args.out} (labelled broken): {at['location']} "
              f"(seq {at['seq']}): {at['reason']}")
    else:
        print(f"exported {manifest['records']} records to {args.out}: chain intact, head "
              f"{manifest['head'][:16]}… (seq {manifest['last_seq']}); re-check with "
              f"`cd {args.out} && sha256sum -c SHA256SUMS`")
    return 1 if manifest["broken"] else 0


def cmd_verify_bundle(args: argparse.Namespace) -> int:
    """``agent-saga verify-bundle``: check a bundle offline."""
    result = _export.verify_bundle(args.bundle)
    if args.json:
        c = result.chain
        _emit({"ok": result.ok, "labelled_broken": result.labelled_broken,
               "problems": list(result.problems),
               "chain": None if c is None else {"ok": c.ok, "records": c.records, "head": c.head,
                                                "last_seq": c.last_seq, "first_bad_seq": c.first_bad_seq,
                                                "reason": c.reason}}, None)
    else:
        print(result.describe())
    return 0 if result.ok else 1


def cmd_certify(args: argparse.Namespace) -> int:
    """``agent-saga certify``: is every effect accounted for?"""
    encryptor = encryptor_from_args(args)
    reader = _open(args)
    try:
        cert = _certify.certify_log(reader, strict=args.strict, encryptor=encryptor)
    finally:
        reader.close()
    if args.json:
        _emit(cert.to_dict(), None)
    else:
        print(cert.describe())
    return 0 if cert.ok else 1


def cmd_redact(args: argparse.Namespace) -> int:
    """``agent-saga redact``: the log with payloads removed, chain intact."""
    seqs = args.seq or _redact.saga_seqs(args.wal_path, args.saga)
    if not seqs:
        raise ConfigurationError(f"saga {args.saga!r} has no record in {args.wal_path!r}")
    report = _redact.redact_records(args.wal_path, seqs, reason=args.reason, note=not args.no_note)
    print(report.describe())
    return 0


@_checked
def cmd_audit_root(args: argparse.Namespace) -> int:
    """``agent-saga audit-root``: the Merkle root of the log."""
    reader = _open(args)
    try:
        recs = _verified(reader, _one_chain(reader))
    finally:
        reader.close()
    root = _merkle.audit_root(recs)
    if args.out:
        _emit(root.to_dict(), args.out)
    if args.json:
        _emit(root.to_dict(), None)
    elif not args.out:
        print(f"{root.root}  tree_size {root.size}  (last seq {root.last_seq})")
    return 0


@_checked
def cmd_prove(args: argparse.Namespace) -> int:
    """``agent-saga prove``: a disclosure proof for chosen records."""
    reader = _open(args)
    try:
        recs = _verified(reader, _one_chain(reader))
    finally:
        reader.close()
    if args.saga is not None:
        proof = _merkle.build_disclosure(recs, saga_id=args.saga)
    else:
        proof = _merkle.build_consistency(recs, args.from_size)
    _emit(proof, args.out)
    return 0


def _root_arg(value: str, pubkey: str | None) -> _merkle.AuditRoot:
    if _HEX64.match(value):
        return _merkle.AuditRoot(-1, value.lower())
    d = _load_json(value, "root")
    if isinstance(d, dict) and d.get("format") == _cp.CHECKPOINT_FORMAT:
        if pubkey is None:
            raise ConfigurationError(f"{value!r} is a checkpoint: pass --pubkey so its signature is checked")
        cp = _cp.Checkpoint.from_dict(d)
        why = _cp.signature_problem(cp, _cp.load_public_key(pubkey))
        if why is not None:
            raise _Broken(f"checkpoint {value!r}: {why}; refusing its root")
        return _merkle.AuditRoot(cp.tree_size, cp.root, cp.seq, cp.head)
    if isinstance(d, dict) and d.get("format") == _export.BUNDLE_FORMAT:
        if d.get("audit_root") is None:
            raise _Broken(f"bundle manifest {value!r} has no audit root (the bundle is labelled broken)")
        return _merkle.AuditRoot.from_dict(d["audit_root"])
    return _merkle.AuditRoot.from_dict(d)


def _unsized(root: _merkle.AuditRoot) -> _merkle.AuditRoot | str:
    return root.root if root.size < 0 else root


@_checked
def cmd_verify_proof(args: argparse.Namespace) -> int:
    """``agent-saga verify-proof``: check a disclosure proof."""
    proof = _load_json(args.proof, "proof")
    fmt = proof.get("format") if isinstance(proof, dict) else None
    root = _root_arg(args.root, args.pubkey)
    result: _merkle.DisclosureResult | _merkle.ConsistencyResult
    if fmt == _merkle.CONSISTENCY_FORMAT:
        if args.old_root is None:
            raise ConfigurationError("a consistency proof needs --old-root (the earlier root) and --root (the later)")
        old = _root_arg(args.old_root, args.pubkey)
        result = _merkle.verify_consistency(proof, _unsized(old), _unsized(root))
    elif fmt == _merkle.DISCLOSURE_FORMAT:
        result = _merkle.verify_disclosure(proof, _unsized(root))
    else:
        raise ConfigurationError(f"{args.proof!r} is not a proof made by `agent-saga prove`")
    if args.json:
        _emit({"ok": result.ok, "kind": fmt, "reason": result.reason}, None)
    else:
        print(result.describe())
    return 0 if result.ok else 1


@_checked
def cmd_checkpoint(args: argparse.Namespace) -> int:
    """``agent-saga checkpoint``: a signed checkpoint of the log."""
    key = _cp.load_private_key(args.key)
    reader = _open(args)
    try:
        name = _one_chain(reader)
        log_id = args.log_id or os.path.basename(name)
        try:
            cp = _cp.make_checkpoint(reader.chain(name), key, log_id=log_id)
        except WALError as exc:
            raise _Broken(exc.message) from exc
    finally:
        reader.close()
    _emit(cp.to_dict(), args.out)
    print(f"checkpoint of {log_id}: seq {cp.seq}, head {cp.head[:16]}…, {cp.records} records, "
          f"signed by {cp.key_id} -> {args.out}")
    return 0


def cmd_verify_checkpoint(args: argparse.Namespace) -> int:
    """``agent-saga verify-checkpoint``: check a checkpoint against a log."""
    cp = _cp.Checkpoint.from_dict(_load_json(args.checkpoint, "checkpoint"))
    pk = _cp.load_public_key(args.pubkey)
    reader = _open(args)
    try:
        result = _cp.verify_checkpoint(cp, pk, reader.chain(_one_chain(reader)), strict=args.strict)
    finally:
        reader.close()
    if args.json:
        _emit({"ok": result.ok, "reason": result.reason, "seq": cp.seq, "head": cp.head,
               "head_status": result.head_status, "appended": result.appended,
               "key_id": cp.key_id}, None)
    else:
        print(result.describe())
    return 0 if result.ok else 1


def cmd_keygen(args: argparse.Namespace) -> int:
    """``agent-saga keygen``: a new encryption or signing key."""
    if args.kind in ("checkpoint", "approver"):
        if not args.out:
            raise ConfigurationError(f"keygen {args.kind} needs --out KEYFILE (KEYFILE.pub is written beside it)")
        names: tuple[str, ...] = ()
        if args.approver:
            if args.kind != "approver":
                raise ConfigurationError("--approver is for keygen approver")
            from ..controls.approvals._signing import check_names

            names = check_names(args.approver, "--approver")
        priv, pub = _cp.generate_signing_key(args.out)
        if names:
            from ..controls.approvals._signing import approver_header

            with open(pub, "r+", encoding="ascii") as f:
                pem = f.read()
                f.seek(0)
                f.write(approver_header(names) + pem)
        where = ("publish it" if args.kind == "checkpoint" else
                 f"add it to the agents' trusted approver keys: it approves as {', '.join(names)}" if names else
                 "enrol it in a passkey keyring with `approvals keys enrol --approver NAME`; to trust it for signed "
                 "decisions, make it with --approver NAME")
        print(f"private key {priv} (keep it secret, mode 0600); public key {pub} ({where})")
        return 0
    print(_enc.new_wal_key(args.kid))
    return 0
