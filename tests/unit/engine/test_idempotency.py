"""Deterministic idempotency keys and the cached callable inspection."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys

from agent_saga.idempotency import callable_info, idempotency_key


def test_the_key_is_sha256_over_framed_parts_and_stable_across_processes():
    key = idempotency_key("checkout-402", "checkout-402/3", "compensate")
    expected = hashlib.sha256(
        b"25:agent-saga/idempotency/v1,12:checkout-402,14:checkout-402/3,10:compensate,"
    ).hexdigest()
    assert key == expected
    out = subprocess.run(
        [sys.executable, "-c",
         "from agent_saga.idempotency import idempotency_key as k;"
         "print(k('checkout-402', 'checkout-402/3', 'compensate'))"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()
    assert out == key


def test_the_join_is_unambiguous():
    assert idempotency_key("a:b", "c", "d") != idempotency_key("a", "b:c", "d")
    assert idempotency_key("a,", "b", "c") != idempotency_key("a", ",b", "c")
    assert idempotency_key("s", "s/0", "forward") != idempotency_key("s", "s/0", "compensate")


def test_callable_info():
    async def a(idempotency_key: str) -> None: ...

    def b(*, idempotency_key: str) -> None: ...

    def c(**kw: object) -> None: ...

    def d(x: int) -> None: ...

    def e(idempotency_key: str, /) -> None: ...  # positional-only: cannot be passed by name

    class Tool:
        async def __call__(self, idempotency_key: str) -> None: ...

        def method(self, idempotency_key: str) -> None: ...

    @functools.wraps(d)
    def wrapped(*args: object, **kwargs: object) -> None: ...

    assert callable_info(a) == (True, True)
    assert callable_info(b) == (False, True)
    assert callable_info(c) == (False, True)
    assert callable_info(d) == (False, False)
    assert callable_info(e) == (False, False)
    assert callable_info(lambda: None) == (False, False)
    assert callable_info(Tool()) == (True, True)
    assert callable_info(Tool().method) == (False, True)
    assert callable_info(functools.partial(a)) == (True, True)
    assert callable_info(wrapped) == (False, False)  # follows __wrapped__
    assert callable_info(print) == (False, False)
