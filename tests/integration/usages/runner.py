"""Run copied snippets and CLI command lines in one process; print one JSON line each.

    python runner.py code NAME ...          the snippets of snippets.USAGES, in order
    python runner.py cli 'agent-saga halt --scope tool:wire.send ...' ...

A snippet runs as a notebook cell (top-level await), in a namespace of its own after its
prelude; then its check. A command line runs through the installed CLI's ``main`` (the
console script's function), split as a shell splits it; its exit code and output are
reported. Run from a scratch directory, with only the installed package on the path.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import io
import json
import shlex
import sys
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from snippets import USAGES  # noqa: E402


async def _cell(source: str, ns: dict[str, Any], label: str) -> None:
    code = compile(source, label, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    out = eval(code, ns)  # noqa: S307 - the test's own snippets
    if asyncio.iscoroutine(out):
        await out


async def run_code(name: str) -> dict[str, Any]:
    usage = USAGES[name]
    ns: dict[str, Any] = {"__name__": f"usage_{name.replace('-', '_')}"}
    await _cell(usage.prelude, ns, f"<{name}: prelude>")
    error = ""
    try:
        await _cell(usage.code, ns, f"<{name}>")
    except BaseException as exc:  # noqa: BLE001 - reported
        error = "".join(traceback.format_exception_only(exc)).strip()
    checked = ""
    if usage.check and (not error or usage.fails_with):
        try:
            await _cell(usage.check, ns, f"<{name}: check>")
        except BaseException as exc:  # noqa: BLE001 - reported
            checked = "".join(traceback.format_exception(exc)).strip()
    from agent_saga import set_default_wal

    old = set_default_wal(None)  # the next snippet starts as a fresh notebook would
    if old is not None:
        old.close()
    return {"name": name, "error": error, "check_failed": checked}


def run_cli(line: str) -> dict[str, Any]:
    argv = shlex.split(line)
    prog, args = argv[0], argv[1:]
    if prog == "agent-saga":
        from agent_saga.cli import main
    else:
        raise SystemExit(f"not a CLI of the package: {prog}")
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(args)
        except SystemExit as exc:  # argparse: --help, usage errors
            code = exc.code if isinstance(exc.code, int) else 2
    return {"line": line, "code": code, "stdout": out.getvalue(), "stderr": err.getvalue()}


async def run_all_code(names: list[str]) -> None:
    import agent_saga

    print(json.dumps({"name": "(agent_saga)", "file": agent_saga.__file__}), flush=True)
    for name in names:
        print(json.dumps(await run_code(name)), flush=True)


def main(argv: list[str]) -> None:
    mode, items = argv[0], argv[1:]
    if mode == "code":
        asyncio.run(run_all_code(items))  # one loop, as one notebook kernel
        return
    for line in items:  # a command runs outside any loop, as from a shell
        print(json.dumps(run_cli(line)), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
