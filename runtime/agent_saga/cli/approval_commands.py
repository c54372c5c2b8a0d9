"""``agent-saga approvals list | approve ID | deny ID``: answer an agent from anywhere.

    agent-saga approvals list
      [PENDING] wire.send -- Action cannot be undone (rule irreversible, 42s old, id af83c011)
            amount: 80000
            to: acct_9
    agent-saga approvals show af83c011 --show-all        # every field, every character
    agent-saga approvals approve af83c011 --approver risk@corp --note "verified by phone"

What is shown is rendered from the request's canonical arguments, escaped (no terminal
control characters; bidi and zero-width characters shown as <U+XXXX>), after checking
they hash to the request's digest: a request that fails the check is shown as NOT
APPROVABLE and an approval of it is refused. A view that leaves fields out says so, and
approving such a request needs ``--show-all`` (a human approves only what they could see).

The store is ``--store``, else ``$AGENT_SAGA_APPROVAL_STORE``, else
``$AGENT_SAGA_REDIS_URL`` (the policy plane, as agents wired by it use), else the
``FileApprovalStore`` directory ``./agent-saga-approvals`` if it exists; every command
says which store it read and why, and with none configured it says how to name one
(never a silent read of an empty local folder). The decision lands in the store; the
waiting agent sees it there (no connection into the agent). An ID may be a unique prefix.

``--signing-key KEY.pem`` (or ``$AGENT_SAGA_APPROVAL_SIGNING_KEY``) signs the decision
with the approver's Ed25519 key (``agent-saga keygen approver --approver NAME --out
KEY.pem``): agents that trust approver keys accept an approval only when it is signed by
one of them, for an approver the key is bound to. When trusted keys are published (or
``$AGENT_SAGA_APPROVAL_KEYS`` names them), an approval the agents would ignore (unsigned,
an untrusted key, another approver's key) is refused here, and a request holding such an
ignored approval may be decided again. A credential in ``--note`` is replaced by
``[REDACTED]`` (and said so); one in ``--approver`` is refused.

Passkey approvals (an IRREVERSIBLE step whose agent has an approver keyring): the
request carries a challenge naming the exact action, and the approver's own enrolled key
signs it::

    agent-saga approvals keys enrol --keyring keyring.json --approver risk@corp --public-key risk.pem.pub --by soc@corp
    agent-saga approvals challenge af83c011 --out challenge.bin     # the 32 bytes a hardware key signs
    agent-saga approvals sign af83c011 --approver risk@corp --key risk.pem     # a software key
    agent-saga approvals sign af83c011 --approver risk@corp --key-id 3f2a9c... --signature sig.bin
    agent-saga approvals keys revoke 3f2a9c --keyring keyring.json --by soc@corp

Refused, with a message saying why: an approval without ``--approver`` (an anonymous
approval proves nothing), a break-glass approval without ``--note``, a request already
decided or past its deadline. Exit codes: 0 done, 1 refused, 2 bad usage or an
unreachable store.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
import time
from typing import Any

from ..clocks import format_instant
from ..controls.approvals import (
    ActionChallenge,
    ApprovalRefused,
    ApprovalRequest,
    ApprovalStore,
    ApproverKeyring,
    DecisionSigner,
    PasskeyAssertion,
    decide_request,
    open_approval_store,
    resolve_id,
    sign_challenge,
)
from ..controls.approvals._keyring import ENV_KEYRING
from ..controls.approvals._render import escape_text
from ..controls.approvals._signing import ENV_SIGNING_KEY, TrustedKeys, load_signing_key
from ..controls.approvals._store import unproven
from ..errors import ConfigurationError
from ..plane import ENV_REDIS_URL, choose_store
from ._clean import clean_name, clean_text

__all__ = ["register"]

ENV_APPROVAL_STORE = "AGENT_SAGA_APPROVAL_STORE"
DEFAULT_DIR = "agent-saga-approvals"


def _store(args: argparse.Namespace) -> tuple[ApprovalStore, str]:
    """The store to read, and the sentence saying which it is and why."""
    choice = choose_store(args.store, ENV_APPROVAL_STORE, local_default=DEFAULT_DIR)
    if choice.target is None:
        raise ConfigurationError(
            f"no approval store configured: pass --store redis://HOST:PORT/DB, or set {ENV_APPROVAL_STORE} or "
            f"{ENV_REDIS_URL} (the policy plane your agents use); a directory (FileApprovalStore) works for "
            f"agents on this host only. FileApprovalStore() writes ./{DEFAULT_DIR}, which does not exist here: "
            f"no agent run from this directory has asked for an approval yet (or pass --store DIR)")
    return open_approval_store(choice.target), f"store: {choice.describe()}"


def _age(seconds: float) -> str:
    seconds = max(0.0, seconds)
    for unit, size in (("d", 86_400), ("h", 3_600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit}"
    return f"{seconds:.0f}s"


def _action_lines(r: ApprovalRequest, show_all: bool) -> list[str]:
    """The action, rendered from the request's canonical arguments (escaped), or why it
    cannot be shown as approvable (its arguments do not hash to its digest)."""
    try:
        return r.action_view().lines(show_all=show_all, request_id=r.id)
    except ValueError as exc:
        return [f"NOT APPROVABLE: {exc}"]


def _line(r: ApprovalRequest, now: float, show_all: bool = False, ignored: str | None = None) -> list[str]:
    rule = escape_text(r.rule.split(":", 1)[1] if r.rule.startswith("rule:") else r.rule)
    state = r.state.upper()
    if r.state == "Pending" and now >= r.deadline:
        state = "EXPIRED (unanswered)"
    elif r.decided and r.approver:
        state += f" by {escape_text(r.approver)}"
    if ignored is not None:
        state = (f"PENDING: the approval by {escape_text(r.approver or '')} is ignored by the agents "
                 f"({escape_text(ignored)}); approve it signed")
    if r.break_glass:
        state += ", BREAK-GLASS"
    if r.consumed_at is not None:
        state += ", used"
    if r.challenge is not None:
        state += ", passkey required (approvals sign)"
    head = (f"[{state}] {escape_text(r.tool)} -- {escape_text(r.reason or 'approval required')} (rule {rule}, "
            f"{_age(now - r.requested_at)} old, id {escape_text(r.id[:8])})")
    out = [head]
    out += [f"      {line}" for line in _action_lines(r, show_all)]
    out.append(f"      saga {escape_text(r.saga_id)}, step {escape_text(r.step_id)}, deadline "
               f"{format_instant(r.deadline)}, id {escape_text(r.id)}")
    if r.note:
        out.append(f"      note: {escape_text(r.note)}")
    return out


def cmd_list(args: argparse.Namespace) -> int:
    store, which = _store(args)
    try:
        trusted = trusted_keys(store)
        # An approval the agents ignore leaves the pending set, yet the request still waits.
        requests = store.list(pending_only=not args.all and trusted is None)
    finally:
        store.close()
    now = time.time()
    ignored = {r.id: why for r in requests if (why := unproven(r, trusted)) is not None}
    if not args.all:
        requests = [r for r in requests if now < r.deadline and (not r.decided or r.id in ignored)]
    if args.json:
        print(which, file=sys.stderr)
        print(json.dumps([r.view_doc() for r in requests], indent=2))
        return 0
    print(which)
    if not requests:
        print("no approval requests waiting" if not args.all else f"no approval requests in {store.describe()}")
    for r in requests:
        for line in _line(r, now, ignored=ignored.get(r.id)):
            print("  " + line)
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    store, which = _store(args)
    try:
        r = store.get(resolve_id(store, args.request_id))
        trusted = trusted_keys(store) if r is not None else None
    except ApprovalRefused as exc:
        print(f"agent-saga approvals show: refused: {exc.message} ({which})", file=sys.stderr)
        return 1
    finally:
        store.close()
    if r is None:
        print(f"agent-saga approvals show: no approval request {escape_text(args.request_id)!r} ({which})",
              file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(r.view_doc(), indent=2))
        return 0
    print(which)
    for line in _line(r, time.time(), args.show_all, unproven(r, trusted)):
        print("  " + line)
    return 0


def trusted_keys(store: ApprovalStore) -> TrustedKeys | None:
    """The approver keys agents on ``store`` trust: ``$AGENT_SAGA_APPROVAL_KEYS`` and the
    keys published in the policy plane (``None``: none anywhere)."""
    keys = TrustedKeys.from_env()
    published = getattr(store, "published_keys", None)
    texts = published() if published is not None else {}
    if not texts:
        return keys
    merged = TrustedKeys(source=f"{store.describe()} published keys")
    if keys is not None:
        merged.update(keys)
    for kid, pem in texts.items():
        merged.add_pem(pem, where=f"the approver key {kid} published in {store.describe()}")
    return merged


def _decide(args: argparse.Namespace, approved: bool) -> int:
    if not (args.approver or "").strip():
        print(f"agent-saga approvals {'approve' if approved else 'deny'}: refused: --approver NAME is required "
              f"(an anonymous approval is an audit trail that proves nothing)", file=sys.stderr)
        return 2
    approver = clean_name("--approver", args.approver)
    note = clean_text("--note", args.note)
    key = args.signing_key or os.environ.get(ENV_SIGNING_KEY, "").strip() or None
    signer = DecisionSigner.from_file(key) if key else None
    store, which = _store(args)
    try:
        r = decide_request(store, args.request_id, approved=approved, approver=approver or "", now=time.time(),
                           note=note, break_glass=getattr(args, "break_glass", False), signer=signer,
                           show_all=getattr(args, "show_all", False), trusted=trusted_keys(store))
    except ApprovalRefused as exc:
        print(f"agent-saga approvals: refused: {exc.message} ({which})", file=sys.stderr)
        return 1
    finally:
        store.close()
    if args.json:
        print(json.dumps(r.view_doc()))
    else:
        glass = " (BREAK-GLASS: flagged for review)" if r.break_glass else ""
        signed = f", signed by key {signer.key_id}" if signer is not None else ", unsigned"
        print(f"{r.state.lower()} {r.id} ({escape_text(r.tool)}) by {escape_text(r.approver or '')}{glass}{signed}; "
              f"the waiting agent sees it on its next read of {store.describe()}")
        if approved:
            print("  the action approved:")
            for line in _action_lines(r, True):
                print("    " + line)
    return 0


def cmd_approve(args: argparse.Namespace) -> int:
    return _decide(args, True)


def cmd_deny(args: argparse.Namespace) -> int:
    return _decide(args, False)


# --------------------------------------------------------------------------- passkeys
def _challenge_of(store: ApprovalStore, request_id: str) -> tuple[ApprovalRequest, ActionChallenge]:
    r = store.get(resolve_id(store, request_id))
    if r is None:
        raise ApprovalRefused(f"approval request {request_id} disappeared from {store.describe()}")
    if r.challenge is None:
        raise ApprovalRefused(f"approval request {r.id} asks for no passkey (it carries no challenge): approve it "
                              f"with agent-saga approvals approve")
    return r, ActionChallenge.from_doc(r.challenge)


def cmd_challenge(args: argparse.Namespace) -> int:
    store, which = _store(args)
    try:
        r, challenge = _challenge_of(store, args.request_id)
    except ApprovalRefused as exc:
        print(f"agent-saga approvals challenge: refused: {exc.message} ({which})", file=sys.stderr)
        return 1
    finally:
        store.close()
    digest = challenge.digest
    if args.out:
        with open(args.out, "wb") as f:
            f.write(digest)
    if args.json:
        print(json.dumps({"requestId": r.id, "challenge": challenge.to_doc(), "digest": digest.hex(),
                          "digestBase64url": base64.urlsafe_b64encode(digest).rstrip(b"=").decode()}))
        return 0
    print(which)
    print(f"{r.tool} (saga {r.saga_id}, step {r.step_id}), arguments {r.arguments_digest}")
    print(f"  expires {challenge.to_doc()['expiresAt']}, nonce {challenge.nonce}")
    print(f"  digest (what the key signs): {digest.hex()}")
    print(f"  as a WebAuthn challenge (base64url): {base64.urlsafe_b64encode(digest).rstrip(b'=').decode()}")
    if args.out:
        print(f"  wrote the 32 digest bytes to {args.out}")
    return 0


def _assertion(args: argparse.Namespace, challenge: ActionChallenge) -> dict[str, Any]:
    if args.key:
        return sign_challenge(load_signing_key(args.key, "approver key", "--key"), challenge).to_doc()
    if args.assertion:
        with open(args.assertion, encoding="utf-8") as f:
            try:
                doc = json.load(f)
                PasskeyAssertion.from_doc(doc)
            except ValueError as exc:
                raise ConfigurationError(f"--assertion {args.assertion!r}: {exc}") from None
        return dict(doc)
    if not (args.signature and args.key_id):
        raise ConfigurationError("agent-saga approvals sign needs --key PEM (a software key), --assertion FILE (a "
                                 "WebAuthn assertion) or --signature FILE with --key-id KID (a hardware key's "
                                 "signature over `agent-saga approvals challenge --out`)")
    with open(args.signature, "rb") as f:
        raw = f.read()
    if len(raw) != 64:
        try:
            raw = base64.b64decode(raw.strip(), validate=True)
        except ValueError:
            raw = b""
    if len(raw) != 64:
        raise ConfigurationError(f"--signature {args.signature!r} is not a 64-byte Ed25519 signature (raw or base64)")
    return PasskeyAssertion(args.key_id, challenge.digest.hex(), raw).to_doc()


def cmd_sign(args: argparse.Namespace) -> int:
    if not (args.approver or "").strip():
        print("agent-saga approvals sign: refused: --approver NAME is required (the key approves only as the "
              "approver it is enrolled for)", file=sys.stderr)
        return 2
    approver = clean_name("--approver", args.approver) or ""
    note = clean_text("--note", args.note)
    store, which = _store(args)
    try:
        r = decide_request(store, args.request_id, approved=True, approver=approver, now=time.time(),
                           note=note, break_glass=args.break_glass, show_all=args.show_all,
                           passkey=lambda req: _assertion(args, ActionChallenge.from_doc(req.challenge)))
    except ApprovalRefused as exc:
        print(f"agent-saga approvals sign: refused: {exc.message} ({which})", file=sys.stderr)
        return 1
    finally:
        store.close()
    assert r.decision is not None and r.decision.passkey is not None
    kid = r.decision.passkey.get("keyId")
    if args.json:
        print(json.dumps(r.view_doc()))
    else:
        glass = " (BREAK-GLASS: flagged for review)" if r.break_glass else ""
        print(f"approved {r.id} ({r.tool}) by {r.approver}{glass} with passkey {kid}; the waiting agent checks the "
              f"signature against its approver keyring on its next read of {store.describe()}")
    return 0


def _keyring(args: argparse.Namespace) -> ApproverKeyring:
    path = args.keyring or os.environ.get(ENV_KEYRING, "").strip()
    if not path:
        raise ConfigurationError(f"name the approver keyring: --keyring FILE or ${ENV_KEYRING}")
    return ApproverKeyring(path)


def cmd_keys_enrol(args: argparse.Namespace) -> int:
    ring = _keyring(args)
    if args.public_key:
        with open(args.public_key, "rb") as f:
            material: bytes | str = f.read()
    elif args.raw:
        material = args.raw
    else:
        raise ConfigurationError("enrol needs --public-key FILE (PEM) or --raw BASE64 (a credential's 32-byte key)")
    entry = ring.enrol(material, approver=args.approver or "", by=args.by or "", now=time.time(),
                       label=args.label or "", rp_id=args.rp_id or "")
    if args.json:
        print(json.dumps(entry.to_doc()))
    else:
        print(f"enrolled key {entry.key_id} for {entry.approver} in {ring.path}")
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    ring = _keyring(args)
    keys = ring.keys()
    if args.json:
        print(json.dumps([k.to_doc() for k in keys], indent=2))
        return 0
    print(f"keyring: {ring.path}")
    if not keys:
        print("  no keys enrolled")
    for k in keys:
        state = "REVOKED " + format_instant(k.revoked_at) + f" by {k.revoked_by}" if k.revoked_at else "enrolled"
        label = f" ({k.label})" if k.label else ""
        print(f"  {k.key_id} {k.approver}{label}: {state}; enrolled {format_instant(k.enrolled_at)} by "
              f"{k.enrolled_by}")
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    ring = _keyring(args)
    entry = ring.revoke(args.key_id, by=args.by or "", now=time.time())
    print(json.dumps(entry.to_doc()) if args.json else
          f"revoked key {entry.key_id} of {entry.approver}; agents refuse it from their next check")
    return 0


def _register_passkeys(asub: Any, common: Any) -> None:
    q = asub.add_parser("challenge", help="print a passkey request's challenge (what the approver's key signs)")
    q.add_argument("request_id", metavar="ID", help="the request id (a unique prefix is enough)")
    q.add_argument("--out", default=None, metavar="FILE", help="also write the 32 digest bytes to FILE")
    common(q)
    q.set_defaults(handler=cmd_challenge)

    q = asub.add_parser("sign", help="approve a passkey request with the approver's enrolled key")
    q.add_argument("request_id", metavar="ID", help="the request id (a unique prefix is enough)")
    q.add_argument("--approver", default=None, help="who approves (required; the key must be enrolled for them)")
    q.add_argument("--note", default=None, help="why (lands in the WAL)")
    q.add_argument("--key", default=None, metavar="PEM", help="a software Ed25519 private key (keygen approver)")
    q.add_argument("--assertion", default=None, metavar="FILE",
                   help="a WebAuthn assertion JSON (format webauthn) made by your approval page")
    q.add_argument("--signature", default=None, metavar="FILE",
                   help="a raw or base64 Ed25519 signature over the challenge digest, made by a hardware key")
    q.add_argument("--key-id", default=None, help="the enrolled key id that made --signature")
    q.add_argument("--show-all", action="store_true",
                   help="you have seen the whole action (approvals show ID --show-all): needed when it has more "
                        "than the default view shows")
    q.add_argument("--break-glass", action="store_true",
                   help="emergency override: recorded as APPROVAL_BREAK_GLASS, flagged for review (needs --note); "
                        "the passkey is still required")
    common(q)
    q.set_defaults(handler=cmd_sign)

    k = asub.add_parser("keys", help="the approver keyring: enrol, list, revoke passkeys")
    ksub = k.add_subparsers(dest="keys_command", required=True, metavar="ACTION")

    def ring(q: argparse.ArgumentParser) -> None:
        q.add_argument("--keyring", default=None, metavar="FILE", help=f"the keyring file (default: ${ENV_KEYRING})")
        q.add_argument("--json", action="store_true")

    q = ksub.add_parser("enrol", help="enrol an approver's public key")
    q.add_argument("--approver", default=None, help="whose key it is (required): it approves only as them")
    q.add_argument("--public-key", default=None, metavar="FILE", help="the public key (PEM, e.g. KEY.pem.pub)")
    q.add_argument("--raw", default=None, metavar="BASE64",
                   help="the 32 raw public key bytes (a WebAuthn credential's COSE x), base64 or base64url")
    q.add_argument("--by", default=None, help="who enrols it (required)")
    q.add_argument("--label", default=None, help="what the key is (yubikey 5c, laptop passkey)")
    q.add_argument("--rp-id", default=None, help="the WebAuthn relying party id its assertions must name")
    ring(q)
    q.set_defaults(handler=cmd_keys_enrol)
    q = ksub.add_parser("list", help="every enrolled and revoked key")
    ring(q)
    q.set_defaults(handler=cmd_keys_list)
    q = ksub.add_parser("revoke", help="revoke a key (final)")
    q.add_argument("key_id", metavar="KEYID", help="the key id (a unique prefix is enough)")
    q.add_argument("--by", default=None, help="who revokes it (required)")
    ring(q)
    q.set_defaults(handler=cmd_keys_revoke)


def register(sub: Any) -> None:
    """Add ``approvals`` to the command line."""
    p = sub.add_parser("approvals", help="list the approval requests agents wait on; approve or deny one")
    asub = p.add_subparsers(dest="approvals_command", required=True, metavar="ACTION")

    def common(q: argparse.ArgumentParser) -> None:
        q.add_argument("--store", default=None,
                       help=f"redis://HOST:PORT/DB or a directory (default: ${ENV_APPROVAL_STORE}, else "
                            f"${ENV_REDIS_URL}, else ./{DEFAULT_DIR} if it exists)")
        q.add_argument("--json", action="store_true")

    q = asub.add_parser("list", help="requests waiting for a human (--all: every request)")
    q.add_argument("--all", action="store_true", help="also decided and expired requests")
    common(q)
    q.set_defaults(handler=cmd_list)

    q = asub.add_parser("show", help="one request and the action it asks to run")
    q.add_argument("request_id", metavar="ID", help="the request id (a unique prefix is enough)")
    q.add_argument("--show-all", action="store_true", help="every field, every character (never cut)")
    common(q)
    q.set_defaults(handler=cmd_show)

    for name, handler, verb in (("approve", cmd_approve, "approve"), ("deny", cmd_deny, "deny")):
        q = asub.add_parser(name, help=f"{verb} a request (a named --approver is required)")
        q.add_argument("request_id", metavar="ID", help="the request id (a unique prefix is enough)")
        q.add_argument("--approver", default=None, help="who decides (required): risk@corp")
        q.add_argument("--note", default=None, help="why (lands in the WAL)")
        q.add_argument("--signing-key", default=None, metavar="PEM",
                       help=f"sign the decision with this Ed25519 private key (default: ${ENV_SIGNING_KEY}); "
                            f"agents that trust approver keys ignore an unsigned approval")
        if name == "approve":
            q.add_argument("--break-glass", action="store_true",
                           help="emergency override: recorded as APPROVAL_BREAK_GLASS, flagged for review (needs --note)")
            q.add_argument("--show-all", action="store_true",
                           help="you have seen the whole action (approvals show ID --show-all): needed when it has "
                                "more than the default view shows; the approval prints it in full")
        common(q)
        q.set_defaults(handler=handler)
    _register_passkeys(asub, common)
