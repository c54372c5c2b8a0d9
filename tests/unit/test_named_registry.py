"""The one named-handler registry (``_registry.Registry``) and its two declarations,
``@compensator`` and ``@reconciler``: names checked at once, one function per name, the
same function again allowed, errors in each declaration's own words."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest
from agent_saga._registry import Registry
from agent_saga.compensation import compensator, get_compensator, unregister_compensator
from agent_saga.errors import ConfigurationError, HandlerNotRegistered
from agent_saga.recovery.reconcilers import get_reconciler, reconciler, unregister_reconciler


def _registry() -> Registry:
    return Registry(decorator="thing", bad_name="thing name {name!r} is bad", taken="{name!r} is {prev}, not {new}")


def first() -> None: ...


def second() -> None: ...


def test_a_registered_function_is_returned_unchanged_and_found_by_name() -> None:
    reg = _registry()
    assert reg.register("a.b")(first) is first
    assert reg.get("a.b") is first and reg.snapshot() == {"a.b": first}
    assert reg.get("c.d") is None


def test_an_unknown_name_is_none_and_unregistering_it_says_so() -> None:
    reg = _registry()
    assert reg.get("never.registered") is None
    assert reg.unregister("never.registered") is False
    reg.register("a.b")(first)
    assert reg.unregister("a.b") is True and reg.get("a.b") is None


def test_a_duplicate_registration_of_another_function_is_refused_naming_both() -> None:
    reg = _registry()
    reg.register("a.b")(first)
    with pytest.raises(ConfigurationError, match=r"^'a\.b' is .*test_named_registry\.first, not .*\.second$"):
        reg.register("a.b")(second)
    assert reg.get("a.b") is first


def test_the_same_function_again_is_allowed() -> None:
    reg = _registry()
    reg.register("a.b")(first)
    reg.register("a.b")(first)
    assert reg.snapshot() == {"a.b": first}


@pytest.mark.parametrize("bad", ["", "has space", ".leading", "x" * 129, 3, None])
def test_an_invalid_name_is_refused_before_any_function(bad: object) -> None:
    with pytest.raises(ConfigurationError, match=r"^thing name .* is bad$"):
        _registry().register(bad)  # type: ignore[arg-type]


def test_a_non_callable_is_refused_naming_the_decorator() -> None:
    with pytest.raises(ConfigurationError, match=r"^@thing\('a\.b'\) must decorate a callable, got 'text'$"):
        _registry().register("a.b")("text")  # type: ignore[type-var]


def test_concurrent_registrations_of_one_name_keep_exactly_one_function() -> None:
    reg = _registry()
    fns = [(lambda i=i: i) for i in range(8)]
    for i, fn in enumerate(fns):
        fn.__qualname__ = f"fn{i}"
    errors: list[Exception] = []

    def register(fn: object) -> None:
        try:
            reg.register("a.b")(fn)  # type: ignore[type-var]
        except ConfigurationError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(fn,)) for fn in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(errors) == len(fns) - 1 and reg.get("a.b") in fns


@pytest.fixture
def name() -> Iterator[str]:
    yield "test.named-registry"
    unregister_compensator("test.named-registry")
    unregister_reconciler("test.named-registry")


def test_compensator_and_reconciler_are_separate_registries_in_their_own_words(name: str) -> None:
    compensator(name)(first)
    reconciler(name)(second)
    assert get_compensator(name) is first and get_reconciler(name) is second
    with pytest.raises(ConfigurationError, match=r"^compensation handler 'test\.named-registry' is already registered "
                                                 r"to .*\.first; cannot register .*\.second under the same name"):
        compensator(name)(second)
    with pytest.raises(ConfigurationError, match=r"^'test\.named-registry' already has the reconciler .*\.second; "
                                                 r"cannot register .*\.first as well: one name, one authority"):
        reconciler(name)(first)
    with pytest.raises(ConfigurationError, match=r"^compensation handler name 'no good' is not valid: use a stable "
                                                 r"dotted name such as 'stripe\.refund'"):
        compensator("no good")
    with pytest.raises(ConfigurationError, match=r"^reconciler name 'no good' is not valid: use the handler's or "
                                                 r"tool's stable name"):
        reconciler("no good")
    with pytest.raises(ConfigurationError, match=r"^@reconciler\('x'\) must decorate a callable"):
        reconciler("x")(None)  # type: ignore[type-var]


def test_an_unknown_compensator_raises_while_an_unknown_reconciler_is_none() -> None:
    with pytest.raises(HandlerNotRegistered):
        get_compensator("never.registered")
    assert get_reconciler("never.registered") is None
