"""Credential custody's pieces without processes: the upstream file's ``credentials``
entries are checked naming the field and the fix; a mounted Secret directory and the
environment resolve references, and an unreadable one is named, never its value; every
form of a value is masked, also across chunk borders; the Host and Origin rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_saga.compensation import unregister_compensator
from agent_saga.credentials import MountedCredentials, set_credential_resolver
from agent_saga.errors import ConfigurationError
from agent_saga.hosts import host_allowed, origin_allowed
from agent_saga.mcp import load_upstreams
from agent_saga.mcp._custody import (
    CredentialUnavailable,
    CredentialUse,
    Custody,
    Redactor,
    parse_credentials,
)
from agent_saga.mcp._wire import parse, top_id
from agent_saga.mcp.upstreams import named_upstream


@pytest.mark.parametrize(("value", "http", "says"), [
    ("tok", True, "must be a list"),
    ([{"credentialRef": "t", "env": "X"}], True, "an HTTP upstream gets a header"),
    ([{"credentialRef": "t"}], False, "add \"env\""),
    ([{"credentialRef": "t", "header": "Bad Header"}], True, "not a header name"),
    ([{"credentialRef": "t", "value": "s3cret"}], True, "never the secret itself"),
    ([{"credentialRef": "t", "env": "X", "header": "H"}], False, "not both"),
])
def test_bad_credentials_entries_are_refused_naming_the_fix(value: object, http: bool, says: str) -> None:
    with pytest.raises(ConfigurationError, match=says):
        parse_credentials(value, "upstreams.json: upstream 'pay'", http=http)


def test_a_credential_defaults_to_a_bearer_authorization_header() -> None:
    (bearer, key) = parse_credentials([{"credentialRef": "a"}, {"credentialRef": "b", "header": "X-Api-Key"}],
                                      "x", http=True)
    assert (bearer.header, bearer.scheme, key.header, key.scheme) == ("Authorization", "Bearer", "X-Api-Key", "")


def test_the_upstreams_file_carries_references_and_the_proxy_finds_them_by_name(tmp_path: Path) -> None:
    path = tmp_path / "up.json"
    path.write_text(json.dumps({"pay-cust": {"url": "http://pay:8000/mcp",
                                             "credentials": [{"credentialRef": "pay-token"}]}}))
    load_upstreams(str(path))
    try:
        spec = named_upstream("pay-cust")
        assert spec is not None and spec.credentials == (CredentialUse("pay-token", header="Authorization",
                                                                        scheme="Bearer"),)
    finally:
        unregister_compensator("mcp:pay-cust")


def test_mounted_credentials_read_a_secret_directory_and_the_environment(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pay-token").write_text("v4lue-from-file\n")
    monkeypatch.setenv("PAY_KEY", "v4lue-from-env")
    creds = MountedCredentials(str(tmp_path))
    assert creds("pay-token") == "v4lue-from-file" and creds("env:PAY_KEY") == "v4lue-from-env"
    for ref, says in (("missing", "'missing'.*cannot be read"), ("../etc/passwd", "one file name"),
                      ("env:NOT_SET_ANYWHERE", "not set")):
        with pytest.raises(ConfigurationError, match=says):
            creds(ref)
    with pytest.raises(ConfigurationError, match="AGENT_SAGA_CREDENTIALS_DIR"):
        MountedCredentials(None)("pay-token")


def test_an_unresolvable_credential_is_named_never_its_value(tmp_path: Path) -> None:
    (tmp_path / "empty").write_text("")
    prev = set_credential_resolver(MountedCredentials(str(tmp_path)))
    try:
        custody = Custody([CredentialUse("empty", header="Authorization", scheme="Bearer")])
        with pytest.raises(CredentialUnavailable, match="'empty'.*is empty"):
            custody.headers()
        set_credential_resolver(lambda ref: "multi\nline")
        with pytest.raises(CredentialUnavailable, match="not a one-line string") as err:
            custody.headers()
        assert "multi" not in str(err.value)
    finally:
        set_credential_resolver(prev)


def test_every_form_of_a_value_is_masked_also_across_chunk_borders() -> None:
    prev = set_credential_resolver(lambda ref: 'q"uo\\te-é-secret')
    try:
        custody = Custody([CredentialUse("r", header="X-Key")])
        assert custody.headers() == [("X-Key", 'q"uo\\te-é-secret')]
    finally:
        set_credential_resolver(prev)
    as_json = json.dumps({"k": 'q"uo\\te-é-secret'}).encode()  # escaped, \u00e9
    assert b"secret" not in custody.redact(as_json) and len(custody.redact(as_json)) == len(as_json)
    raw = 'a q"uo\\te-é-secret b'.encode()
    out = Redactor(custody)
    chunks = [raw[:5], raw[5:9], raw[9:], b"\n\n"]
    streamed = b"".join(out.feed(c) for c in chunks) + out.flush()
    assert streamed == custody.redact(raw + b"\n\n") and b"secret" not in streamed
    assert out.feed(b"event: message\n\n") == b"event: message\n\n"  # nothing held after a newline


def test_secrets_inside_or_overlapping_each_other_are_masked_whole() -> None:
    values = {"a": "hunter2", "b": "hunter2xyzw", "c": "abcd", "d": "cdef"}
    prev = set_credential_resolver(lambda ref: values[ref])
    try:
        custody = Custody([CredentialUse(r, header=f"X-{r}") for r in values])
        custody.headers()
    finally:
        set_credential_resolver(prev)
    for data in (b"tok=hunter2xyzw;", b"tok=hunter2;", b"[abcdef]"):
        masked = custody.redact(data)
        assert len(masked) == len(data) and not any(v.encode() in masked for v in values.values()), masked
        assert masked.replace(b"*", b"") in (b"tok=;", b"[]"), masked


def test_host_and_origin_follow_the_debugger_ui_rule() -> None:
    assert host_allowed("127.0.0.1:8931") and host_allowed("localhost") and host_allowed("[::1]:80")
    assert not host_allowed("evil.example:8931") and not host_allowed("")
    assert host_allowed("MCP.internal:80", {"mcp.internal"})
    assert origin_allowed("http://localhost:5173") and origin_allowed("https://mcp.internal", {"mcp.internal"})
    assert not origin_allowed("null") and not origin_allowed("http://evil.example")
    assert not origin_allowed("http://127.0.0.1.evil.example")


def test_top_id_reads_only_the_top_level_id() -> None:
    assert top_id('{"result": {"id": 9, "x": [{"id": 4}]}, "id": 12, "more": ') == 12
    assert top_id('{"id": 1, "id": 2}') is None and top_id('{"id": true}') is None
    assert parse(b'{"jsonrpc": "2.0", "id": "a\\"b"}') == {"jsonrpc": "2.0", "id": 'a"b'}
