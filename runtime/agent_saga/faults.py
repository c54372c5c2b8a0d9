"""Named fault-injection points: crash the process at a commit boundary, on purpose.

    AGENT_SAGA_FAULT=recovery.after_compensation        os._exit(137) at the first hit
    AGENT_SAGA_FAULT=recovery.after_compensation:50     ... at the 50th hit
    AGENT_SAGA_FAULT=codemod.mid_merge:2:sigkill        SIGKILL itself at the 2nd hit

A call ``fault_point("recovery.after_compensation")`` is a no-op unless the environment
variable names that point when the module is first imported. Crash tests set it in the
child process they are about to kill; nothing else should.

Invariants:
- The variable is read once, at import: a disabled point costs one comparison against a
  module constant and never touches ``os.environ``.
- A triggered point calls ``os._exit(137)`` (or, with ``:sigkill``, sends itself SIGKILL): no ``atexit``, no ``finally``, no flush of any
  WAL queue. Whatever holds afterwards holds because the design is right.
- Points are named ``<component>.<boundary>``; the points that exist are listed in
  ``POINTS`` (a test pins that every name used in the code is listed).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Final

__all__ = ["ENV_FAULT", "POINTS", "fault_point"]

ENV_FAULT: Final = "AGENT_SAGA_FAULT"

#: Every named point, with the state a crash there leaves behind.
POINTS: Final[dict[str, str]] = {
    "recovery.after_claim": "a daemon holds a claim and has written nothing",
    "recovery.before_compensation": "COMPENSATION_STARTED durable, the handler not called",
    "recovery.after_compensation": "the handler returned; neither the ledger nor the WAL says so",
    "recovery.after_ledger": "the ledger says done; the WAL has no COMPENSATION_DONE",
    "recovery.before_terminal": "every step resolved; no terminal record for the saga",
    "recovery.before_release": "the terminal record durable; the saga not journaled, its claim held until it expires",
    "recovery.after_release": "the saga journaled and its claim released in one request; not reported",
    "codemod.before_merge": "the edit is verified in the shadow; the target is untouched",
    "codemod.mid_merge": "some of the verified files are written into the target, not all",
    "codemod.after_merge": "the target is at the verified commit; the step is not committed",
    "codemod.after_complete": "the codemod's saga is complete: the change stands",
}


def _parse(value: str | None) -> tuple[str | None, int, bool]:
    if not value:
        return None, 0, False
    name, _, rest = value.partition(":")
    nth, _, mode = rest.partition(":")
    try:
        count = int(nth) if nth else 1
    except ValueError:
        count = 1
    return name.strip() or None, max(count, 1), mode.strip() == "sigkill"


_TARGET, _NTH, _SIGKILL = _parse(os.environ.get(ENV_FAULT))
_hits = 0


def fault_point(name: str) -> None:
    """Crash with ``os._exit(137)`` if ``$AGENT_SAGA_FAULT`` names this point (see the
    module doc); otherwise do nothing."""
    global _hits
    if _TARGET is None or name != _TARGET:
        return
    _hits += 1
    if _hits >= _NTH:
        sys.stderr.write(f"agent-saga: fault point {name} hit ({_hits}): exiting 137\n")
        sys.stderr.flush()
        if _SIGKILL:
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(137)
