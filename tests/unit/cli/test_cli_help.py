"""Every `agent-saga` subcommand explains itself: a description, examples that parse, and
help on every flag; the operator's --help shows its defaults and examples."""

from __future__ import annotations

import argparse
import shlex

import pytest
from agent_saga.cli import build_parser
from agent_saga.cli.help_text import COMMANDS
from agent_saga_operator.__main__ import build_parser as operator_parser


def commands(parser: argparse.ArgumentParser, path: str = "") -> list[tuple[str, argparse.ArgumentParser]]:
    out: list[tuple[str, argparse.ArgumentParser]] = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                key = f"{path} {name}".strip()
                out += [(key, sub), *commands(sub, key)]
    return out


ALL = commands(build_parser())


def examples(sub: argparse.ArgumentParser) -> list[str]:
    lines = (sub.epilog or "").splitlines()
    assert lines and lines[0] == "examples:", sub.prog
    return [line.strip() for line in lines[1:] if line.strip()]


def test_the_table_and_the_parser_name_the_same_commands() -> None:
    assert {key for key, _ in ALL} == set(COMMANDS)
    assert len(ALL) >= 24


@pytest.mark.parametrize(("key", "sub"), ALL, ids=[k for k, _ in ALL])
def test_every_subcommand_has_a_description_examples_and_flag_help(key: str, sub: argparse.ArgumentParser) -> None:
    assert sub.description and len(sub.description) > 30, key
    undocumented = [a.option_strings or [a.dest] for a in sub._actions
                    if not a.help and not isinstance(a, argparse._SubParsersAction)]
    assert undocumented == [], f"agent-saga {key}: flags without help: {undocumented}"
    text = sub.format_help()
    assert "examples:\n  agent-saga " + key in text, text
    for example in examples(sub):
        # Each example is a real command line: it parses (the shell's `|| ...` and a
        # trailing comment aside).
        line = example.split(" #", 1)[0].split(" || ", 1)[0]
        argv = shlex.split(line)
        assert argv[0] == "agent-saga" and " ".join(argv[1:]).startswith(key), example
        build_parser().parse_args(argv[1:])


def test_top_level_help_says_what_the_cli_does() -> None:
    text = build_parser().format_help()
    for word in ("verify", "halt", "approval", "policies", "COMMAND --help"):
        assert word in text, word
    assert "examples:" in text


def test_status_says_its_namespace_is_a_redis_key_namespace() -> None:
    text = dict(ALL)["status"].format_help()
    assert "--limit-store-namespace" in text and "not a Kubernetes namespace" in " ".join(text.split())
    # The old spelling still works.
    assert build_parser().parse_args(["status", "--namespace", "x"]).namespace == "x"


def test_operator_help_shows_defaults_and_how_to_run_it_outside_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGENT_SAGA_REDIS_URL", "redis://:s3cret-pw@redis:6379/0")
    text = operator_parser().format_help()
    assert "(default: 60.0)" in text and "(default: agent-saga)" in text  # resync interval, peering
    assert "--kubeconfig ~/.kube/config" in text and "--standalone" in text
    assert "s3cret-pw" not in text  # a URL's default is never printed: it may carry a password
    undocumented = [a.dest for a in operator_parser()._actions if not a.help]
    assert undocumented == []
