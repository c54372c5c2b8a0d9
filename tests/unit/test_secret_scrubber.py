"""The secret scrubber: refused at authoring time, redacted at the record codec boundary.

Planted keys in every user-supplied string that enters a record (descriptions, tags, tool
names, reasons, notes, error text, nested values) never reach the bytes on disk; ids that
would carry one are refused; the detector stays precise (ordinary values are untouched).
"""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest
from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    SecretDetected,
    assert_no_secrets,
    saga_scope,
    verify_records,
)
from agent_saga.idempotency import idempotency_key
from agent_saga.payloads import describe_error
from agent_saga.records import canonical_json
from agent_saga.scrubber import REDACTED, looks_random, redact_text, scrub_id, scrub_payload
from agent_saga.wal.file import iter_file_records

C = ActionSemantics.COMPENSABLE

# Real-looking credentials of each well-known shape (none is a live key).
PLANTED = {
    "stripe": "sk_live_51HxYzAbCdEfGhIjKlMnOpQr",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_" + "aB3" * 12,
    "gitlab": "glpat-xR4nd0mT0k3nV4lu3abc",
    "slack": "xoxp-1234567890-abcdefghij",
    "google": "AIza" + "Sy9" * 11 + "Ab",
    "openai": "sk-proj-" + "Q9w" * 12,
    "npm": "npm_" + "Z8y" * 12,
    "sendgrid": "SG." + "a" * 22 + "." + "b" * 43,
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "bearer": "Bearer abcdefghijklmnopqrstuvwxyz0123",
    "basic": "Basic dXNlcjpodW50ZXIyaHVudGVyMg==",
    "pem": "-----BEGIN EC PRIVATE KEY-----\nMHcCAQEEIBkg\n-----END EC PRIVATE KEY-----",
}


def raw(path: Path) -> str:
    return path.read_text()


@pytest.mark.parametrize(
    "key", ["pwd", "pass", "userPass", "db-pwd", "credentials", "creds", "auth", "pin", "cvv",
            "cvc", "otp", "session_cookie", "card_number", "signing_key", "passphrase"],
)
def test_widened_credential_key_names_are_refused(key: str) -> None:
    with pytest.raises(SecretDetected) as info:
        assert_no_secrets({key: "hunter2"})
    assert info.value.key == f"kwargs[{key!r}]" and "hunter2" not in str(info.value)


@pytest.mark.parametrize("name", ["gitlab", "google", "openai", "npm", "sendgrid", "basic"])
def test_new_value_shapes_are_refused_anywhere(name: str) -> None:
    with pytest.raises(SecretDetected, match="looks like a secret"):
        assert_no_secrets({"notes": [f"use {PLANTED[name]} here"]})


def test_a_password_in_a_url_is_refused_and_redacted_keeping_the_rest() -> None:
    with pytest.raises(SecretDetected, match="password in a URL"):
        assert_no_secrets({"dsn": "postgres://app:s3cr3t-pw@db:5432/pay"})
    assert redact_text("postgres://app:s3cr3t-pw@db:5432/pay") == f"postgres://app:{REDACTED}@db:5432/pay"


def test_an_address_the_library_already_masked_is_not_a_secret_and_warns_nothing(caplog) -> None:
    masked = {"store": "RedisSwitchStore(redis://agent:***@redis.svc:6379/0)"}
    with caplog.at_level(logging.WARNING):
        assert scrub_payload(masked, "KILL_SWITCH_ENGAGED", "wal") is masked
    assert caplog.records == []
    assert_no_secrets(masked)
    assert redact_text("redis://agent:***x@redis.svc:6379/0") == f"redis://agent:{REDACTED}@redis.svc:6379/0"
    with pytest.raises(SecretDetected, match="password in a URL"):
        assert_no_secrets({"store": "redis://agent:****@redis.svc:6379/0"})


def test_random_key_material_under_a_weak_key_is_refused_an_ordinary_value_is_not() -> None:
    material = "q8ZrT1wX9pLm2NvB7cKd4HsYe"
    assert looks_random(material)
    with pytest.raises(SecretDetected, match="looks random"):
        assert_no_secrets({"key": material})
    with pytest.raises(SecretDetected):
        assert_no_secrets({"session": material})
    assert_no_secrets({"key": "customer-42", "session": "checkout", "scope_key": "tenant:acme"})


