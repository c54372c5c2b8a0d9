"""The flat kwargs snapshot answers a short value under a key that names no credential
without calling the full secret check: it must refuse exactly what the full check refuses,
for every key class and every length around the cut-offs."""

from __future__ import annotations

import itertools
import string

import pytest
from agent_saga.errors import SecretDetected
from agent_saga.payloads import _flat_copy, snapshot_mapping
from agent_saga.scrubber import _key_class, why_secret

# plain, a weak key (names key material: flags random-looking values), strong (a credential)
KEYS = ["id", "amount_ref", "session", "key", "signing_key", "password", "token", "api_key", "secret_id",
        "Authorization", "client-secret", "x"]

# pieces that make a credential shape, key material, or nothing in particular
SEEDS = ["sk_live_", "rk_test_", "AKIA", "ASIA", "ghp_", "github_pat_", "glpat-", "xoxb-", "AIza", "sk-", "npm_",
         "pypi-", "SG.", "-----BEGIN ", "eyJhbGciOi", "https://u:p@h", "Bearer ", "Basic ", "ch_", "",
         "aB3xK9mQ2pL7vR4tZ8wY", "0123456789abcdef", "hunter2", "550e8400-e29b-41d4-a716"]
FILL = "Zq8Lm2Xr5Tw9Kp4Vn7Bc1Hd6Gf3Js0Ay"


def _values() -> list[str]:
    out = set()
    for seed in SEEDS:
        for n in range(1, 27):
            out.add((seed + FILL)[:n])
            out.add((seed + "A" * 40)[:n])
            out.add((seed + string.ascii_letters + string.digits)[:n])
    return sorted(out)


VALUES = _values()


def test_the_corpus_holds_short_and_long_secrets_under_every_key_class():
    classes = {_key_class(k) for k in KEYS}
    assert classes == {0, 1, 2}
    flagged = [(k, v) for k, v in itertools.product(KEYS, VALUES) if why_secret(k, v) is not None]
    assert any(len(v) < 12 for _, v in flagged)  # a short value under a credential's key
    assert any(_key_class(k) == 0 for k, _ in flagged)  # a shape under a plain key
    assert any(_key_class(k) == 1 for k, _ in flagged)  # key material under a weak key


@pytest.mark.parametrize("key", KEYS)
def test_a_flat_snapshot_refuses_exactly_what_the_secret_check_flags(key):
    for value in VALUES:
        secret = why_secret(key, value) is not None
        assert (_flat_copy({"id": "ch_1", key: value}) is None) is secret, (key, value)
        if secret:
            with pytest.raises(SecretDetected):
                snapshot_mapping({"id": "ch_1", key: value}, "kwargs")
        else:
            assert snapshot_mapping({"id": "ch_1", key: value}, "kwargs") == {"id": "ch_1", key: value}


def test_a_short_value_under_a_credentials_key_is_refused():
    for key, value in (("password", "pw"), ("token", "t"), ("api_key", "abc123")):
        with pytest.raises(SecretDetected) as info:
            snapshot_mapping({key: value}, "kwargs")
        assert f"kwargs[{key!r}]" in str(info.value)


@pytest.mark.parametrize("key", KEYS)
def test_a_compensations_descriptor_refuses_exactly_what_the_secret_check_flags(key):
    from agent_saga import Compensation

    for value in VALUES:
        comp = Compensation(handler="stripe.refund", kwargs={"id": "ch_1", key: value})
        if why_secret(key, value) is not None:
            with pytest.raises(SecretDetected) as info:
                comp.descriptor()
            assert f"kwargs[{key!r}]" in str(info.value)
        else:
            out = comp.descriptor()
            assert out["kwargs"] == {"id": "ch_1", key: value} and out["kwargs"] is not comp.kwargs


def test_a_descriptor_of_nested_or_non_dict_kwargs_is_the_general_snapshot():
    from types import MappingProxyType

    from agent_saga import Compensation

    for kwargs in ({"id": "ch_1", "at": {"n": [1, 2]}}, MappingProxyType({"id": "ch_1"})):
        out = Compensation(handler="stripe.refund", kwargs=kwargs).descriptor("k")["kwargs"]
        assert out == snapshot_mapping(kwargs, "k") and out.__class__ is dict
    with pytest.raises(SecretDetected) as info:
        Compensation(handler="stripe.refund", kwargs={"at": {"password": "pw"}}).descriptor()
    assert "kwargs['at']['password']" in str(info.value)
