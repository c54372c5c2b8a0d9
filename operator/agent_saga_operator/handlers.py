"""The kopf wiring: which handler runs when, and how its outcome becomes status and Events.

For each kind (``build_registry``):

    create / update(spec) / resume   reconcile: project into Redis, set status
    timer (resync)                   reconcile again: heals a Redis that lost its data,
                                     refreshes BudgetLimit use (every usage interval)
    daemon (KillSwitch ttl, Approval deadline)
                                     wakes at the instant it expires and reconciles
    event (every watch event)        what the API server holds now, for the acknowledgement
                                     tally (``AckAggregator.observe``): a status patch that
                                     undid the tally's is corrected at once
    delete (finalizer)               remove the document (KillSwitch, BudgetLimit,
                                     SagaPolicy, ModelRoute); a decided Approval stays
    startup                          settings: finalizer, progress in annotations, watch
                                     timeouts, peering; connects Redis; starts the
                                     Approval bridge (``bridge.ApprovalBridge``): pending
                                     requests become Approvals, decisions made elsewhere
                                     are reflected through ``reflect_approval``;
                                     starts the synced marker (``marker.SyncMarker``) and
                                     the acknowledgement tally (``acks.AckAggregator``):
                                     agent heartbeats become Acknowledged / Ready; with
                                     a TTL, the Approval janitor (``janitor``)
    probe                            /healthz reports Redis reachability (never fails on it)

Invariants:
- Status is written through the status subresource and only when it changed; Ready and
  Synced follow ``conditions.set_condition`` (transition time kept unless the status
  flips); ``observedGeneration`` is the generation just reconciled.
- An Event is posted on every Ready transition (status or reason changed), on a spec
  edit that changes what Ready says (a new scope), and on deletion; Warning only for a
  real problem (``conditions.WARNING_REASONS``: Invalid, RedisUnavailable, Conflict).
- A Redis failure sets Synced=False/RedisUnavailable and raises ``TemporaryError`` so
  kopf retries; an unenforceable spec sets Ready=False/Invalid and is not retried.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import kopf
from pydantic import ValidationError

from . import metrics
from .acks import AckAggregator, Observed
from .bridge import ApprovalBridge
from .conditions import READY, SYNCED, Cond, Reason, changed, event_type, find, set_condition
from .config import Context, OperatorConfig, check_admission
from .documents import Identity, InvalidSpec, killswitch_expiry, runtime_limit
from .janitor import ApprovalJanitor
from .marker import SyncMarker
from .models import GROUP, KINDS, VERSION, BudgetLimitSpec, KillSwitchSpec
from .projection import ProjectionUnavailable
from .reconcilers import RECONCILERS, SPEC_MODELS, Outcome, deadline_of, reconcile_approval

__all__ = ["FINALIZER", "build_registry", "reconcile", "reflect_approval"]

log = logging.getLogger("agent_saga_operator")

FINALIZER = f"{GROUP}/projection"
#: Who Events name as their source (`kubectl describe`'s "From").
REPORTING_COMPONENT = "agent-saga-operator"
ANNOTATION_PREFIX = GROUP
_PROJECTED_KINDS = ("KillSwitch", "BudgetLimit", "SagaPolicy", "ModelRoute")


def _now() -> datetime:
    return datetime.now(UTC)


def _status_patch(
    status: Mapping[str, Any], outcome: Outcome, generation: int, now: datetime
) -> tuple[dict[str, Any], Mapping[str, Any] | None, Mapping[str, Any] | None]:
    """The status fields that change, plus the old and new Ready conditions."""
    conds = set_condition(status.get("conditions"), outcome.synced, generation=generation, now=now)
    conds = set_condition(conds, outcome.ready, generation=generation, now=now)
    for extra in outcome.extra:
        conds = set_condition(conds, extra, generation=generation, now=now)
    new: dict[str, Any] = {**outcome.fields, "observedGeneration": generation, "conditions": conds}
    if outcome.rev:
        new["revision"] = outcome.rev
    diff = {k: v for k, v in new.items() if status.get(k) != v}
    return diff, find(status.get("conditions"), READY), find(conds, READY)


def _emit(body: kopf.Body, old: Mapping[str, Any] | None, new: Mapping[str, Any] | None,
          *, edited: bool = False) -> None:
    """An Event for a Ready transition; with ``edited`` (a spec change) also when only the
    message changed (a KillSwitch re-scoped from tool:a to tool:b stays Engaged)."""
    if new is None or not (changed(old, new) or (edited and old is not None and old.get("message") != new.get(
            "message"))):
        return
    kopf.event(body, type=event_type(new), reason=str(new["reason"]), message=str(new.get("message", "")))


async def reconcile(
    kind: str, trigger: str, *, body: kopf.Body, meta: Mapping[str, Any], spec: Mapping[str, Any],
    status: Mapping[str, Any], patch: kopf.Patch, ctx: Context,
) -> None:
    """Reconcile one object and write its status into ``patch`` (see the module doc)."""
    started = time.perf_counter()
    began = time.monotonic()
    now = _now()
    generation = int(meta.get("generation") or 0)
    status = dict(status or {})
    result = "ok"
    try:
        who = Identity.from_meta(meta)
        try:
            model = SPEC_MODELS[kind].model_validate(dict(spec))
            outcome = await RECONCILERS[kind](ctx, model, who, status, now)
        except (InvalidSpec, ValidationError) as e:
            result = "invalid"
            text = str(e).replace("\n", " ")
            outcome = Outcome(
                Cond(READY, "False", Reason.INVALID, f"not enforced: {text}"),
                Cond(SYNCED, "False", Reason.INVALID, "not projected: the spec cannot be enforced"),
            )
        except ProjectionUnavailable as e:
            result = "error"
            metrics.REDIS_ERRORS.labels(kind).inc()
            # Only Synced changes: what agents enforce is whatever was projected before,
            # and this generation has not been reconciled (observedGeneration stays).
            synced = Cond(SYNCED, "False", Reason.REDIS_UNAVAILABLE, f"{e}; retrying")
            conds = set_condition(status.get("conditions"), synced, generation=generation, now=now)
            if find(conds, READY) is None:
                conds = set_condition(conds, Cond(READY, "Unknown", Reason.REDIS_UNAVAILABLE,
                                                  "not projected yet: the policy plane is unreachable"),
                                      generation=generation, now=now)
            if conds != status.get("conditions"):
                patch.status["conditions"] = conds
            _emit(body, find(status.get("conditions"), SYNCED), find(conds, SYNCED))
            raise kopf.TemporaryError(str(e), delay=ctx.config.retry_delay) from e
        diff, old_ready, new_ready = _status_patch(status, outcome, generation, now)
        for k, v in diff.items():
            patch.status[k] = v
        _emit(body, old_ready, new_ready, edited=trigger == "update")
        if outcome.rev:
            metrics.PROJECTIONS.labels(kind, "put" if outcome.engaged is not False else "delete").inc()
            metrics.observe_lag(kind, meta, now)
            if trigger == "resync" and kind in _PROJECTED_KINDS and _was_projected(status, generation):
                ctx.drifted = ctx.drifted or f"{kind} {who.id}"
        _track(ctx, kind, who.id, outcome)
        ctx.projected[(kind, who.id)] = began
    except BaseException:
        if result == "ok":
            result = "error"
        raise
    finally:
        metrics.RECONCILES.labels(kind, trigger, result).inc()
        metrics.RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)


def _was_projected(status: Mapping[str, Any], generation: int) -> bool:
    """Did the status say this generation was in the policy plane before this run?"""
    synced = find(status.get("conditions"), SYNCED)
    return synced is not None and synced.get("status") == "True" and status.get("observedGeneration") == generation


def _track(ctx: Context, kind: str, id_: str, outcome: Outcome) -> None:
    ids = ctx.managed.setdefault(kind, set())
    ids.add(id_)
    metrics.OBJECTS.labels(kind).set(len(ids))
    if outcome.engaged is True:
        ctx.engaged.add(id_)
    elif outcome.engaged is False:
        ctx.engaged.discard(id_)
    metrics.KILLSWITCHES_ENGAGED.set(len(ctx.engaged))


async def remove(kind: str, *, body: kopf.Body, meta: Mapping[str, Any], spec: Mapping[str, Any],
                 ctx: Context) -> None:
    """Undo the projection of a deleted object (the finalizer's work)."""
    started = time.perf_counter()
    id_ = f"{meta['namespace']}/{meta['name']}"
    result = "ok"
    try:
        rev = await ctx.projector.delete(kind, id_)
        if kind == "BudgetLimit":
            ctx.budgets.pop(id_, None)
            try:
                ctx.usage.forget(runtime_limit(BudgetLimitSpec.model_validate(dict(spec)),
                                               Identity.from_meta(meta)).name)
            except (InvalidSpec, ValidationError):
                pass
        if rev:
            metrics.PROJECTIONS.labels(kind, "delete").inc()
        kopf.event(body, type="Normal", reason="Removed", message=f"removed from the policy plane ({kind} {id_})")
        ctx.managed.get(kind, set()).discard(id_)
        ctx.tracked.pop((kind, id_), None)
        ctx.observed.pop((kind, id_), None)
        if kind == "KillSwitch":
            ctx.engaged.discard(id_)
        metrics.OBJECTS.labels(kind).set(len(ctx.managed.get(kind, ())))
        metrics.KILLSWITCHES_ENGAGED.set(len(ctx.engaged))
    except ProjectionUnavailable as e:
        result = "error"
        metrics.REDIS_ERRORS.labels(kind).inc()
        raise kopf.TemporaryError(f"{e}; the finalizer stays until the document is removed",
                                  delay=ctx.config.retry_delay) from e
    finally:
        metrics.RECONCILES.labels(kind, "delete", result).inc()
        metrics.RECONCILE_SECONDS.labels(kind).observe(time.perf_counter() - started)


async def reflect_approval(ctx: Context, api: Any, namespace: str, name: str) -> bool:
    """Bring one Approval's status in line with the policy plane now (the bridge calls
    it when a decision was made outside Kubernetes); False if there is no such object.

    The same reconciler as kopf's handlers, its status written through the status
    subresource (a merge patch of the fields that changed)."""
    from kubernetes.client.exceptions import ApiException

    try:
        obj = await asyncio.to_thread(api.get_namespaced_custom_object, GROUP, VERSION, namespace, "approvals", name)
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    meta, status = obj.get("metadata") or {}, dict(obj.get("status") or {})
    now = _now()
    generation = int(meta.get("generation") or 0)
    model = SPEC_MODELS["Approval"].model_validate(dict(obj.get("spec") or {}))
    outcome = await reconcile_approval(ctx, model, Identity.from_meta(meta), status, now)  # type: ignore[arg-type]
    diff, old_ready, new_ready = _status_patch(status, outcome, generation, now)
    if diff:
        await asyncio.to_thread(api.patch_namespaced_custom_object_status, GROUP, VERSION, namespace, "approvals",
                                name, {"status": diff})
        metrics.RECONCILES.labels("Approval", "reflect", "ok").inc()
        if new_ready is not None and changed(old_ready, new_ready):
            # The same Event a kubectl decision gets (Approved / Denied / Expired), for a
            # decision made with the CLI or by the agent's expiry. Posted directly: the
            # bridge runs outside kopf's handlers, where kopf.event has no queue.
            await asyncio.to_thread(post_event, api.api_client, obj, new_ready)
    return True


def post_event(api_client: Any, obj: Mapping[str, Any], cond: Mapping[str, Any]) -> None:
    """A core/v1 Event about ``obj`` for condition ``cond``, as kopf.event posts them
    (``conditions.event_type``; reported by the operator)."""
    from kubernetes import client

    meta = obj["metadata"]
    now = _now()
    event = client.CoreV1Event(
        metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}.", namespace=meta["namespace"]),
        involved_object=client.V1ObjectReference(
            api_version=obj.get("apiVersion"), kind=obj.get("kind"), name=meta["name"],
            namespace=meta["namespace"], uid=meta.get("uid"), resource_version=meta.get("resourceVersion")),
        type=event_type(cond),
        reason=str(cond["reason"]), message=str(cond.get("message", ""))[:1024],
        source=client.V1EventSource(component=REPORTING_COMPONENT),
        reporting_component=REPORTING_COMPONENT, reporting_instance=REPORTING_COMPONENT,
        first_timestamp=now, last_timestamp=now, event_time=now, action="Reconcile", count=1,
    )
    client.CoreV1Api(api_client).create_namespaced_event(meta["namespace"], event)


