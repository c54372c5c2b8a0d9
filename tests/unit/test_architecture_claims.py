"""docs/architecture.md states only what is true: the claims a machine can check are checked.

- The runtime's layer drawing is the ``runtime-layers`` contract: the same layers in the
  same order, the same modules in each, ``|`` exactly where the contract makes siblings
  independent, and every top-level module and package of the runtime drawn.
- Every numbered layer rule names contracts of pyproject.toml, and every contract has one.
- The package map names every package of the runtime, and every path it names exists; the
  controls drawing is the tree of ``controls/``.
- The public surface: the two contracts forbid exactly what the page calls implementation,
  and the operator, recoveryd, bench/ and hack/ import nothing else (read from their
  source here, apart from import-linter).
- The test folders the page names exist.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "runtime" / "agent_saga"
DOC = (REPO / "docs" / "architecture.md").read_text()
CONTRACTS = {c["id"]: c for c in tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]}
#: The modules imported by their path (the page's third kind of public module).
BY_PATH = {"agent_saga.adapters", "agent_saga.connectors"}
BY_PATH_MODULES = {"agent_saga.mcp.upstreams"}
OUTSIDE = {"agent_saga_operator": REPO / "operator" / "agent_saga_operator",
           "agent_saga_recoveryd": REPO / "recoveryd" / "agent_saga_recoveryd",
           "bench": REPO / "bench", "hack": REPO / "hack"}


def section(heading: str) -> str:
    start = DOC.index(f"\n## {heading}")
    end = DOC.find("\n## ", start + 1)
    return DOC[start:end if end != -1 else len(DOC)]


def block_lines(text: str) -> list[str]:
    """The lines of the indented (code) blocks in ``text``."""
    return [line for line in text.splitlines() if line.startswith("    ")]


def split_layer(text: str) -> tuple[bool, list[str]]:
    """(independent?, names) of one layer, drawn (``·``/``|``) or contracted (``:``/``|``)."""
    return "|" in text, [n for n in re.split(r"\s*[·:|]\s*", text.strip(" ·:|")) if n]


def drawn_runtime_layers() -> list[tuple[bool, list[str]]]:
    layers: list[str] = []
    for line in block_lines(section("The runtime, layer by layer")):
        indent = len(line) - len(line.lstrip())
        left = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        if indent == 4:
            layers.append(left)
        elif indent == 6:
            layers[-1] += " " + left
    return [split_layer(layer) for layer in layers]


def test_the_layer_drawing_is_the_contract() -> None:
    contract = [split_layer(layer) for layer in CONTRACTS["runtime-layers"]["layers"]]
    drawn = drawn_runtime_layers()
    assert [set(names) for _, names in drawn] == [set(names) for _, names in contract], (
        f"drawn: {drawn}\ncontract: {contract}")
    assert [independent for independent, _ in drawn] == [independent for independent, _ in contract]
    top = {p.stem if p.is_file() else p.name for p in RUNTIME.iterdir()
           if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    layered = {name for _, names in contract for name in names}
    assert top == layered, (f"in the runtime but in no layer: {sorted(top - layered)}; "
                            f"in a layer but not in the runtime: {sorted(layered - top)}")


def test_every_rule_names_contracts_and_every_contract_has_a_rule() -> None:
    rules = re.findall(r"^\d+\. (.*?):", section("The layer rules"), re.M)
    named = [set(re.findall(r"`([a-z]+(?:-[a-z]+)+)`", rule)) for rule in rules]
    assert all(named), f"a rule names no contract: {rules}"
    assert set().union(*named) == set(CONTRACTS), (
        f"contracts without a rule: {sorted(set(CONTRACTS) - set().union(*named))}; "
        f"rules naming no contract: {sorted(set().union(*named) - set(CONTRACTS))}")


def test_the_package_map_is_the_tree() -> None:
    rows = [line.split("|")[1:4] for line in section("The runtime, layer by layer").splitlines()
            if line.startswith("| `")]
    assert rows, "the package map table was not found"
    named: set[str] = set()
    for first, _, open_first in rows:
        for path in re.findall(r"`([^`]+)`", first) + re.findall(r"`([^`]+\.py|[^`]+/)`", open_first):
            where = REPO / "runtime" / path if path.startswith("agent_saga/") else RUNTIME / path
            assert where.exists(), f"docs/architecture.md names {path}, which does not exist"
            named.add(path)
    packages = {f"{p.name}/" for p in RUNTIME.iterdir() if (p / "__init__.py").exists()}
    assert packages <= named, f"packages missing from the map: {sorted(packages - named)}"
    drawn = {re.split(r"\s{2,}", line.strip())[0] for line in block_lines(section("The controls"))
             if len(line) - len(line.lstrip()) == 6}
    controls = RUNTIME / "controls"
    tree = {f"{p.name}/" if p.is_dir() else p.name for p in controls.iterdir()
            if (p / "__init__.py").exists() or (p.suffix == ".py" and p.name != "__init__.py")}
    assert drawn == tree, f"controls/ drawn: {sorted(drawn)}; in the tree: {sorted(tree)}"


def test_the_test_folders_named_exist() -> None:
    tests = section("Where the tests are")
    unit = tests[tests.index("tests/unit/"):tests.index("tests/integration/")]
    folders = set(re.findall(r"\b([a-z_0-9]+)/", unit.replace("tests/unit/", "")))
    assert folders, "no folder named for tests/unit"
    missing = sorted(f for f in folders if not (REPO / "tests" / "unit" / f).is_dir())
    assert not missing, f"docs/architecture.md names tests/unit folders that do not exist: {missing}"


# ------------------------------------------------------------------- the public surface


def runtime_modules() -> dict[str, bool]:
    """Every runtime module -> whether it is a package (entry points like __main__ left out)."""
    found = {}
    for path in RUNTIME.rglob("*.py"):
        parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            found[".".join(parts[:-1])] = True
        elif parts[-1] != "__main__":
            found[".".join(parts)] = False
    return found


MODULES = runtime_modules()


def is_implementation(module: str) -> bool:
    """The page's rule: a part starting with _, or a module inside a package (apart from
    the modules imported by their path)."""
    parts = module.split(".")
    if any(part.startswith("_") for part in parts[1:]):
        return True
    parent = ".".join(parts[:-1])
    return (not MODULES[module] and parent not in {"agent_saga", *BY_PATH}
            and module not in BY_PATH_MODULES)


def forbidden_by_contracts(module: str) -> bool:
    private = CONTRACTS["public-surface-private"]
    assert private["type"] == "private_modules" and private["packages_with_private_modules"] == ["agent_saga"]
    if any(part.startswith("_") and not part.startswith("__") for part in module.split(".")[1:]):
        return True
    parts = module.split(".")
    for pattern in CONTRACTS["public-surface-modules"]["forbidden_modules"]:
        wanted = pattern.split(".")
        if len(parts) >= len(wanted) and all(w in ("*", p) for w, p in zip(wanted, parts, strict=False)):
            return True
    return False


def test_the_contracts_forbid_exactly_what_the_page_calls_implementation() -> None:
    modules = CONTRACTS["public-surface-modules"]
    assert modules["type"] == "forbidden" and modules["allow_indirect_imports"] is True
    assert set(modules["source_modules"]) == set(OUTSIDE)
    rule = {m for m in MODULES if is_implementation(m)}
    contracts = {m for m in MODULES if forbidden_by_contracts(m)}
    assert rule == contracts, (
        f"implementation the contracts let through (prefix them with _, or add their package "
        f"to public-surface-modules): {sorted(rule - contracts)}; public modules the contracts "
        f"forbid: {sorted(contracts - rule)}")
    listed = set(re.findall(r"`([a-z]+)/`", re.search(r"The packages (.*?) predate the prefix",
                                                          section("The public surface"), re.S).group(1)))
    in_contract = {p.split(".")[1] for p in modules["forbidden_modules"]}
    assert listed == in_contract, f"the page lists {sorted(listed)}, the contract {sorted(in_contract)}"


def imports_from_outside() -> set[tuple[str, str]]:
    """(importer, runtime module) for every import in the operator, recoveryd, bench/, hack/."""
    found = set()
    for root_name, root in OUTSIDE.items():
        for path in root.rglob("*.py"):
            rel = path.relative_to(root).with_suffix("").parts
            importer = ".".join((root_name, *(p for p in rel if p != "__init__")))
            text = path.read_text()
            if "agent_saga" not in text:
                continue
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    targets = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                else:
                    continue
                found |= {(importer, t) for t in targets if t in MODULES}
    return found


def test_the_operator_recoveryd_bench_and_hack_use_only_public_names() -> None:
    allowed = {tuple(rule.split(" -> ")) for c in ("public-surface-private", "public-surface-modules")
               for rule in CONTRACTS[c].get("ignore_imports", []) if not rule.startswith("agent_saga")}
    used = imports_from_outside()
    assert any(importer.startswith("agent_saga_recoveryd") for importer, _ in used)  # not vacuous
    outside = sorted(f"{importer} -> {module}" for importer, module in used
                     if is_implementation(module) and (importer, module) not in allowed)
    assert not outside, f"imports of runtime implementation modules: {outside}"
