"""Credentials: references resolved at use time; secrets refused at authoring time."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from agent_saga.credentials import (
    assert_no_secrets,
    redact_secrets,
    resolve_credential,
    set_credential_resolver,
)
from agent_saga.errors import ConfigurationError, SecretDetected
from agent_saga.idempotency import idempotency_key


@pytest.fixture(autouse=True)
def no_resolver():
    prev = set_credential_resolver(None)
    yield
    set_credential_resolver(prev)


def test_resolve_credential_uses_the_installed_resolver():
    with pytest.raises(ConfigurationError, match="set_credential_resolver"):
        resolve_credential("stripe_prod")
    vault = {"stripe_prod": "sk_live_from_vault"}
    set_credential_resolver(vault.get)
    assert resolve_credential("stripe_prod") == "sk_live_from_vault"
    with pytest.raises(ConfigurationError, match="returned nothing"):
        resolve_credential("missing")
    with pytest.raises(ConfigurationError, match="not valid"):
        resolve_credential("sk live with spaces")
    with pytest.raises(ConfigurationError):
        set_credential_resolver("not callable")  # type: ignore[arg-type]


SECRETS = {
    "stripe": "sk_live_51HxYzAbCdEfGhIjKlMn",
    "stripe-test": "sk_test_4eC39HqLyjWDarjtT1zdp7dc",
    "stripe-restricted": "rk_live_abcdefghijklmnop",
    "aws": "AKIAIOSFODNN7EXAMPLE",
    "github": "ghp_" + "a" * 36,
    "github-pat": "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",
    "slack": "xoxb-1234567890-abcdefghij",
    "pem": "-----BEGIN RSA PRIVATE KEY-----\nMIIE...",
    "pem-plain": "-----BEGIN PRIVATE KEY-----\nMIIE...",
    "bearer": "Bearer abcdefghijklmnopqrstuvwxyz0123",
    "jwt": "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
}


@pytest.mark.parametrize("value", SECRETS.values(), ids=SECRETS.keys())
def test_well_known_secret_formats_are_detected_anywhere(value):
    with pytest.raises(SecretDetected) as info:
        assert_no_secrets({"charge": "ch_1", "notes": [{"text": f"see {value}"}]})
    assert info.value.key == "kwargs['notes'][0]['text']"
    assert value not in str(info.value)  # never echo the secret


@pytest.mark.parametrize(
    "key", ["password", "api_key", "apiKey", "X-Api-Key", "private_key", "Authorization",
            "client_secret", "access_token", "refresh_token", "token", "DB_PASSWORD", "secret"],
)
def test_credential_named_keys_with_a_value_are_detected(key):
    with pytest.raises(SecretDetected) as info:
        assert_no_secrets({key: "hunter2"}, path="policy_args")
    assert info.value.key == f"policy_args[{key!r}]"


@pytest.mark.parametrize(
    "obj",
    [
        {"credential_ref": "stripe_prod"},
        {"idempotency_key": idempotency_key("s", "s/0", "forward")},
        {"digest": hashlib.sha256(b"x").hexdigest(), "id": str(uuid.uuid4())},
        {"charge_id": "ch_3MmlLrLkdIwHu7ix0snN0B15", "refund": "re_1Nispe2eZvKYlo2Cm"},
        {"password": ""},  # empty: nothing to leak
        {"token_count": 4096, "max_tokens": 100, "secret_name": "stripe-prod", "api_key_id": "k-1"},
        {"text": "the sk_ prefix and AKIA alone are not keys", "bearer": None},
        {"desc": "Bearer short"},
    ],
)
def test_the_detector_is_precise(obj):
    assert_no_secrets(obj)


def test_redact_secrets_scrubs_error_text():
    text = f"auth failed for {SECRETS['stripe']} with {SECRETS['bearer']}"
    out = redact_secrets(text)
    assert SECRETS["stripe"] not in out and "abcdefghijklmnopqrstuvwxyz0123" not in out
    assert out.count("[REDACTED]") == 2
