"""Packages load their public names on first use, and nothing is lost by it.

A package that lists its names in ``_SOURCES`` (``agent_saga._lazy``) runs none of its
modules when imported. What this pins: the imports type checkers read (under
``TYPE_CHECKING``) are exactly what runs; every exported name resolves to the object its
module defines; ``import agent_saga`` loads nothing but its table, and the wiring that used
to happen as a side effect of it (the kill switch for a saga without a gate, the
environment hook, the codemod's compensations) happens on first use in a process that
imports only one leaf module; and every package imports on its own in a fresh interpreter
(no import-order cycles).
"""

from __future__ import annotations

import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import agent_saga
import pytest

RUNTIME = Path(agent_saga.__file__).parent


def _lazy_packages() -> list[str]:
    names = []
    for init in sorted(RUNTIME.rglob("__init__.py")):
        if "_SOURCES" in init.read_text():
            rel = init.parent.relative_to(RUNTIME.parent)
            names.append(".".join(rel.parts))
    return names


LAZY = _lazy_packages()


def _tree(package: str) -> ast.Module:
    return ast.parse(RUNTIME.parent.joinpath(*package.split("."), "__init__.py").read_text())


def _eager_imports(package: str) -> set[str]:
    """Names the package binds when imported (a few cheap ones stay eager)."""
    return {alias.asname or alias.name for node in _tree(package).body
            if isinstance(node, ast.ImportFrom) for alias in node.names}


def _type_checking_imports(package: str) -> dict[str, tuple[str, ...]]:
    tree = _tree(package)
    found: dict[str, tuple[str, ...]] = {}
    for node in tree.body:
        if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING":
            for imp in node.body:
                assert isinstance(imp, ast.ImportFrom) and imp.level >= 1, (
                    f"{package}: only relative imports belong under TYPE_CHECKING, got {ast.unparse(imp)}")
                for alias in imp.names:
                    # ``Name as Name``: an explicit re-export, as mypy --strict and pyright
                    # need when ``__all__`` is derived rather than a literal
                    assert alias.asname == alias.name, (
                        f"{package}: write `from {'.' * imp.level}{imp.module} import {alias.name} "
                        f"as {alias.name}` under TYPE_CHECKING")
                    module = "." * imp.level + str(imp.module)
                    found[module] = (*found.get(module, ()), alias.name)
    return {module: tuple(sorted(names)) for module, names in found.items()}


def test_the_lazy_packages_are_found() -> None:
    # The scan is what the other tests iterate; an empty scan would make them vacuous.
    assert {"agent_saga", "agent_saga.wal", "agent_saga.controls", "agent_saga.recovery"} <= set(LAZY)


@pytest.mark.parametrize("package", LAZY)
def test_what_type_checkers_read_is_what_runs(package: str) -> None:
    module = importlib.import_module(package)
    sources = {mod: tuple(sorted(names)) for mod, names in module._SOURCES.items()}
    assert _type_checking_imports(package) == sources
    exported = {name for names in sources.values() for name in names}
    exported |= _eager_imports(package) & set(module.__all__)
    assert exported == set(module.__all__), (
        f"{package}: in __all__ but not loadable: {sorted(set(module.__all__) - exported)}; "
        f"loadable but not exported: {sorted(exported - set(module.__all__))}")


@pytest.mark.parametrize("package", LAZY)
def test_every_name_is_the_object_its_module_defines(package: str) -> None:
    module = importlib.import_module(package)
    for source, names in module._SOURCES.items():
        defining = importlib.import_module(source, package)
        for name in names:
            assert getattr(module, name) is getattr(defining, name), f"{package}.{name}"
    assert set(module.__all__) <= set(dir(module))


def test_an_unknown_name_is_an_attribute_error_naming_it() -> None:
    with pytest.raises(AttributeError, match="'agent_saga.wal' has no attribute 'FileWall'"):
        _ = agent_saga.wal.FileWall  # type: ignore[attr-defined]
    with pytest.raises(ImportError, match="cannot import name 'Sag'"):
        from agent_saga import Sag  # type: ignore[attr-defined]  # noqa: F401


