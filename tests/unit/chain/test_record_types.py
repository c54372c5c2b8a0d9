"""Every record type the library writes is one its readers know (``records.KNOWN_TYPES``),
and every name in that list is written somewhere: the forward-compatibility rule (a
reader refuses to act on what it does not know) must never trip over our own records.

The writers are found in the source, not listed by hand: every ``append(TYPE, ...)``,
``append((TYPE, payload))``, ``_append(TYPE, ...)``, ``Record(TYPE, ...)`` and
``rec.type = TYPE`` whose TYPE is a string literal, a module constant,
``RecordType.X.value`` / ``ExtensionType.X.value`` or a conditional of those.

The table (``RecordType`` and ``ExtensionType``) is the only place a type is spelled: no
other string in runtime/, operator/ or recoveryd/ names one.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from agent_saga.records import (
    EXTENSION_TYPES,
    KNOWN_TYPES,
    TYPE_PATTERN,
    ExtensionType,
    RecordType,
    is_known_type,
)

ROOT = Path(__file__).resolve().parents[3]
RUNTIME = ROOT / "runtime" / "agent_saga"
_TABLE = {**RecordType.__members__, **ExtensionType.__members__}


@functools.cache
def _parsed(path: Path) -> ast.Module:
    """A source file's syntax tree, parsed once for all the tests here."""
    return ast.parse(path.read_text(), str(path))


def _constants(tree: ast.Module) -> dict[str, str]:
    out: dict[str, str] = {}
    for node in tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and value is not None:
            values = _types_of(value, out)
            if len(values) == 1:
                out[target.id] = values[0]
    return out


def _types_of(node: ast.expr, consts: dict[str, str]) -> list[str]:
    if isinstance(node, ast.IfExp):
        return _types_of(node.body, consts) + _types_of(node.orelse, consts)
    if isinstance(node, ast.Tuple) and node.elts:  # records.append((TYPE, payload)) queued to write
        return _types_of(node.elts[0], consts)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in consts:
        return [consts[node.id]]
    if isinstance(node, ast.Attribute) and node.attr == "value" and isinstance(node.value, ast.Attribute):
        # RecordType.X.value, R.X.value, ExtensionType.X.value, records.ExtensionType.X.value
        owner = node.value.value
        table = owner.id if isinstance(owner, ast.Name) else owner.attr if isinstance(owner, ast.Attribute) else ""
        if table in ("RecordType", "R", "ExtensionType"):
            return [_TABLE[node.value.attr].value]
    return []


def written_types() -> dict[str, str]:
    """``{type: where}`` for every record type the runtime writes."""
    found: dict[str, str] = {}
    # Names other modules import from the modules defining them (e.g. recovery.recordtypes).
    shared: dict[str, str] = {}
    for other in RUNTIME.rglob("*.py"):
        if other.name in ("recordtypes.py", "records.py", "chain.py", "compaction.py"):
            shared.update(_constants(_parsed(other)))
    for path in sorted(RUNTIME.rglob("*.py")):
        tree = _parsed(path)
        consts = {**shared, **_constants(tree)}
        for node in ast.walk(tree):
            arg: ast.expr | None = None
            if isinstance(node, ast.Call) and node.args:
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name in ("append", "_append", "Record"):
                    arg = node.args[0]
            elif isinstance(node, ast.Assign) and len(node.targets) == 1:
                t = node.targets[0]
                if isinstance(t, ast.Attribute) and t.attr == "type":
                    arg = node.value
            if arg is None:
                continue
            for value in _types_of(arg, consts):
                if TYPE_PATTERN.match(value):
                    found.setdefault(value, f"{path.relative_to(RUNTIME)}:{node.lineno}")
    return found


def test_every_record_type_the_library_writes_is_known() -> None:
    written = written_types()
    # The scan finds the writers it must (a scan that found nothing would prove nothing).
    for expected in ("STEP_COMMITTED", "KILL_SWITCH_ENGAGED", "APPROVAL_BREAK_GLASS", "RECORD_REJECTED",
                     "WAL_TORN_TAIL", "RECOVERY_STARTED", "COMPACTION_FAILED", "REDACTION"):
        assert expected in written, expected
    unknown = {t: where for t, where in written.items() if not is_known_type(t)}
    assert unknown == {}, f"written but not in records.KNOWN_TYPES: {unknown}"


def test_every_extension_type_is_written_somewhere() -> None:
    written = written_types()
    stale = sorted(EXTENSION_TYPES - set(written) - {"COMPACTION"})
    assert stale == [], f"records.EXTENSION_TYPES names types nothing writes: {stale}"


def test_the_engine_types_are_known_and_others_are_not() -> None:
    assert {t.value for t in RecordType} <= KNOWN_TYPES
    assert not is_known_type("STEP_TELEPORTED") and not is_known_type("step_committed")


def test_the_extension_table_is_what_readers_check_against() -> None:
    assert {t.value for t in ExtensionType} == EXTENSION_TYPES
    assert all(t.name == t.value for t in (*RecordType, *ExtensionType))
    assert not set(RecordType.__members__) & set(ExtensionType.__members__)


#: Strings spelled like a record type that mean something else: a rollback outcome
#: (``RollbackOutcome.ESCALATED``), a step state of ``history`` and an escalation kind.
_OTHER_VOCABULARIES = frozenset({"ESCALATED", "COMPENSATION_FAILED"})


def test_no_string_but_the_table_names_a_record_type() -> None:
    found = []
    for root in ("runtime/agent_saga", "operator/agent_saga_operator", "recoveryd/agent_saga_recoveryd"):
        for path in sorted((ROOT / root).rglob("*.py")):
            if path == RUNTIME / "records.py":
                continue
            tree = _parsed(path)
            names = set()  # the strings of __all__ and _SOURCES are Python names, not types
            for node in ast.walk(tree):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                    node, ast.AnnAssign) else []
                if any(isinstance(t, ast.Name) and t.id in ("__all__", "_SOURCES") for t in targets):
                    names.update(id(c) for c in ast.walk(node) if isinstance(c, ast.Constant))
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in KNOWN_TYPES
                    and node.value not in _OTHER_VOCABULARIES and id(node) not in names
                ):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
    assert found == [], "name these record types through records.RecordType / ExtensionType: " + ", ".join(found)