def _api_client(config: OperatorConfig) -> Any:
    """A ``kubernetes`` API client logged in as kopf is (kubeconfig, else in-cluster)."""
    from kubernetes import client
    from kubernetes import config as kconfig

    if config.kubeconfig is not None:
        return kconfig.new_client_from_config(str(config.kubeconfig))  # type: ignore[no-untyped-call]
    if os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"):
        kconfig.load_incluster_config()  # type: ignore[no-untyped-call]
        return client.ApiClient()
    return kconfig.new_client_from_config()  # type: ignore[no-untyped-call]


async def _wait_until(when: datetime | None, stopped: Any) -> bool:
    """Wait until ``when`` unless the daemon is stopped first (object deleted, operator
    exiting); True if ``when`` came. Wakes at least every 30 s, so a clock jump or a
    long sleep never overshoots by more than that."""
    if when is None:
        return False
    while not stopped and (remaining := (when - _now()).total_seconds()) > 0:
        await stopped.wait(min(remaining, 30.0))
    return not stopped


def _expiry(kind: str, spec: Mapping[str, Any], meta: Mapping[str, Any]) -> datetime | None:
    try:
        if kind == "KillSwitch":
            return killswitch_expiry(KillSwitchSpec.model_validate(dict(spec)), Identity.from_meta(meta))
        if kind == "Approval" and not spec.get("decision"):
            return deadline_of(spec)
    except (InvalidSpec, ValidationError, ValueError):
        return None
    return None


