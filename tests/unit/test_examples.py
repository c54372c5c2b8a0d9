"""The examples in examples/ run offline and end clean (they are what `make demo` runs)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["multi_domain.py", "chaos_demo.py", "crash_recovery.py", "kill_switch.py"])
def test_example_runs_and_ends_clean(name: str) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout.rstrip().endswith("clean") and "NOT CLEAN" not in r.stdout


def test_multi_domain_shows_lifo_rollback() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "multi_domain.py")],
                       capture_output=True, text=True, timeout=120)
    lines = r.stdout.splitlines()
    undo = [ln.split("]")[0].strip(" [") for ln in lines
            if any(w in ln for w in ("closed", "deleted namespace", "terminated"))]
    assert undo == ["github", "jira", "pinecone", "aws"]  # newest first


@pytest.mark.parametrize("name", ["multi_domain.py", "chaos_demo.py", "crash_recovery.py", "kill_switch.py"])
def test_examples_use_public_names_only(name: str) -> None:
    import ast

    import agent_saga

    tree = ast.parse((ROOT / "examples" / name).read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent_saga"):
            assert node.module == "agent_saga", f"{name}:{node.lineno} imports from {node.module}"
            for alias in node.names:
                assert alias.name in agent_saga.__all__, f"{name}:{node.lineno}: {alias.name} is not public"
        if isinstance(node, ast.Import):
            for alias in node.names:
                assert not alias.name.startswith("agent_saga."), f"{name}:{node.lineno} imports {alias.name}"


def test_the_big_document_example_uses_public_names_only() -> None:
    """Its routing and context names come from their public packages (``__all__``)."""
    import ast
    import importlib

    public = ("agent_saga", "agent_saga.routing", "agent_saga.contextbroker")
    tree = ast.parse((ROOT / "examples" / "small_model_big_docs.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("agent_saga"):
            assert node.module in public, f"line {node.lineno} imports from {node.module}"
            names = importlib.import_module(node.module).__all__
            for alias in node.names:
                assert alias.name in names, f"line {node.lineno}: {alias.name} is not public in {node.module}"


def test_the_big_document_example_ends_clean_and_shows_every_layer() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "examples" / "small_model_big_docs.py")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout
    assert out.rstrip().endswith("clean") and "NOT CLEAN" not in out
    assert "document: 440,000 characters" in out
    assert "whole document in one call: refused: context window 2048 tokens" in out
    assert out.count("   DONE after") == 3 and "STALLED after" in out and "3 compensated" in out
    assert "evicted=['chunk-" in out and out.count("(matches the document)") == 3
