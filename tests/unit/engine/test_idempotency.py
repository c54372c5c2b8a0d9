"""Deterministic idempotency keys and the cached callable inspection."""

from __future__ import annotations

import functools
import hashlib
import subprocess
import sys

from agent_saga.idempotency import (
    FORWARD_SCOPE,
    callable_info,
    forward_key,
    idempotency_key,
    key_prefix,
)


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


def test_the_forward_key_from_a_saga_prefix_is_the_forward_scope_key():
    for saga_id, step_id in [("checkout-402", "checkout-402/3"), ("a:b", "c"), ("a", "b:c"), ("s", ""),
                             ("s\u00e9-1", "s\u00e9-1/0"), ("x" * 200, "x" * 200 + "/99")]:
        expected = idempotency_key(saga_id, step_id, FORWARD_SCOPE)
        assert forward_key(key_prefix(saga_id), step_id) == expected
    assert forward_key(key_prefix("checkout-402"), "checkout-402/3") == hashlib.sha256(
        b"25:agent-saga/idempotency/v1,12:checkout-402,14:checkout-402/3,7:forward,"
    ).hexdigest()


async def test_a_step_passes_its_forward_the_forward_scope_key(tmp_path):
    from agent_saga import ActionSemantics, Compensation, FileWAL, saga_scope

    seen = []

    async def charge(idempotency_key):
        seen.append(idempotency_key)
        return {"id": "x"}

    wal = FileWAL(tmp_path / "k.wal")
    try:
        async with saga_scope(wal, name="keys") as saga:
            for _ in range(2):
                await saga.execute("stripe.charge", ActionSemantics.COMPENSABLE, charge,
                                   lambda r: Compensation(handler="stripe.refund", kwargs={"id": r["id"]}))
        ids = [f"{saga.saga_id}/0", f"{saga.saga_id}/1"]
        assert seen == [idempotency_key(saga.saga_id, s, FORWARD_SCOPE) for s in ids]
        intents = [r async for r in wal.read_all() if r.type == "STEP_INTENT"]
        assert [r.payload["idempotency_key"] for r in intents] == seen
    finally:
        wal.close()


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