def test_a_subpackage_is_an_attribute_of_its_package_without_importing_it() -> None:
    # ``import agent_saga`` used to load the WAL, the controls and recovery for their side
    # effects, so ``agent_saga.wal.FileWAL`` worked after it; it still does, loaded on use.
    out = _run("import agent_saga\n"
               "print(agent_saga.wal.FileWAL.__name__, agent_saga.controls.limits.BudgetLimit.__name__, "
               "agent_saga.recovery.daemon.RecoveryDaemon.__name__)\n"
               "try:\n"
               "    agent_saga.wall\n"
               "except AttributeError as exc:\n"
               "    print(exc)\n")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["FileWAL BudgetLimit RecoveryDaemon",
                                       "module 'agent_saga' has no attribute 'wall'"], out.stdout


def _run(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env=env)


def test_importing_the_package_runs_nothing_but_its_table() -> None:
    # ``import agent_saga`` loads the lazy table and nothing else of ours: no controls,
    # plane, codemod, WAL or recovery (they used to be imported for their side effects).
    out = _run("import sys; import agent_saga\n"
               "print(sorted(m for m in sys.modules if m.startswith('agent_saga')))")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['agent_saga', 'agent_saga._lazy']", out.stdout


def test_importing_one_leaf_module_still_wires_the_process() -> None:
    # A process that imports only the scope (as an agent using saga_scope does) must still
    # get the kill-switch gate for sagas opened without one, the environment hook, and the
    # codemod's compensations and reconcilers for recovery. None of them is loaded by the
    # import; each is loaded by its first use.
    out = _run(
        "import agent_saga.scope, sys\n"
        "from agent_saga import gates, compensation\n"
        "from agent_saga.controls import _wiring\n"
        "from agent_saga.recovery import reconcilers\n"
        "print([m for m in ('agent_saga.controls.gate._nogate', 'agent_saga.plane', "
        "'agent_saga.codemod') if m in sys.modules])\n"
        "gates.no_gate_fallback()\n"
        "print(getattr(gates._fallback, '__qualname__', gates._fallback))\n"
        "_wiring.from_environment()\n"
        "print(getattr(_wiring._hook, '__qualname__', _wiring._hook))\n"
        "print(reconcilers.get_reconciler('codemod.merge') is not None)\n"
        "print(sorted(h for h in compensation.registered_compensators() if h.startswith('codemod')))\n"
        "print('agent_saga.routing' in sys.modules, 'agent_saga.audit.bundles' in sys.modules)\n",
        env={k: v for k, v in os.environ.items() if not k.startswith("AGENT_SAGA_")},
    )
    assert out.returncode == 0, out.stderr
    loaded, fallback, hook, merge, handlers, heavy = out.stdout.splitlines()
    assert loaded == "[]", f"imported before first use: {loaded}"
    assert fallback == "kill_switch_gate"
    assert hook == "plane_from_env"
    assert handlers == "['codemod.discard_shadow', 'codemod.restore']", handlers
    assert merge == "True"
    assert heavy == "False False", "importing the scope loaded the router or the audit bundles"


def test_a_shipped_handler_name_is_still_refused_when_declared() -> None:
    # The codemod's handlers load lazily, yet declaring another function under one of their
    # names fails at decoration, as it did when they were registered at import.
    out = _run(
        "from agent_saga.compensation import compensator\n"
        "from agent_saga.errors import ConfigurationError\n"
        "try:\n"
        "    compensator('codemod.restore')(lambda **kw: None)\n"
        "except ConfigurationError as exc:\n"
        "    print('refused:', exc)\n"
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused: compensation handler 'codemod.restore' is already registered"), out.stdout


def test_every_package_imports_on_its_own() -> None:
    # Each in a fresh interpreter: with lazy packages, a cycle hidden by the old import
    # order (a leaf importing its package's backends) would surface here.
    packages = sorted({*LAZY, "agent_saga.cli", "agent_saga._redis", "agent_saga._backends",
                       "agent_saga.wal.urls", "agent_saga.engine"})
    procs = {p: subprocess.Popen([sys.executable, "-c", f"import {p}"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True) for p in packages}
    failed = {}
    for package, proc in procs.items():
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 0:
            failed[package] = err.strip().splitlines()[-1]
    assert not failed, failed
