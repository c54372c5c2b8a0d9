"""The operator's configuration (command line and environment), and its shared context."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent_saga.controls import LimitStoreUnavailable, LimitUsage, RedisLimitStore
from agent_saga.controls.approvals import ANY_APPROVER, DecisionSigner, TrustedKeys
from agent_saga.controls.limits import LimitSpec

from .projection import ProjectionUnavailable, Projector

__all__ = ["Context", "OperatorConfig", "UsageReader", "approval_keys", "check_admission", "judge_keys"]


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """Everything ``python -m agent_saga_operator`` takes (see ``--help``)."""

    redis_url: str
    kubeconfig: Path | None = None
    namespaces: tuple[str, ...] = ()
    key_prefix: str = "agentsaga"
    limit_store_namespace: str = "agent-saga"
    resync_interval: float = 60.0
    usage_interval: float = 10.0
    retry_delay: float = 2.0
    health_host: str = "0.0.0.0"
    health_port: int = 8080
    metrics_port: int = 9090
    peering_name: str = "agent-saga"
    standalone: bool = False
    priority: int = 0
    watch_server_timeout: int = 270
    watch_client_timeout: float = 300.0
    watch_connect_timeout: float = 10.0
    request_timeout: float = 30.0
    approval_poll_interval: float = 2.0
    marker_interval: float = 2.0
    ack_interval: float = 1.0
    #: Seconds after which a finished Approval is deleted (0: kept forever).
    approval_ttl_after_finished: float = 0.0
    #: The Ed25519 private key (PEM) the operator signs approval decisions with.
    approval_signing_key: Path | None = None
    #: The ValidatingAdmissionPolicy (and binding) that makes ``spec.approver`` the
    #: requesting user; checked at startup (``check_admission``).
    approver_admission: str | None = None
    #: More trusted approver public keys (a PEM file or a directory) to publish to agents:
    #: the keys of approvers who sign with ``agent-saga approvals approve --signing-key``.
    approval_keys: Path | None = None
    #: ``NAMESPACE/NAME`` of a ConfigMap the published keys are also written into
    #: (``keys_configmap``): agents mount it, so their trust survives a policy-plane data loss.
    approval_keys_configmap: str | None = None

    @property
    def clusterwide(self) -> bool:
        """True when no namespace is named: the operator watches every namespace."""
        return not self.namespaces


def approval_keys(config: OperatorConfig) -> tuple[DecisionSigner | None, dict[str, str]]:
    """The signer and the keys to publish that ``config`` names (``ConfigurationError``
    naming the file for a missing or malformed key, or a key bound to no approver name).
    Each published key carries its approver names (``Approver:`` lines before its PEM
    block); the operator's own key carries ``*``: it signs for the approver the API
    server authenticated."""
    signer = None if config.approval_signing_key is None else DecisionSigner.from_file(config.approval_signing_key)
    trusted = TrustedKeys(source="the operator's approver keys")
    if config.approval_keys is not None:
        trusted.update(TrustedKeys.from_path(config.approval_keys))
    published = {kid: trusted.pem(kid) for kid in trusted.key_ids}
    if signer is not None:
        published[signer.key_id] = signer.public_pem((ANY_APPROVER,))
    return signer, published


def judge_keys(published: dict[str, str]) -> TrustedKeys | None:
    """The keys the operator judges stored approvals by: exactly those it publishes
    (``None`` when it publishes none: agents then accept unsigned approvals)."""
    if not published:
        return None
    keys = TrustedKeys(source="the keys this operator publishes")
    for kid, pem in published.items():
        keys.add_pem(pem, where=f"approver key {kid}")
    return keys


def check_admission(api_client: Any, name: str) -> str | None:
    """Why the approver admission policy ``name`` is not in force (``None``: it is): the
    policy must exist and its binding of the same name must deny (``validationActions``
    with ``Deny``)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    api = client.AdmissionregistrationV1Api(api_client)
    try:
        api.read_validating_admission_policy(name)
        binding = api.read_validating_admission_policy_binding(name)
    except ApiException as e:
        return f"ValidatingAdmissionPolicy/binding {name} cannot be read ({e.status} {e.reason})"
    spec = binding.spec
    if spec is None or spec.policy_name != name or "Deny" not in (spec.validation_actions or []):
        return f"ValidatingAdmissionPolicyBinding {name} does not bind {name} with validationActions [Deny]"
    return None


