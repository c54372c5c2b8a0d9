"""Secrets the scrubber used to miss: a mapping KEY that is a credential
(``{"sk_live_...": 1}``, an MCP argument named like a key), and anything nested under a
credential's key (``{"password": {"new": "..."}}``: everything there is secret). Refused
at authoring time by the engine (``SecretDetected`` naming the path, the key shown as
``[REDACTED]``), and redacted at the record codec boundary whatever wrote the record
(thread and process sealers): the bytes of the log never hold them."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    SecretDetected,
    assert_no_secrets,
    saga_scope,
)
from agent_saga.chain import verify_records
from agent_saga.records import canonical_json
from agent_saga.scrubber import REDACTED, scrub_payload
from agent_saga.wal.file import iter_file_records

C = ActionSemantics.COMPENSABLE
KEY_AS_KEY = "sk_live_51HxYzAbCdEfGhIjKlMnOpQr"
GH_AS_KEY = "ghp_" + "aB3" * 12
RANDOM_KEY = "q8ZrT1wLm3Xv9KpB2nYc7Hd"
NESTED = ["hunter2-new-pass", "hunter1-old-pass", "tok-nested-value-1", "pin-in-a-list-77"]
SECRETS = [KEY_AS_KEY, GH_AS_KEY, RANDOM_KEY, *NESTED]


def planted() -> dict:
    return {
        "tool": "search_docs",
        "policy_args": {
            KEY_AS_KEY: 1,
            "query": "q",
            "password": {"new": NESTED[0], "old": NESTED[1], "hint_id": "h-1"},
            "tokens": [{"value": NESTED[2]}],
            "auth": {"method": "oauth", "user": "bob", "pins": [[NESTED[3]]]},
            "api_keys": {RANDOM_KEY: "prod"},
        },
        "detail": {"seen": {GH_AS_KEY: True}},
    }


@pytest.mark.parametrize("sealer", ["thread", "process"])
async def test_keys_and_nested_secrets_never_reach_the_disk(
    tmp_path: Path, sealer: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "w.wal"
    wal = FileWAL(path, sealer=sealer)
    with caplog.at_level(logging.WARNING, logger="agent_saga.secrets"):
        wal.append("STEP_INTENT", "s-1", "s-1/0", planted())  # a batch with a credential-format hint
        await wal.barrier()
        no_hint = {"policy_args": {"password": {"new": NESTED[0]}, "api_keys": {RANDOM_KEY: "prod"}}}
        assert KEY_AS_KEY not in canonical_json(no_hint)
        wal.append("GATE_VERDICT", "s-1", "s-1/0", no_hint)  # a batch without one (key-name walk)
        await wal.barrier()
    wal.close()
    text = path.read_text()
    for secret in SECRETS:
        assert secret not in text, secret
    recs = [r for _, r in iter_file_records(path)]
    assert verify_records((str(i), r) for i, r in enumerate(recs)).ok
    intent = recs[0].payload["policy_args"]
    assert intent[REDACTED] == 1 and intent["query"] == "q"
    assert intent["password"] == {"new": REDACTED, "old": REDACTED, "hint_id": "h-1"}  # a reference stays
    assert intent["tokens"] == [{"value": REDACTED}]
    assert intent["auth"] == {"method": "oauth", "user": "bob", "pins": [[REDACTED]]}
    assert intent["api_keys"] == {REDACTED: "prod"}
    assert recs[0].payload["detail"] == {"seen": {REDACTED: True}}
    assert recs[1].payload["policy_args"] == {"password": {"new": REDACTED}, "api_keys": {REDACTED: "prod"}}
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "(a key)" in warned and "['password']['new']" in warned
    for secret in SECRETS:
        assert secret not in warned


def test_several_secret_keys_in_one_mapping_keep_apart() -> None:
    out = scrub_payload({KEY_AS_KEY: 1, GH_AS_KEY: 2, REDACTED: 3}, "X", "s-1")
    assert out == {"[REDACTED-2]": 1, "[REDACTED-3]": 2, REDACTED: 3}
    assert not any(s in canonical_json(out) for s in SECRETS)


@pytest.mark.parametrize(
    ("args", "path"),
    [
        ({KEY_AS_KEY: 1}, "policy_args['[REDACTED]']"),
        ({"query": "q", "opts": {GH_AS_KEY: True}}, "policy_args['opts']['[REDACTED]']"),
        ({"password": {"new": NESTED[0]}}, "policy_args['password']['new']"),
        ({"tokens": [{"value": NESTED[2]}]}, "policy_args['tokens'][0]['value']"),
        ({"api_keys": {RANDOM_KEY: "prod"}}, "policy_args['api_keys']['[REDACTED]']"),
    ],
)
async def test_the_engine_refuses_them_as_policy_arguments_before_anything_is_written(
    tmp_path: Path, args: dict, path: str
) -> None:
    wal = FileWAL(tmp_path / "w.wal")
    ran: list[int] = []
    with pytest.raises(SecretDetected) as err:
        async with saga_scope(wal, name="pay") as saga:
            await saga.execute("search", ActionSemantics.REVERSIBLE, lambda: ran.append(1), policy_args=args)
    await wal.barrier()
    wal.close()
    assert ran == [] and err.value.key == path and path in err.value.message
    text = (tmp_path / "w.wal").read_text()
    for secret in SECRETS:
        assert secret not in err.value.message and secret not in text, secret
    assert "STEP_INTENT" not in text


async def test_the_engine_refuses_them_in_compensation_kwargs(tmp_path: Path) -> None:
    wal = FileWAL(tmp_path / "w.wal")
    with pytest.raises(SecretDetected) as err:
        async with saga_scope(wal, name="pay") as saga:
            await saga.execute("db.write", C, lambda: 1, lambda r: Compensation(
                fn=lambda **kw: None, handler="db.undo", kwargs={"row": r, "creds": {"user": "bob", "pw": NESTED[0]}}))
    await wal.barrier()
    wal.close()
    assert "['creds']['pw']" in err.value.message
    assert NESTED[0] not in (tmp_path / "w.wal").read_text()


def test_assert_no_secrets_names_the_path_and_never_the_key() -> None:
    with pytest.raises(SecretDetected) as err:
        assert_no_secrets({"meta": {KEY_AS_KEY: "x"}})
    assert err.value.key == "kwargs['meta']['[REDACTED]']" and KEY_AS_KEY not in err.value.message
    with pytest.raises(SecretDetected, match=r"kwargs\['password'\]\['new'\]"):
        assert_no_secrets({"password": {"new": "x"}})
    # References and metadata under a credential's key, and ordinary keys, stay allowed.
    assert_no_secrets({"credentials": {"credential_ref": "stripe_prod"}, "auth": {"method": "oauth"},
                       "max_tokens": 1000, "customer": {"cus_1234567890abcdef": 1}})