def build_registry(config: OperatorConfig) -> kopf.OperatorRegistry:
    """Every handler of the operator, registered in a registry of its own."""
    registry = kopf.OperatorRegistry()

    @kopf.on.login(registry=registry)
    def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
        if config.kubeconfig is not None:
            os.environ["KUBECONFIG"] = str(config.kubeconfig)
            return kopf.login_with_kubeconfig(**kwargs)
        if os.path.exists("/var/run/secrets/kubernetes.io/serviceaccount/token"):
            return kopf.login_with_service_account(**kwargs)
        return kopf.login_with_kubeconfig(**kwargs)

    @kopf.on.startup(registry=registry)
    async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo,
                      logger: logging.Logger | logging.LoggerAdapter[Any], **_: Any) -> None:
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=ANNOTATION_PREFIX)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration")
        # Watches: the server closes a stream after server_timeout; the client gives up on
        # a silent one after client_timeout and reconnects (a stalled stream recovers).
        settings.watching.server_timeout = config.watch_server_timeout
        settings.watching.client_timeout = config.watch_client_timeout
        settings.watching.connect_timeout = config.watch_connect_timeout
        settings.networking.request_timeout = config.request_timeout
        settings.networking.connect_timeout = config.watch_connect_timeout
        # Events only for what a human cares about (posted explicitly), not every log line.
        settings.posting.level = logging.WARNING
        # `kubectl describe` / `kubectl get events` name the operator, not the framework.
        settings.posting.reporting_component = REPORTING_COMPONENT
        settings.peering.name = config.peering_name
        settings.peering.standalone = config.standalone
        settings.peering.priority = config.priority
        settings.peering.mandatory = False
        settings.peering.stealth = True
        ctx = Context.create(config)
        memo["ctx"] = ctx
        metrics.watch(ctx)
        try:
            await ctx.projector.ping()
        except ProjectionUnavailable as e:
            logger.warning("policy plane not reachable at startup (%s); handlers retry until it is", e)
        api_client = await asyncio.to_thread(_api_client, config)
        if config.approver_admission:
            why = await asyncio.to_thread(check_admission, api_client, config.approver_admission)
            ctx.admission = why is None
            if why is not None:
                logger.warning("approver admission not in force (%s): decisions are recorded without an "
                               "authenticated user", why)
        from kubernetes import client as kclient

        api = kclient.CustomObjectsApi(api_client)
        bridge = ApprovalBridge(ctx, api_client, interval=config.approval_poll_interval,
                                reflect=lambda ns, name: reflect_approval(ctx, api, ns, name))
        stop = asyncio.Event()
        memo["bridge"] = (bridge, stop, asyncio.create_task(bridge.run(stop), name="approval-bridge"), api_client)
        marker = SyncMarker(ctx, api_client, interval=config.marker_interval)
        memo["marker"] = asyncio.create_task(marker.run(stop), name="synced-marker")
        acks = AckAggregator(ctx, api_client, interval=config.ack_interval)
        memo["aggregator"] = acks
        memo["acks"] = asyncio.create_task(acks.run(stop), name="acknowledgements")
        if config.approval_ttl_after_finished > 0:
            janitor = ApprovalJanitor(api_client, config.approval_ttl_after_finished, config.namespaces)
            memo["janitor"] = asyncio.create_task(janitor.run(stop), name="approval-janitor")

    @kopf.on.cleanup(registry=registry)
    async def cleanup(memo: kopf.Memo, **_: Any) -> None:
        running = memo.get("bridge")
        if running is not None:
            _, stop, task, api_client = running
            stop.set()
            for t in (task, memo.get("marker"), memo.get("acks"), memo.get("janitor")):
                if t is None:
                    continue
                try:
                    await asyncio.wait_for(t, timeout=5)
                except (TimeoutError, asyncio.CancelledError):
                    t.cancel()
            api_client.close()
        ctx = memo.get("ctx")
        if isinstance(ctx, Context):
            await ctx.aclose()

    @kopf.on.probe(id="redis", registry=registry)
    async def probe_redis(memo: kopf.Memo, **_: Any) -> str:
        ctx = memo.get("ctx")
        if not isinstance(ctx, Context):
            return "starting"
        try:
            await asyncio.wait_for(ctx.projector.ping(), timeout=2)
        except (ProjectionUnavailable, TimeoutError) as e:
            return f"unreachable: {e}"
        return "ok"

    for model in KINDS:
        kind, plural = model.info.kind, model.info.plural
        res = (GROUP, VERSION, plural)
        interval = config.usage_interval if kind == "BudgetLimit" else config.resync_interval

        def make(kind: str, trigger: str) -> Any:
            async def handler(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                              patch: kopf.Patch, memo: kopf.Memo, **_: Any) -> None:
                await reconcile(kind, trigger, body=body, meta=meta, spec=spec, status=status, patch=patch,
                                ctx=memo["ctx"])
            handler.__name__ = f"{kind.lower()}_{trigger}"
            return handler

        def make_observe(kind: str) -> Any:
            async def observe(type: str | None, meta: kopf.Meta, status: kopf.Status, memo: kopf.Memo,
                              **_: Any) -> None:
                acks = memo.get("aggregator")
                if not isinstance(acks, AckAggregator):
                    return
                key = (kind, f"{meta.get('namespace')}/{meta.get('name')}")
                seen = None if type == "DELETED" else Observed(
                    str(meta.get("uid") or ""), int(meta.get("generation") or 0), dict(status or {}))
                await acks.observe(key, seen)
            observe.__name__ = f"{kind.lower()}_observe"
            return observe

        # Every watch event: what the API server holds, so a status patch that undid the
        # acknowledgement tally's is corrected at once (``acks`` module doc).
        kopf.on.event(*res, id="observe", registry=registry)(make_observe(kind))
        kopf.on.resume(*res, id="reconcile", registry=registry)(make(kind, "resume"))
        kopf.on.create(*res, id="reconcile", registry=registry)(make(kind, "create"))
        kopf.on.update(*res, id="reconcile", field="spec", registry=registry)(make(kind, "update"))
        kopf.timer(*res, id="resync", interval=interval, initial_delay=interval, registry=registry)(
            make(kind, "resync"))

        if kind in _PROJECTED_KINDS:
            def make_delete(kind: str) -> Any:
                async def on_delete(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, memo: kopf.Memo,
                                    **_: Any) -> None:
                    await remove(kind, body=body, meta=meta, spec=spec, ctx=memo["ctx"])
                on_delete.__name__ = f"{kind.lower()}_delete"
                return on_delete

            kopf.on.delete(*res, id="remove", registry=registry)(make_delete(kind))

        if kind in ("KillSwitch", "Approval"):
            def make_expiry(kind: str) -> Any:
                async def expire(body: kopf.Body, meta: kopf.Meta, spec: kopf.Spec, status: kopf.Status,
                                 patch: kopf.Patch, memo: kopf.Memo, stopped: Any, **_: Any) -> None:
                    if await _wait_until(_expiry(kind, spec, meta), stopped):
                        await reconcile(kind, "expire", body=body, meta=meta, spec=spec, status=status,
                                        patch=patch, ctx=memo["ctx"])
                expire.__name__ = f"{kind.lower()}_expire"
                return expire

            def has_deadline(kind: str) -> Any:
                def when(spec: kopf.Spec, meta: kopf.Meta, **_: Any) -> bool:
                    return _expiry(kind, spec, meta) is not None
                return when

            kopf.daemon(*res, id="expiry", when=has_deadline(kind), cancellation_timeout=1.0,
                        registry=registry)(make_expiry(kind))
    return registry
