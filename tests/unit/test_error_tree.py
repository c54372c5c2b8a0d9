"""The exception tree drawn in ``agent_saga/errors.py`` is the real one: every public
exception appears in it under a class it derives from, and nothing else is drawn."""

from __future__ import annotations

import importlib
import re

import agent_saga.errors

PUBLIC = (
    "agent_saga",
    "agent_saga.audit",
    "agent_saga.codemod",
    "agent_saga.controls",
    "agent_saga.controls.approvals",
    "agent_saga.controls.breaker",
    "agent_saga.controls.gate",
    "agent_saga.controls.killswitch",
    "agent_saga.controls.limits",
    "agent_saga.isolation",
    "agent_saga.recovery",
    "agent_saga.speculation",
    "agent_saga.wal",
)
ROOTS = {"SagaError": Exception, "ValueError": ValueError, "Exception": Exception}
_LINE = re.compile(r"^    (?P<lead>[ │├└─]*)(?P<name>[A-Z][A-Za-z]+)\b")


def public_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for name in PUBLIC:
        module = importlib.import_module(name)
        for attr in module.__all__:
            obj = getattr(module, attr)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                assert found.setdefault(attr, obj) is obj, f"two public exceptions are named {attr}"
    return found


def drawn_tree() -> list[tuple[str, str | None]]:
    """``(name, drawn parent)`` for every class in the docstring's drawings."""
    out: list[tuple[str, str | None]] = []
    stack: list[tuple[int, str]] = []
    for line in (agent_saga.errors.__doc__ or "").splitlines():
        m = _LINE.match(line)
        if m is None:
            if not line.strip():
                stack = []
            continue
        depth = len(m.group("lead")) // 4 if m.group("lead") else 0
        while stack and stack[-1][0] >= depth:
            stack.pop()
        out.append((m.group("name"), stack[-1][1] if stack else None))
        stack.append((depth, m.group("name")))
    return out


def test_every_public_exception_is_drawn_under_a_class_it_derives_from() -> None:
    public = public_exceptions()
    tree = drawn_tree()
    drawn = {name for name, _ in tree}
    assert sorted(set(public) - drawn) == [], "public exceptions missing from the tree in errors.py"
    for name, parent in tree:
        if parent is None:
            assert name in ROOTS, f"{name} is drawn as a root"
            continue
        cls = public.get(name)
        assert cls is not None, f"{name} is drawn but is not a public exception"
        bases = {c.__name__ for c in cls.__mro__}
        assert parent in bases, f"{name} is drawn under {parent}, but derives from {sorted(bases)}"


def test_every_store_error_is_one_store_unavailable() -> None:
    public = public_exceptions()
    stores = {n for n in public if n.endswith("StoreUnavailable") and n != "StoreUnavailable"}
    assert stores == {"LimitStoreUnavailable", "SwitchStoreUnavailable", "ApprovalStoreUnavailable",
                      "ClaimStoreUnavailable", "LockStoreUnavailable"}
    for name in stores:
        assert issubclass(public[name], agent_saga.errors.StoreUnavailable), name
