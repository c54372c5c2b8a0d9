"""Where the gate's SagaPolicies come from: a source it asks on every decision.

    gate = PreFlightGate(policy=RedisPolicySource(url, agent="payments-agent", namespaces=["payments"], grace=30))
    gate = PreFlightGate(policy=StaticPolicySource.from_file("saga-policy.json", agent="payments-agent"))
    set_policy_source(source)     # what every PreFlightGate() built without policy= uses

A source answers ``view()`` from memory (the hot path): the ``PolicySet`` in force for
its agent, whether it may be used, and why not. ``record(request)`` notes a call an
Observe-mode policy governs (the tool surface ``agent-saga policy skeleton`` reads).

Invariants:
- ``view()`` does no I/O and never raises; an unusable view makes the gate refuse every
  call (fail closed), naming ``problem``.
- The process-wide source is ``None`` until ``set_policy_source`` (the policy-plane
  wiring sets it): no policy means the code's declarations, as before.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ...errors import ConfigurationError
from ...gates import StepRequest
from ._evaluation import PolicyInForce, PolicySet
from ._files import load_policy_file
from ._model import SagaPolicy
from ._skeleton import surface_entry_doc

__all__ = ["PolicySource", "PolicyView", "StaticPolicySource", "SurfaceLog", "get_policy_source",
           "set_policy_source"]


@dataclass(frozen=True, slots=True)
class PolicyView:
    """What a source holds now: ``policies`` for its agent (empty: none applies),
    ``usable`` False (never read, or lost for longer than the grace window) with the
    ``problem``; ``degraded`` says the last known policies are kept while the plane is
    unreachable (within the grace window)."""

    policies: PolicySet
    usable: bool = True
    problem: str | None = None
    degraded: str | None = None


@runtime_checkable
class PolicySource(Protocol):
    """Where a gate's SagaPolicies come from (see the module doc)."""

    def view(self) -> PolicyView: ...

    def describe(self) -> str: ...

    def record(self, request: StepRequest) -> None: ...


class SurfaceLog:
    """The tool surface seen by an Observe-mode policy, accumulated in memory until the
    source writes it (names, semantics and policy argument names; never values)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, tuple[str, set[str], int, float]] = {}
        self.seen: dict[str, dict[str, Any]] = {}

    def add(self, request: StepRequest) -> None:
        now = time.time()
        with self._lock:
            sem, names, calls, first = self._pending.get(request.tool, ("", set(), 0, now))
            self._pending[request.tool] = (request.semantics.value, names | set(request.policy_args), calls + 1,
                                           first)

    def drain(self) -> list[dict[str, Any]]:
        """The entries accumulated since the last drain (``surface_entry_doc`` form)."""
        with self._lock:
            pending, self._pending = self._pending, {}
        now = time.time()
        out = [surface_entry_doc(tool, semantics=sem, policy_args=names, now=now, first_seen=first, calls=calls)
               for tool, (sem, names, calls, first) in sorted(pending.items())]
        for e in out:
            self.seen[e["tool"]] = e
        return out

    def restore(self, entries: Iterable[dict[str, Any]]) -> None:
        """Put back entries a failed write did not store (they are written next time)."""
        with self._lock:
            for e in entries:
                sem, names, calls, first = self._pending.get(e["tool"], (e["semantics"], set(), 0, e["firstSeen"]))
                self._pending[e["tool"]] = (sem, names | set(e["policyArgs"]), calls + e["calls"],
                                            min(first, e["firstSeen"]))


@dataclass
class StaticPolicySource:
    """Policies fixed at construction (a reviewed file, a test): always usable."""

    policies: Sequence[PolicyInForce]
    agent: str = "agent"
    surface: SurfaceLog = field(default_factory=SurfaceLog)

    def __post_init__(self) -> None:
        self._view = PolicyView(PolicySet(self.policies, agent=self.agent, version=1))

    @classmethod
    def of(cls, policy: SagaPolicy, *, agent: str = "agent", id: str = "policy") -> StaticPolicySource:
        """One policy, named ``id`` in verdicts."""
        return cls([PolicyInForce(id, policy)], agent=agent)

    @classmethod
    def from_file(cls, path: str | Path, *, agent: str = "agent") -> StaticPolicySource:
        """The policy in a file (JSON policy file or SagaPolicy manifest), named by its path."""
        return cls.of(load_policy_file(path), agent=agent, id=str(path))

    def view(self) -> PolicyView:
        return self._view

    def describe(self) -> str:
        return f"StaticPolicySource({', '.join(p.id for p in self.policies) or 'no policy'})"

    def record(self, request: StepRequest) -> None:
        self.surface.add(request)


_lock = threading.Lock()
_default: PolicySource | None = None


def set_policy_source(source: PolicySource | None) -> PolicySource | None:
    """Make ``source`` the one every ``PreFlightGate`` built without ``policy=`` asks;
    return the previous one. ``None``: no SagaPolicy (the code's declarations)."""
    global _default
    if source is not None and not isinstance(source, PolicySource):
        raise ConfigurationError(f"set_policy_source() takes a policy source (RedisPolicySource, "
                                 f"StaticPolicySource), got {source!r}")
    with _lock:
        prev, _default = _default, source
    return prev


def get_policy_source() -> PolicySource | None:
    """The process-wide policy source, or ``None``."""
    return _default
