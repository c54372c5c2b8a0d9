"""The gate of a saga opened without one: the process's kill switch still applies.

``saga_scope()`` without ``gate=`` (and ``AgentKit`` without one) used to skip every
control, so a fleet-wide halt did not stop it. With a kill switch configured for the
process (``AGENT_SAGA_REDIS_URL``, ``AGENT_SAGA_SWITCH_STORE``, ``set_kill_switch``), such
a saga gets this gate: the process-wide kill switch and breaker, no limits, no
SagaPolicy, no approver — so an IRREVERSIBLE step is refused exactly as without a gate,
and every other step runs unless a lever (or an open breaker) refuses it.

With nothing configured the process-wide switch is the zero-setup default (a file beside
the default WAL, ``agent_saga.controls.killswitch.default_switch_path``): while it holds
no lever the answer is ``None`` (no gate: the zero-dependency fast path is unchanged, and
the engine asks again before each step, so a halt engaged mid-saga still stops the next
step); once a lever is in force, the gate.

Invariant: without a kill switch, or with an idle zero-setup one, the answer is ``None``;
the gate is built once per kill switch.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ...gates import set_no_gate_fallback
from .._wiring import from_environment
from ..killswitch import get_kill_switch, is_zero_setup

if TYPE_CHECKING:
    from ._gate import PreFlightGate

__all__ = ["kill_switch_gate"]

_lock = threading.Lock()
_cached: tuple[object, PreFlightGate] | None = None


def kill_switch_gate() -> PreFlightGate | None:
    """A gate consulting only the process-wide kill switch (and breaker), or ``None``
    when the process has no kill switch."""
    global _cached
    from_environment()
    switch = get_kill_switch()
    if switch is None or (is_zero_setup(switch) and switch.idle()):
        return None
    cached = _cached
    if cached is not None and cached[0] is switch:
        return cached[1]
    from ._gate import PreFlightGate  # only a process with a kill switch pays for the gate

    with _lock:
        gate = PreFlightGate(limits=(), approval_provider=None, policy=None)
        _cached = (switch, gate)
    return gate


set_no_gate_fallback(kill_switch_gate)
