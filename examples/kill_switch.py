"""The kill switch with nothing configured: `agent-saga halt` stops an agent running in
another process.

An agent process sends wires in one long saga, with no gate and no store configured. An
operator, in another process, runs the incident command exactly as typed:

    agent-saga halt --scope tool:wire.send --reason "fraud pattern" --by soc@corp

Both use the zero-setup kill switch (agent-saga.switch.json beside the default WAL), and
both warn that it stops THIS HOST ONLY: for a fleet, set AGENT_SAGA_SWITCH_STORE to a
redis:// URL or connect the policy plane (docs/killswitch.md). The agent's next step is
refused; nothing after the halt is sent.

Run: python examples/kill_switch.py   (or `make demo`)
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
import time

from agent_saga import ActionSemantics, GateBlocked, saga_scope

CONFIG = ("AGENT_SAGA_SWITCH_STORE", "AGENT_SAGA_REDIS_URL", "AGENT_SAGA_WAL_PATH", "AGENT_SAGA_WAL_STREAM")
HALT = ["halt", "--scope", "tool:wire.send", "--reason", "fraud pattern", "--by", "soc@corp"]


async def agent() -> None:
    """Send a wire every 20 ms until the kill switch refuses one (or a minute passes)."""
    deadline = time.monotonic() + 60
    async with saga_scope(name="wires") as saga:  # no gate=, no store: the zero-setup switch
        n = 0
        while time.monotonic() < deadline:
            try:
                await saga.execute("wire.send", ActionSemantics.REVERSIBLE, forward=lambda n=n: n)
            except GateBlocked as exc:
                print(f"refused by the {exc.control}: {exc.reason}", flush=True)
                raise
            n += 1
            print(f"sent wire {n}", flush=True)
            await asyncio.sleep(0.02)


def main() -> int:
    env = {k: v for k, v in os.environ.items() if k not in CONFIG}
    with tempfile.TemporaryDirectory() as here:
        proc = subprocess.Popen([sys.executable, __file__, "--agent"], cwd=here, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        with proc:
            assert proc.stdout is not None
            print(f"[agent]    {proc.stdout.readline().strip()}")
            print("[operator] $ agent-saga halt --scope tool:wire.send --reason \"fraud pattern\" --by soc@corp")
            halt = subprocess.run([sys.executable, "-m", "agent_saga.cli", *HALT], cwd=here, env=env,
                                  capture_output=True, text=True, timeout=60)
            for line in (halt.stderr + halt.stdout).splitlines():
                print(f"[operator]   {line}")
            last = ""
            for line in proc.stdout:
                last = line.strip()
                if not last.startswith("sent"):
                    break
            proc.wait(timeout=60)
        print(f"[agent]    {last}")
        ok = halt.returncode == 0 and last.startswith("refused by the kill_switch")
        print("kill switch: a halt from another process stopped the agent; clean" if ok else "NOT CLEAN")
        return 0 if ok else 1


if __name__ == "__main__":
    if sys.argv[1:] == ["--agent"]:
        try:
            asyncio.run(agent())
        except GateBlocked:
            sys.exit(0)
        sys.exit(1)
    sys.exit(main())
