"""Server addresses are printed without their passwords, in every form a password takes."""

from __future__ import annotations

import pytest
from agent_saga.wal.urls import Scrubber, redact, secrets_in


@pytest.mark.parametrize(
    ("target", "secret", "shown"),
    [
        ("redis://:s3cr%40t@10.0.0.1:6379/0", "s3cr@t", "redis://:***@10.0.0.1:6379/0"),
        ("redis://app:hunter2@h:1/2?key=k", "hunter2", "redis://app:***@h:1/2?key=k"),
        ("rediss://h:6380/0?password=tok3n&ssl_cert_reqs=none", "tok3n",
         "rediss://h:6380/0?password=***&ssl_cert_reqs=none"),
        ("postgresql://wal:pa%20ss@db:5432/app?table=saga_wal", "pa ss",
         "postgresql://wal:***@db:5432/app?table=saga_wal"),
        ("host=db user=wal password='it\\'s x' dbname=app", "it's x", "host=db user=wal password=*** dbname=app"),
        ("host=db password=plain dbname=app", "plain", "host=db password=*** dbname=app"),
    ],
)
def test_redact_and_scrub(target: str, secret: str, shown: str) -> None:
    assert redact(target) == shown
    found = secrets_in(target)
    assert secret in found, (target, found)
    scrub = Scrubber(found)
    for form in found:
        assert form not in scrub(f"error connecting with {target}: bad {form}")


def test_no_password_no_change() -> None:
    assert redact("redis://h:6379/0") == "redis://h:6379/0"
    assert secrets_in("redis://user@h/0") == ()
    assert Scrubber()("anything") == "anything"