class UsageReader:
    """Limit-window use read back from ``RedisLimitStore``, shared by every BudgetLimit.

    One ``usage`` call answers for every registered limit (the store returns all windows
    at once), made at most once per ``max_age`` seconds however many objects ask.
    """

    def __init__(self, store: RedisLimitStore, max_age: float) -> None:
        self.store = store
        self.max_age = max_age
        self._specs: dict[str, LimitSpec] = {}
        self._rows: dict[str, list[LimitUsage]] = {}
        self._at = float("-inf")
        self._lock = asyncio.Lock()

    def forget(self, name: str) -> None:
        """Stop tracking the resource ``name`` (it was deleted)."""
        self._specs.pop(name, None)
        self._rows.pop(name, None)

    async def read(self, spec: LimitSpec) -> list[LimitUsage]:
        """The non-empty windows of ``spec`` now (at most ``max_age`` old)."""
        async with self._lock:
            known = self._specs.get(spec.name)
            self._specs[spec.name] = spec
            if known != spec or time.monotonic() - self._at >= self.max_age:
                try:
                    rows = await self.store.usage(list(self._specs.values()))
                except LimitStoreUnavailable as e:
                    raise ProjectionUnavailable(str(e)) from e
                grouped: dict[str, list[LimitUsage]] = {}
                for r in rows:
                    grouped.setdefault(r.name, []).append(r)
                self._rows = grouped
                self._at = time.monotonic()
            return list(self._rows.get(spec.name, ()))


@dataclass(slots=True)
class Context:
    """What every handler shares (kept in kopf's ``memo.ctx``)."""

    config: OperatorConfig
    projector: Projector
    usage: UsageReader
    engaged: set[str] = field(default_factory=set)
    managed: dict[str, set[str]] = field(default_factory=dict)
    #: (kind, "<ns>/<name>") -> monotonic instant the last completed reconciliation began
    #: (``marker.SyncMarker`` waits for every resource to have one after a data loss).
    projected: dict[tuple[str, str], float] = field(default_factory=dict)
    #: ``<Kind> <ns>/<name>`` of the first document a periodic resync found changed and
    #: wrote again although its generation was already projected: the policy plane changed
    #: behind the operator (a restore, a hand edit). ``marker.SyncMarker`` takes it.
    drifted: str | None = None
    #: The agent heartbeats last read (``acks.Fleet``; None until the first read).
    fleet: Any = None
    #: (kind, "<ns>/<name>") -> ``acks.Tracked``: the resources whose status follows the
    #: heartbeats (KillSwitch, BudgetLimit, SagaPolicy, ModelRoute), and ``acks.Observed``:
    #: each one as kopf's watch last showed it (what the API server holds).
    tracked: dict[tuple[str, str], Any] = field(default_factory=dict)
    observed: dict[tuple[str, str], Any] = field(default_factory=dict)
    #: "<ns>/<name>" -> (use in the fullest window, cap): each BudgetLimit as last read back.
    budgets: dict[str, tuple[float, float]] = field(default_factory=dict)
    #: request id -> ``metrics.Waiting``: the approval requests pending in the policy plane
    #: that the Approval bridge mirrored (the state ``metrics.StateCollector`` exports).
    waiting: dict[str, Any] = field(default_factory=dict)
    #: Signs every decision the operator writes (``None``: unsigned; see docs/approvals.md).
    signer: DecisionSigner | None = None
    #: The approver public keys published for agents (key id -> PEM): the signer's and
    #: ``approval_keys``.
    published_keys: dict[str, str] = field(default_factory=dict)
    #: ``published_keys`` as the agents check them (``judge_keys``; ``None``: none).
    trusted: TrustedKeys | None = None
    #: The approver admission policy was found in force at startup (``check_admission``):
    #: a decision's ``spec.approver`` is then the user the API server authenticated.
    admission: bool = False

    @classmethod
    def create(cls, config: OperatorConfig) -> Context:
        """The context of a running operator: its projector and limit store for ``config``."""
        projector = Projector(config.redis_url, prefix=config.key_prefix)
        store = RedisLimitStore(config.redis_url, namespace=config.limit_store_namespace, compact=True)
        ctx = cls(config, projector, UsageReader(store, max_age=max(0.5, config.usage_interval / 2)))
        ctx.signer, ctx.published_keys = approval_keys(config)
        ctx.trusted = judge_keys(ctx.published_keys)
        return ctx

    async def aclose(self) -> None:
        """Close the Redis connections this context opened."""
        await self.projector.aclose()
        await self.usage.store.aclose()
