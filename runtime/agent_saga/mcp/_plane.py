"""``--policy-from-plane NS/NAME``: one SagaPolicy resource, read live from the policy plane.

The proxy connects this process to the policy plane (``AGENT_SAGA_REDIS_URL``, as any
agent: kill switch, limits, approvals and SagaPolicies of the namespace ``NS``) and
enforces the one SagaPolicy ``NS/NAME`` — reloaded when it changes, with the plane's
grace window when Redis is unreachable.

Invariant: fails closed. A policy that is not in the plane (not applied yet, deleted, or
not governing this agent by its ``appliesTo``) makes every call refused, naming it; the
proxy never falls back to another policy or to none.
"""

from __future__ import annotations

import os

from ..controls.policy import PolicySet, PolicySource, PolicyView
from ..errors import ConfigurationError
from ..gates import StepRequest

__all__ = ["OnePolicy", "plane_policy"]


class OnePolicy:
    """The view of ``inner`` narrowed to the policy ``policy_id`` (``NS/NAME``)."""

    def __init__(self, inner: PolicySource, policy_id: str, agent: str) -> None:
        self.inner = inner
        self.policy_id = policy_id
        self.agent = agent
        self._cache: tuple[int, PolicyView] | None = None

    def view(self) -> PolicyView:
        """The inner view with only ``policy_id`` in it; unusable when it is missing."""
        v = self.inner.view()
        if not v.usable:
            return v
        cached = self._cache
        if cached is not None and cached[0] == v.policies.version and not v.degraded:
            return cached[1]
        chosen = [p for p in v.policies.policies if p.id == self.policy_id]
        if not chosen:
            out = PolicyView(PolicySet((), agent=self.agent), usable=False, problem=(
                f"SagaPolicy {self.policy_id} is not in the policy plane for agent {self.agent} (not applied, deleted, "
                f"or its appliesTo does not match): kubectl apply it, or fix --agent"))
        else:
            out = PolicyView(PolicySet(chosen, agent=self.agent, version=v.policies.version), degraded=v.degraded)
        self._cache = (v.policies.version, out)
        return out

    def describe(self) -> str:
        """Which policy, from where."""
        return f"SagaPolicy {self.policy_id} from {self.inner.describe()}"

    def record(self, request: StepRequest) -> None:
        """Note a call an Observe-mode policy governs (the inner source records it)."""
        self.inner.record(request)


def plane_policy(ref: str, agent: str) -> OnePolicy:
    """Connect to the policy plane and narrow its SagaPolicies to ``ref`` (``NS/NAME``).
    Raises ``ConfigurationError`` naming the fix."""
    ns, _, name = ref.partition("/")
    if not ns or not name or "/" in name:
        raise ConfigurationError(f"--policy-from-plane {ref!r}: name the SagaPolicy as NAMESPACE/NAME "
                                 f"(payments/payments-agent)")
    url = os.environ.get("AGENT_SAGA_REDIS_URL", "").strip()
    if not url:
        raise ConfigurationError("--policy-from-plane reads the policy plane: set AGENT_SAGA_REDIS_URL (the chart "
                                 "hands it to agent pods), or use --policy FILE")
    from ..plane import ENV_AGENT, ENV_NAMESPACE, plane_from_env

    os.environ.setdefault(ENV_NAMESPACE, ns)
    os.environ.setdefault(ENV_AGENT, agent)
    if os.environ[ENV_NAMESPACE] != ns:
        raise ConfigurationError(f"--policy-from-plane {ref} is in namespace {ns}, but {ENV_NAMESPACE}="
                                 f"{os.environ[ENV_NAMESPACE]}: a process reads one namespace's policies; make "
                                 f"them agree")
    conn = plane_from_env()
    if conn is None:  # pragma: no cover - the URL is set
        raise ConfigurationError("the policy plane could not be connected")
    return OnePolicy(conn.policy, ref, conn.settings.agent)
