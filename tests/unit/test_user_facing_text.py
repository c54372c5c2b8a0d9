"""What users read speaks to users: no internal notes, issue numbers or files we don't ship.

Covered: README.md, docs/, examples/, the Helm chart (every file), the generated CRDs
(descriptions and validation messages: what `kubectl explain` and `kubectl apply` show),
the help of `agent-saga` and `kubectl saga` (every subcommand), `agent-saga-operator` and
`agent-saga-recoveryd`. Refused in all of them: "the brief", an issue or pull request
number, the project's internal design notes (DESIGN.md, STYLE.md), and a repository path
that does not exist. CRD descriptions and CLI help are plain text: no RST ``markup``.
And every example object names its namespace (an object in `default` governs nobody).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agent_saga.cli import build_parser
from agent_saga.kubectl import build_parser as kubectl_parser
from agent_saga_operator import crdgen
from agent_saga_operator.__main__ import build_parser as operator_parser
from agent_saga_operator.models import KINDS
from agent_saga_recoveryd.config import build_parser as recoveryd_parser

ROOT = Path(__file__).resolve().parents[2]
TOP_DIRS = ("runtime", "operator", "recoveryd", "docs", "tests", "hack", "charts", "examples", "crds", "bench")

FORBIDDEN = [
    (re.compile(r"\bthe brief\b|\bbrief's\b", re.I), "mentions the brief"),
    (re.compile(r"\b(issues?|PR|pull request)\s*#?\d+\b", re.I), "cites an issue number"),
    (re.compile(r"(?<![\w-])#\d{1,5}\b(?!\s*[-:]?\s*[0-9a-f]{2})"), "cites an issue number"),
    (re.compile(r"\b(DESIGN|STYLE)\.md\b"), "cites an internal design note"),
]
REPO_PATH = re.compile(rf"(?<![\w/.$-])((?:{'|'.join(TOP_DIRS)})/[\w./*-]*[\w*])")
MARKDOWN_FILE = re.compile(r"(?<![\w/.-])([\w-]+\.md)\b")
RST = re.compile(r"``")


def problems(text: str, *, plain: bool = False) -> list[str]:
    """What in ``text`` a user should not read (``plain``: no RST markup either)."""
    found = [f"{why}: {m.group(0)!r}" for pattern, why in FORBIDDEN for m in pattern.finditer(text)]
    for m in REPO_PATH.finditer(text):
        path = m.group(1).rstrip(".")
        if not (ROOT / path).exists() and not any(ROOT.glob(path)):
            found.append(f"names a file that is not shipped: {path}")
    for m in MARKDOWN_FILE.finditer(text):
        name = m.group(1)
        if not any((d / name).exists() for d in (ROOT, ROOT / "docs", ROOT / "docs" / "runbooks")):
            found.append(f"names a document that is not shipped: {name}")
    if plain:
        found += [f"RST markup: {m.group(0)!r}" for m in RST.finditer(text)]
    return found


def _text_files() -> Iterator[Path]:
    yield ROOT / "README.md"
    for base in ("docs", "examples", "charts"):
        for path in sorted((ROOT / base).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts and path.suffix not in (".pyc", ".png"):
                yield path


FILES = list(_text_files())


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_docs_examples_and_chart_speak_to_users(path: Path) -> None:
    assert problems(path.read_text()) == []


def _strings(node: Any, keys: tuple[str, ...]) -> Iterator[str]:
    if isinstance(node, dict):
        for k, v in node.items():
            if k in keys and isinstance(v, str):
                yield v
            else:
                yield from _strings(v, keys)
    elif isinstance(node, list):
        for v in node:
            yield from _strings(v, keys)


@pytest.mark.parametrize("model", KINDS, ids=[m.info.kind for m in KINDS])
def test_crd_descriptions_and_messages_speak_to_users(model: Any) -> None:
    crd = crdgen.crd_for(model)
    texts = list(_strings(crd, ("description", "message", "messageExpression")))
    assert len(texts) > 10
    assert [(t, p) for t in texts for p in problems(t, plain=True)] == []


def _parsers() -> Iterator[tuple[str, argparse.ArgumentParser]]:
    def walk(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
        yield parser.prog, parser
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from walk(sub)

    yield from walk(build_parser())
    yield from walk(kubectl_parser())
    yield "agent-saga-operator", operator_parser()
    yield "agent-saga-recoveryd", recoveryd_parser()


PARSERS = list(_parsers())


@pytest.mark.parametrize(("prog", "parser"), PARSERS, ids=[p for p, _ in PARSERS])
def test_cli_help_speaks_to_users(prog: str, parser: argparse.ArgumentParser) -> None:
    assert problems(parser.format_help(), plain=True) == []


@pytest.mark.parametrize("text", [
    "as the brief specifies", "(the brief's kill switch)", "fixed in issue 6", "see #17",
    "DESIGN.md §2", "see docs/nothing-here.md", "runtime/agent_saga/gone.py", "read OLD-NOTES.md",
])
def test_the_checker_catches_what_it_refuses(text: str) -> None:
    assert problems(text)


@pytest.mark.parametrize("text", [
    "RFC 6962 §2.1.2", "docs/install.md", "color #ff0000", "examples/k8s/killswitch.yaml", "step 1 of 2",
])
def test_the_checker_passes_what_users_may_read(text: str) -> None:
    assert problems(text) == []


def test_crd_rst_markup_is_refused() -> None:
    assert problems("a map keyed by ``type``", plain=True)


@pytest.mark.parametrize("path", sorted((ROOT / "examples" / "k8s").glob("*.yaml")),
                         ids=lambda p: p.name)
def test_every_example_object_names_its_namespace(path: Path) -> None:
    objs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    assert objs
    assert [o["metadata"]["name"] for o in objs if not o["metadata"].get("namespace")] == []
