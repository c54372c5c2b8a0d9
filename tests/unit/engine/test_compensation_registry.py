"""Compensation values and the named-handler registry (@compensator)."""

from __future__ import annotations

import pytest
from agent_saga.compensation import (
    Compensation,
    coerce_compensation,
    compensator,
    get_compensator,
    registered_compensators,
    unregister_compensator,
)
from agent_saga.errors import (
    CompensationError,
    ConfigurationError,
    HandlerNotRegistered,
    NotSerializable,
    SecretDetected,
)
from agent_saga.idempotency import idempotency_key
from agent_saga.scope import saga_scope
from agent_saga.semantics import ActionSemantics
from engine_support import (
    Boom,
    of_type,
    payload,
    wal_fixture,  # noqa: F401 - provides the `wal` fixture
)


@pytest.fixture
def name(request: pytest.FixtureRequest):
    n = f"test.{request.node.name.replace('[', '.').replace(']', '')}"[:120]
    yield n
    unregister_compensator(n)


def test_the_decorator_registers_and_returns_the_function_unchanged(name):
    def refund(charge: str) -> None: ...

    assert compensator(name)(refund) is refund
    assert get_compensator(name) is refund
    assert registered_compensators()[name] is refund
    compensator(name)(refund)  # re-registering the same function is fine (re-import)


def test_a_name_taken_by_another_function_is_refused(name):
    @compensator(name)
    def first() -> None: ...

    def second() -> None: ...

    with pytest.raises(ConfigurationError, match="already registered"):
        compensator(name)(second)


@pytest.mark.parametrize("bad", ["", "has space", ".leading", "x" * 200, 3])
def test_names_are_validated_eagerly(bad):
    with pytest.raises(ConfigurationError):
        compensator(bad)  # type: ignore[arg-type]


def test_only_callables_can_be_registered(name):
    with pytest.raises(ConfigurationError, match="callable"):
        compensator(name)("not callable")  # type: ignore[type-var]


def test_an_unknown_name_raises_handler_not_registered():
    with pytest.raises(HandlerNotRegistered) as info:
        get_compensator("never.registered")
    assert info.value.handler == "never.registered"
    assert "@compensator('never.registered')" in str(info.value)


def test_compensation_is_validated():
    with pytest.raises(ConfigurationError, match="fn= .* or handler="):
        Compensation()
    with pytest.raises(ConfigurationError):
        Compensation(fn="nope")  # type: ignore[arg-type]
    with pytest.raises(ConfigurationError):
        Compensation(handler="bad name")
    with pytest.raises(ConfigurationError):
        Compensation(handler="ok", kwargs=[1])  # type: ignore[arg-type]
    c = Compensation(handler="stripe.refund", kwargs={"charge": "ch_1", "at": [1, 2.5]}, description="d")
    assert c.descriptor() == {"handler": "stripe.refund", "kwargs": {"charge": "ch_1", "at": [1, 2.5]}, "description": "d"}


def test_descriptor_names_the_offending_path():
    with pytest.raises(NotSerializable) as info:
        Compensation(handler="h", kwargs={"refund": {"items": [1, {"at": object()}]}}).descriptor()
    assert info.value.key == "kwargs['refund']['items'][1]['at']"
    with pytest.raises(NotSerializable, match="NaN"):
        Compensation(handler="h", kwargs={"x": float("nan")}).descriptor()
    with pytest.raises(NotSerializable, match="keys are strings"):
        Compensation(handler="h", kwargs={"x": {1: "a"}}).descriptor()
    with pytest.raises(SecretDetected) as secret:
        Compensation(handler="h", kwargs={"headers": {"Authorization": "Bearer abcdefghijklmnopqrstuvwxyz"}}).descriptor()
    assert secret.value.key == "kwargs['headers']['Authorization']"


def test_the_dict_form_is_coerced():
    c = coerce_compensation({"handler": "refund", "kwargs": {"id": "x"}}, "t")
    assert c == Compensation(handler="refund", kwargs={"id": "x"})
    assert coerce_compensation(None, "t") is None
    for bad in ({"kwargs": {}}, {"handler": "h", "fn": print}, {"handler": "bad name"}, 42):
        with pytest.raises(CompensationError):
            coerce_compensation(bad, "t")


async def test_a_named_handler_is_resolved_and_run_in_process_with_the_key(wal, name):
    calls: list[dict] = []

    @compensator(name)
    def delete_namespace(namespace: str, idempotency_key: str, credential_ref: str) -> None:
        calls.append({"namespace": namespace, "key": idempotency_key, "ref": credential_ref})

    with pytest.raises(Boom):
        async with saga_scope(wal) as saga:
            await saga.execute(
                "pinecone.create_namespace", ActionSemantics.COMPENSABLE,
                forward=lambda: {"namespace": "acme"},
                compensate=lambda r: Compensation(
                    handler=name, kwargs={"namespace": r["namespace"], "credential_ref": "pinecone_prod"}
                ),
            )
            raise Boom()
    step = f"{saga.saga_id}/0"
    assert calls == [{"namespace": "acme", "key": idempotency_key(saga.saga_id, step, "compensate"), "ref": "pinecone_prod"}]
    assert of_type(wal, saga.saga_id, "COMPENSATION_DONE")
    (committed,) = of_type(wal, saga.saga_id, "STEP_COMMITTED")
    assert payload(committed)["compensation"]["handler"] == name


async def test_fn_takes_precedence_in_process_and_handler_is_what_is_logged(wal, name):
    ran: list[str] = []

    @compensator(name)
    def registered(**_: object) -> None:
        ran.append("registered")

    with pytest.raises(Boom):
        async with saga_scope(wal) as saga:
            await saga.execute(
                "x", ActionSemantics.COMPENSABLE, lambda: 1,
                lambda r: Compensation(fn=lambda: ran.append("fn"), handler=name),
            )
            raise Boom()
    assert ran == ["fn"]


async def test_an_explicit_idempotency_key_in_kwargs_is_kept(wal):
    seen: list[str] = []

    def undo(idempotency_key: str) -> None:
        seen.append(idempotency_key)

    with pytest.raises(Boom):
        async with saga_scope(wal) as saga:
            await saga.execute(
                "x", ActionSemantics.COMPENSABLE, lambda: 1,
                lambda r: Compensation(fn=undo, kwargs={"idempotency_key": "mine"}),
            )
            raise Boom()
    assert seen == ["mine"]