@pytest.mark.parametrize(
    "obj",
    [
        {"idempotency_key": idempotency_key("s", "s/0", "forward"), "key": idempotency_key("s", "s/1", "x")},
        {"key": str(uuid.uuid4()), "session": str(uuid.uuid4()).upper()},
        {"auth_method": "oauth", "password_hint": "the usual", "token_count": "4096",
         "pin_version": "3", "credential_ref": "stripe_prod", "auth_user": "alice"},
        {"at": "2026-11-30T10:00:00.123456+00:00", "charge": "ch_3MmlLrLkdIwHu7ix0snN0B15"},
        {"text": "the sk_ prefix, AKIA alone, a bearer of news and https://example.com/a:b are fine"},
        {"key": "OrderNumber", "sig": "v1"},
    ],
)
def test_the_detector_stays_precise(obj: dict[str, Any]) -> None:
    assert_no_secrets(obj)
    assert scrub_payload(obj, "X", "s-1") is obj  # nothing found: the same object back


def test_subclasses_of_dict_list_and_str_are_scrubbed_like_their_base() -> None:
    """The encoder writes an OrderedDict, a defaultdict or a str subclass as it writes a
    dict or a str, so the scrubber must walk them too (it used to return them unread)."""
    import collections
    import enum

    class Kind(enum.StrEnum):
        PLAIN = "plain"

    class Note(str):
        pass

    payload = {
        "args": collections.OrderedDict(password="hunter2-not-a-word"),
        "env": collections.defaultdict(list, {"db_password": ["x-y-z-secret"]}),
        "note": Note(f"key {PLANTED['stripe']}"),
        "kind": Kind.PLAIN,
    }
    out = scrub_payload(collections.OrderedDict(payload), "STEP_COMMITTED", "s-1")
    assert out is not None
    assert out["args"] == {"password": REDACTED}
    assert out["env"] == {"db_password": [REDACTED]}
    assert out["note"] == f"key {REDACTED}"
    assert out["kind"] is Kind.PLAIN  # nothing found: kept as it was
    clean = {"kind": Kind.PLAIN, "args": collections.OrderedDict(amount=4200)}
    assert scrub_payload(clean, "STEP_COMMITTED", "s-1") is clean


def test_scrub_payload_never_mutates_its_input() -> None:
    inner = {"description": f"refund with {PLANTED['stripe']}", "amount": 4200}
    payload = {"compensation": inner, "tags": ["vip", PLANTED["aws"]]}
    before = json.dumps(payload, sort_keys=True)
    out = scrub_payload(payload, "STEP_COMMITTED", "s-1")
    assert json.dumps(payload, sort_keys=True) == before
    assert out is not None and out["compensation"]["amount"] == 4200
    assert out["compensation"]["description"] == f"refund with {REDACTED}"
    assert out["tags"] == ["vip", REDACTED]


def test_free_text_phrases_are_redacted_in_error_text() -> None:
    exc = RuntimeError("login failed: password=hunter2 api_key: 'abc123' for postgres://u:pw9@h/db")
    message = describe_error(exc)["message"]
    for leaked in ("hunter2", "abc123", "pw9"):
        assert leaked not in message
    assert message.count(REDACTED) == 3 and "postgres://u:" in message


