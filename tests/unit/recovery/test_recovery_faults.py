"""Named fault-injection points: a no-op unless the environment names them, then os._exit."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from agent_saga import faults

RUNTIME = Path(faults.__file__).resolve().parent


def test_every_point_used_in_the_code_is_listed() -> None:
    used = set()
    for path in RUNTIME.rglob("*.py"):
        used |= set(re.findall(r'fault_point\("([^"]+)"\)', path.read_text()))
    assert used and used <= set(faults.POINTS), used - set(faults.POINTS)


def test_a_point_fires_only_when_named_and_at_the_nth_hit() -> None:
    code = "from agent_saga.faults import fault_point as f\nfor i in range(5):\n    print(i, flush=True); f('recovery.after_claim')\n"
    env = {**os.environ, "AGENT_SAGA_FAULT": "recovery.after_claim:3"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 137 and out.stdout.split() == ["0", "1", "2"]
    env["AGENT_SAGA_FAULT"] = "recovery.something_else"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.split() == ["0", "1", "2", "3", "4"]
