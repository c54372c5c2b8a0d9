"""``Compensation`` builds its frozen slots itself; it is still the dataclass it was.

What this pins against a reference built the dataclass way (generated ``__init__`` and a
``__post_init__`` with the same checks): the signature, equality, ``repr``, hashing,
``replace`` (which checks again), ``asdict``, ``__match_args__``, the frozen errors, a
default ``kwargs`` dict of its own per compensation, and the same error for each misuse.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from agent_saga.compensation import Compensation, _check_handler_name
from agent_saga.errors import ConfigurationError


@dataclass(frozen=True, slots=True)
class Compensation_:  # noqa: N801 - the reference: named so its repr matches after a strip
    fn: Callable[..., Any] | None = None
    handler: str | None = None
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        if self.fn is None and self.handler is None:
            raise ConfigurationError(
                "Compensation needs fn= (run in-process) or handler= (a name registered with "
                "@compensator, replayable after a crash), or both"
            )
        if self.fn is not None and not callable(self.fn):
            raise ConfigurationError(f"Compensation.fn must be callable, got {self.fn!r}")
        if self.handler is not None:
            _check_handler_name(self.handler)
        if self.kwargs.__class__ is not dict and not isinstance(self.kwargs, Mapping):
            raise ConfigurationError(
                f"Compensation.kwargs must be a mapping of JSON values, got {type(self.kwargs).__name__}"
            )
        if self.description.__class__ is not str and not isinstance(self.description, str):
            raise ConfigurationError("Compensation.description must be a string")


GOOD: list[tuple[tuple[Any, ...], dict[str, Any]]] = [
    ((), {"handler": "stripe.refund", "kwargs": {"charge": "ch_1"}}),
    ((print,), {}),
    ((print, "h.x", {"a": [1, 2]}, "undo it"), {}),
    ((), {"fn": print, "description": "d"}),
]
BAD: list[dict[str, Any]] = [
    {},
    {"fn": 3},
    {"handler": "not a name!"},
    {"handler": 7},
    {"handler": "h", "kwargs": [1]},
    {"handler": "h", "kwargs": None},
    {"handler": "h", "description": 5},
]


def test_the_signature_is_the_dataclass_one() -> None:
    def params(cls: type) -> str:
        return str(inspect.signature(cls).replace(return_annotation=inspect.Signature.empty))

    assert params(Compensation) == params(Compensation_)
    assert [f.name for f in dataclasses.fields(Compensation)] == [f.name for f in dataclasses.fields(Compensation_)]
    assert Compensation.__match_args__ == Compensation_.__match_args__
    assert Compensation.__slots__ == Compensation_.__slots__


@pytest.mark.parametrize(("args", "kw"), GOOD)
def test_a_compensation_is_the_same_value(args: tuple[Any, ...], kw: dict[str, Any]) -> None:
    c, ref = Compensation(*args, **kw), Compensation_(*args, **kw)
    assert repr(c) == repr(ref).replace("Compensation_(", "Compensation(")
    assert dataclasses.asdict(c) == dataclasses.asdict(ref)
    assert c == Compensation(*args, **kw) and c != ref  # a dataclass equals its own class only
    if isinstance(c.kwargs, dict) and not c.kwargs:
        assert c.kwargs is not Compensation(*args, **kw).kwargs  # a default dict of its own
    with pytest.raises(TypeError, match="unhashable"):
        hash(c)  # kwargs is a dict: unhashable, as before
    with pytest.raises(TypeError, match="unhashable"):
        hash(ref)


def test_replace_builds_and_checks_again() -> None:
    c = Compensation(handler="stripe.refund", kwargs={"charge": "ch_1"})
    d = dataclasses.replace(c, description="why")
    assert d.description == "why" and d.handler == c.handler and d.kwargs is c.kwargs
    with pytest.raises(ConfigurationError) as ours:
        dataclasses.replace(c, handler=None)
    with pytest.raises(ConfigurationError) as theirs:
        dataclasses.replace(Compensation_(handler="stripe.refund"), handler=None)
    assert str(ours.value) == str(theirs.value)


def test_it_is_frozen_with_the_same_errors() -> None:
    c, ref = Compensation(handler="h.x"), Compensation_(handler="h.x")
    for act in (lambda o: setattr(o, "handler", "y"), lambda o: delattr(o, "kwargs"),
                lambda o: setattr(o, "other", 1)):
        with pytest.raises(Exception) as ours:  # noqa: PT011 - the class is compared below
            act(c)
        with pytest.raises(Exception) as theirs:  # noqa: PT011
            act(ref)
        assert type(ours.value) is type(theirs.value)
        assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("kw", BAD)
def test_each_misuse_raises_the_same_error(kw: dict[str, Any]) -> None:
    with pytest.raises(ConfigurationError) as ours:
        Compensation(**kw)
    with pytest.raises(ConfigurationError) as theirs:
        Compensation_(**kw)
    assert str(ours.value) == str(theirs.value)
