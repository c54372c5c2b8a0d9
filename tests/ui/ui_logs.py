"""Logs written by the engine for real, for the debugger's tests.

``build_log(dir)`` writes one FileWAL log holding, in this order:

- ``crashed-order``: an agent process (``python ui_logs.py --agent WAL READY``) charges
  twice and is SIGKILLed inside its third call; a ``RecoveryDaemon`` then compensates it;
- ``checkout-rollback``: two charges, then a step that raises: rolled back LIFO;
- ``wire-approved``: an IRREVERSIBLE wire approved by a human through the approval store;
- ``wire-halted``: a wire refused by the kill switch (KILL_SWITCH_ENGAGED in the log);
- ``frozen-saga``: quarantined by the kill switch after one charge;
- ``xss-saga``: a tool name, kwargs and tags carrying HTML and script;
- ``erased-saga``: completed, then its records redacted (``agent-saga redact``'s code).

``tamper(src, dst)`` copies a log and alters one record's payload in place.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from agent_saga import (
    ActionSemantics,
    Compensation,
    FileWAL,
    RecoveryDaemon,
    compensator,
    saga_scope,
)
from agent_saga.audit.redaction import redact_records, saga_seqs
from agent_saga.controls import (
    ApprovalGateway,
    ApprovalPolicy,
    EscalationLevel,
    FileApprovalStore,
    FileSwitchStore,
    KillSwitch,
    PreFlightGate,
)
from agent_saga.controls.approvals import decide_request

C = ActionSemantics.COMPENSABLE
I = ActionSemantics.IRREVERSIBLE  # noqa: E741
XSS_TOOL = "<img src=x onerror=\"window.__xss='tool'\">"
XSS_ARG = "</div><script>window.__xss='kwargs'</script>"
XSS_TAG = "<b onmouseover=\"window.__xss='tag'\">tag</b>"
CREDENTIAL_REF = "vault://payments/stripe-key"  # a reference: what the log may hold
LEAKED = "hunter2-s3cr3t"  # a password in an error message: scrubbed before it is written
REFUNDS: list[str] = []


@compensator("ui.refund")
def refund(charge_id: str, idempotency_key: str) -> None:
    REFUNDS.append(idempotency_key)


def _undo(result: Any) -> Compensation:
    return Compensation(handler="ui.refund", kwargs={"charge_id": result["id"]})


async def _agent(wal_path: str, ready: str) -> None:
    """The process that is killed: two charges, then a call that never returns."""

    def hang() -> None:
        Path(ready).write_text("in flight")
        time.sleep(60)  # SIGKILL arrives here

    wal = FileWAL(wal_path)
    async with saga_scope(wal, saga_id="crashed-order", lease_seconds=0.5) as saga:
        for n in (1, 2):
            await saga.execute("bank.charge", C, lambda n=n: {"id": f"ch_{n}"}, _undo,
                               policy_args={"amount": 1000 * n})
        await saga.execute("bank.transfer", C, hang, _undo, policy_args={"amount": 5})


def _crash_and_recover(wal_path: Path) -> None:
    ready = wal_path.with_suffix(".ready")
    child = subprocess.Popen([sys.executable, __file__, "--agent", str(wal_path), str(ready)],
                             stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert child.poll() is None, child.communicate()[1]
        assert time.monotonic() < deadline, "the agent never reached its third call"
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    child.stderr.close()  # type: ignore[union-attr]
    daemon = RecoveryDaemon(wal_path, lease_grace=0.1)
    deadline = time.monotonic() + 30
    while not asyncio.run(daemon.sweep()).results:  # the lease runs out, then it recovers
        assert time.monotonic() < deadline, "the recovery daemon never took the saga over"
        time.sleep(0.05)


async def _in_process(wal_path: Path, tmp: Path) -> None:
    wal = FileWAL(wal_path)
    try:
        try:
            async with saga_scope(wal, saga_id="checkout-rollback", tags=["checkout"]) as saga:
                await saga.execute("stripe.charge", C, lambda: {"id": "ch_a"}, _undo,
                                   policy_args={"amount": 4200, "credential_ref": CREDENTIAL_REF})
                await saga.execute("stripe.charge", C, lambda: {"id": "ch_b"}, _undo, policy_args={"amount": 9900})
                await saga.execute("shipping.book", C, _boom, _undo, policy_args={"carrier": "ups"})
        except RuntimeError:
            pass

        store = FileApprovalStore(tmp / "approvals")

        class Human:  # answers through the store, as a web process would
            async def notify(self, notice: Any) -> None:
                decide_request(store, notice.request.id, approved=True, approver="risk@corp",
                               now=notice.request.requested_at + 1, note="verified by phone")

        gateway = ApprovalGateway(store, Human(), wal, ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),)),
                                  poll=0.01)
        async with saga_scope(wal, PreFlightGate(approval_provider=gateway), saga_id="wire-approved") as saga:
            await saga.execute("wire.send", I, lambda: None, policy_args={"amount": 80_000, "to": "acct_9"})

        switch = KillSwitch(FileSwitchStore(tmp / "switch", warn=False), wal=wal)
        switch.halt("tool:wire.send", reason="fraud pattern", by="soc@corp")
        try:
            async with saga_scope(wal, PreFlightGate(default_rules=(), checks=[switch]), saga_id="wire-halted") as saga:
                await saga.execute("wire.send", I, lambda: None, policy_args={"amount": 10})
        except Exception as exc:  # GateBlocked
            assert type(exc).__name__ == "GateBlocked", exc
        try:
            async with saga_scope(wal, PreFlightGate(default_rules=(), checks=[switch]), saga_id="frozen-saga") as saga:
                await saga.execute("stripe.charge", C, lambda: {"id": "ch_f"}, _undo)
                switch.quarantine("frozen-saga", reason="suspected duplicate charges", by="soc@corp")
                await saga.execute("stripe.charge", C, lambda: {"id": "ch_g"}, _undo)
        except Exception as exc:  # SagaQuarantined
            assert type(exc).__name__ == "SagaQuarantined", exc

        async with saga_scope(wal, saga_id="xss-saga", tags=[XSS_TAG]) as saga:
            await saga.execute(XSS_TOOL, C, lambda: {"id": "ch_x"}, _undo, policy_args={"note": XSS_ARG})

        async with saga_scope(wal, saga_id="erased-saga") as saga:
            await saga.execute("crm.update", C, lambda: {"id": "c_1"}, _undo, policy_args={"email": "ann@example.com"})
    finally:
        wal.close()


def _boom() -> None:
    raise RuntimeError(f"the carrier is down (https://ops:{LEAKED}@carrier.example/api)")


def build_log(tmp: Path) -> Path:
    """The log described in the module doc; returns its path."""
    wal_path = tmp / "agent.wal"
    _crash_and_recover(wal_path)
    asyncio.run(_in_process(wal_path, tmp))
    redact_records(str(wal_path), saga_seqs(str(wal_path), "erased-saga"), reason="ERASURE-77")
    return wal_path


def tamper(src: Path, dst: Path, saga: str) -> int:
    """Copy ``src`` to ``dst`` with the first STEP_COMMITTED of ``saga`` altered; its line number."""
    lines = src.read_bytes().splitlines(keepends=True)
    for n, line in enumerate(lines):
        d = json.loads(line)
        if d["saga"] == saga and d["type"] == "STEP_COMMITTED":
            lines[n] = line.replace(b'"ch_a"', b'"ch_z"', 1)
            assert lines[n] != line
            dst.write_bytes(b"".join(lines))
            return n + 1
    raise AssertionError(f"no STEP_COMMITTED of {saga} in {src}")


def start_build(tmp: Path) -> subprocess.Popen[str]:
    """``build_log`` in a fresh interpreter (a test process may already run an event loop),
    started now so the caller can do other work meanwhile; ``finish_build`` waits for it."""
    return subprocess.Popen([sys.executable, __file__, "--build", str(tmp)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)


def finish_build(proc: subprocess.Popen[str], tmp: Path) -> Path:
    """Wait for ``start_build``'s process; the log's path."""
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    return tmp / "agent.wal"


if __name__ == "__main__" and sys.argv[1:2] == ["--agent"]:
    asyncio.run(_agent(sys.argv[2], sys.argv[3]))
elif __name__ == "__main__" and sys.argv[1:2] == ["--build"]:
    build_log(Path(sys.argv[2]))