def test_a_secret_shaped_id_is_refused_at_authoring_time(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w.wal")
    try:
        for kw in ({"saga_id": PLANTED["stripe"]}, {"name": PLANTED["aws"]}):
            with pytest.raises(SecretDetected, match="ids are written in every record header") as info:
                saga_scope(wal, **kw)
            assert PLANTED["stripe"] not in str(info.value) and PLANTED["aws"] not in str(info.value)
    finally:
        wal.close()


async def test_a_header_id_that_slipped_past_authoring_is_redacted_consistently(tmp_path: Path) -> None:
    path = tmp_path / "w.wal"
    wal = FileWAL(path)
    sid = PLANTED["stripe"]
    wal.append("SAGA_STARTED", sid, None, {})
    wal.append("STEP_INTENT", sid, f"{sid}/0", {})
    await wal.barrier()
    wal.close()
    text = raw(path)
    assert sid not in text
    recs = [r for _, r in iter_file_records(path)]
    assert recs[0].saga == recs[1].saga == scrub_id(sid) and recs[0].saga.startswith("redacted-")
    assert recs[1].step == f"{scrub_id(sid)}/0"
    assert verify_records(iter_file_records(path)).ok


async def test_planted_keys_in_every_free_field_never_reach_the_disk(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "w.wal"
    wal = FileWAL(path)
    secrets = list(PLANTED.values())

    def charge() -> dict[str, str]:
        return {"id": "ch_1"}

    def boom() -> None:
        raise RuntimeError(f"upstream said: invalid key {PLANTED['openai']} (password=hunter2)")

    with caplog.at_level(logging.WARNING, logger="agent_saga.secrets"), pytest.raises(RuntimeError):
        async with saga_scope(wal, name="pay", tags=["vip", PLANTED["github"], PLANTED["jwt"]]) as saga:
            await saga.execute(
                "stripe.charge", C, charge,
                lambda r: Compensation(
                    fn=lambda charge: None, handler="stripe.refund", kwargs={"charge": r["id"]},
                    description=f"refund {r['id']} with {PLANTED['stripe']} / {PLANTED['pem']}",
                ),
            )
            await saga.execute(f"tool-{PLANTED['aws']}", C, charge, lambda r: Compensation(fn=lambda: None))
            await saga.execute("crm.update", C, boom, lambda r: Compensation(fn=lambda: None))
    wal.append("KILL_SWITCH_ENGAGED", "switch", None, {
        "reason": f"leaked {PLANTED['slack']}", "note": f"rotate {PLANTED['sendgrid']}",
        "by": "ops", "details": {"token": "plain-but-under-a-token-key", "auth": PLANTED["basic"]},
    })
    await wal.barrier()
    wal.close()
    text = raw(path)
    for secret in [*secrets, "hunter2", "plain-but-under-a-token-key"]:
        assert secret not in text and json.dumps(secret)[1:-1] not in text, secret
    assert text.count(REDACTED) >= 9
    assert verify_records(iter_file_records(path)).ok
    # The operator is told where, never what.
    warned = [r.getMessage() for r in caplog.records if "was redacted" in r.getMessage()]
    assert warned and any("['tags']" in m for m in warned) and any("['description']" in m for m in warned)
    assert not any(s in m for m in warned for s in secrets)
    # What is not a secret is untouched: the charge id a recovery daemon refunds.
    commits = [r for _, r in iter_file_records(path) if r.type == "STEP_COMMITTED"]
    assert commits[0].payload["compensation"]["kwargs"] == {"charge": "ch_1"}


def test_a_planted_key_in_another_process_never_reaches_the_log(tmp_path: Path) -> None:
    path = tmp_path / "agent.wal"
    script = textwrap.dedent(f"""
        import asyncio
        from agent_saga import ActionSemantics, Compensation, FileWAL, saga_scope

        async def main():
            wal = FileWAL({str(path)!r})
            async with saga_scope(wal, name="onboard", tags=[{PLANTED['stripe']!r}]) as saga:
                await saga.execute("db.write", ActionSemantics.COMPENSABLE, lambda: 1,
                                   lambda r: Compensation(handler="db.undo", kwargs={{"row": r}},
                                                          description={PLANTED['aws']!r}))
            wal.close()

        asyncio.run(main())
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    text = raw(path)
    assert PLANTED["stripe"] not in text and PLANTED["aws"] not in text
    assert "SAGA_COMPLETED" in text and '"row":1' in text
    assert "was redacted from a SAGA_STARTED record" in proc.stderr
    assert PLANTED["stripe"] not in proc.stderr


async def test_an_encrypted_wal_scrubs_before_it_encrypts(tmp_path: Path) -> None:
    from agent_saga.audit import AESGCMEncryptor, EncryptedWAL, Keyring, decrypting, new_wal_key

    key = new_wal_key()
    enc = AESGCMEncryptor(Keyring.parse(key))
    path = tmp_path / "e.wal"
    wal = EncryptedWAL(FileWAL(path), enc)
    wal.append("STEP_COMMITTED", "s-1", "s-1/0", {"compensation": {"description": PLANTED["stripe"]}})
    await wal.barrier()
    wal.close()
    (rec,) = [r for r in decrypting((r for _, r in iter_file_records(path)), enc)]
    assert rec.payload == {"compensation": {"description": REDACTED}}


async def test_the_scrubber_runs_on_the_flusher_not_on_the_callers_objects(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w.wal")
    payload = {"note": PLANTED["stripe"]}
    wal.append("X", "s-1", None, payload)
    await wal.barrier()
    wal.close()
    assert payload == {"note": PLANTED["stripe"]}  # the caller's dict is theirs
    await asyncio.sleep(0)


@pytest.mark.parametrize("length", [8, 40, 511, 512, 513, 5000], ids=lambda n: f"len{n}")
@pytest.mark.parametrize("fill", ["x", "KIGRJ-/ghk_ "], ids=["plain", "every-gate"])
def test_the_hint_scan_agrees_with_testing_every_hint(length, fill):
    """``_hinted`` (the hints grouped under gates, each gate tested first) says True
    exactly when some hint occurs, wherever it sits: also in a text that holds every
    gate and no hint, so that every group's own hints are tested."""
    from agent_saga import scrubber

    filler = (fill * length)[:length]
    assert not any(h in filler for h in scrubber._HINTS)
    assert scrubber._hinted(filler) is False
    for hint in scrubber._HINTS:
        for text in (hint + filler, filler[: length // 2] + hint + filler[length // 2 :], filler + hint):
            assert scrubber._hinted(text) is (len(text) >= scrubber._MIN_SHAPE), (hint, len(text))


def test_every_hint_sits_under_a_gate_it_contains():
    """The gate of a group is a substring of each of its hints, and every hint is in
    exactly one group: a text without the gate cannot hold the hint."""
    from agent_saga import scrubber

    members = [h for _, group in scrubber._HINT_GROUPS for h in group]
    assert sorted(members) == sorted(scrubber._HINTS)
    for gate, group in scrubber._HINT_GROUPS:
        assert all(gate in h for h in group), gate


def _one_by_one(obj: Any, key: object, free: bool, inside: bool = False) -> Any:
    """The key-name walk the long way: every string (by the value the scrubber reads) put
    through ``_scrub_str`` under its governing key, no shortcut taken; inside a value whose
    key names a credential, every string is redacted unless a nearer key names a reference."""
    from agent_saga import scrubber

    if isinstance(obj, str):
        if obj and inside:
            return REDACTED
        return scrubber._scrub_str(key, str(obj), free, False) if obj else obj
    if isinstance(obj, dict):
        secret = inside or (isinstance(key, str) and scrubber.key_looks_sensitive(key))
        return {k: _one_by_one(v, k, free or k in scrubber.FREE_TEXT_KEYS,
                               secret and not (isinstance(k, str) and scrubber.key_is_reference(k)))
                for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_one_by_one(v, key, free, inside) for v in obj]
    return obj


def test_the_key_name_walk_agrees_with_checking_every_string():
    """Without a credential-format hint in the text, ``scrub_payload`` walks the payload by
    key name (``_walk_keys``, an action per key remembered across payloads). Every kind of
    key (ordinary, reference, weak, strong, free text, not a str, a str subclass) over
    every kind of value, alone and nested, gives what checking each string gives."""
    import enum

    from agent_saga import scrubber

    class Key(enum.StrEnum):
        PASSWORD = "password"
        SESSION = "session"
        NOTE = "note"
        TOOL = "tool"

    class Text(str):
        pass

    keys: list[Any] = ["tool", "credential_ref", "idempotency_key", "sig", "password", "apiKey",
                       "description", "tags", 7, None, Key.PASSWORD, Key.SESSION, Key.NOTE, Key.TOOL]
    values: list[Any] = ["", "stripe.charge", "q8ZrT1wLm3Xv9KpB2nYc7Hd", "ab" * 32, "password=hunter2 ok",
                         "db: x=1", Text("q8ZrT1wLm3Xv9KpB2nYc7Hd"), 42, 1.5, True, None, [], ("a", "b")]
    containers = [lambda v: v, lambda v: [v, "plain"], lambda v: {"inner": v}, lambda v: {"tool": {"x": [v]}}]
    checked = 0
    for free_key in ("note", "detail_id"):  # under free text, and under an ordinary key
        for k in keys:
            for v in values:
                for wrap in containers:
                    payload = {free_key: {k: wrap(v)}, "n": 1}
                    want = _one_by_one(payload, None, False)
                    for _ in range(2):  # the first look-up of a key, then its remembered action
                        got = scrub_payload(payload, "X", "s-1", canonical_json(payload), hinted=False)
                        assert canonical_json(got) == canonical_json(want), (free_key, k, v)
                        assert (got is payload) is (canonical_json(want) == canonical_json(payload))
                    checked += 1
    assert checked == 2 * len(keys) * len(values) * len(containers)
    scrubber._ACTIONS.clear()  # a full table starts again: same answers
    assert scrub_payload({Key.PASSWORD: "x"}, "X", "s-1", hinted=False) == {"password": REDACTED}


def test_a_credential_key_that_is_a_str_subclass_is_redacted_without_a_hint():
    """A ``StrEnum`` key is written as its value: ``{Field.PASSWORD: "..."}`` is a password
    on disk, so it is redacted whether or not the batch's text holds a hint."""
    import enum

    class Field(enum.StrEnum):
        PASSWORD = "password"
        TOKENS = "tokens"

    payload = {Field.PASSWORD: "hunter2-not-a-word", Field.TOKENS: ["abc-def"]}
    for hinted in (False, None):
        out = scrub_payload(payload, "X", "s-1", canonical_json(payload), hinted=hinted)
        assert out == {"password": REDACTED, "tokens": [REDACTED]}
