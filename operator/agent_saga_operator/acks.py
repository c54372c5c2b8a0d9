"""Acknowledgement: which agents apply each lever, folded from their heartbeats into status.

Every agent process keeps a heartbeat in the policy plane (``agent_saga.heartbeat``,
docs/policy-plane.md "Agent heartbeats") listing the KillSwitches and SagaPolicies it has
applied, by uid and generation. This module reads them and says, per resource:

    matched       the live agents the resource governs (they read its namespace; for a
                  SagaPolicy, ``appliesTo`` also matches their name)
    acknowledged  those whose heartbeat lists this uid at this generation
    lagging       the others, by name (an agent that does not read that control at all
                  is lagging too, and says so: it does not obey)

and turns that into the ``Acknowledged`` condition (KillSwitch, SagaPolicy), the ACKED
column, a SagaPolicy's ``Ready`` (True only once an agent enforces it) and a ModelRoute's
``Ready`` (True only once an agent's router routes by it: its heartbeat lists the route
under ``routes``).

``AckAggregator`` is one task per operator process: it subscribes to
``P:v1:agents:events`` (an agent notifies when what it applied changes), re-reads the
heartbeats on every notification and every ``interval`` seconds anyway (an agent that
died only stops beating), and patches the status of each resource whose tally changed.

Invariants:
- Status claims only what heartbeats show: no heartbeat read yet is ``Unknown``, no
  matching agent is ``NoAgents`` / ``NoConsumer``, never a silent True.
- A heartbeat whose ``ts + ttl`` has passed does not count (its process stopped beating),
  whether or not Redis expired it yet; expired index entries are removed.
- Status patches carry the object's ``resourceVersion``: a conflicting write (a kopf
  reconcile in between) is re-read and recomputed, never overwritten blindly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

from agent_saga.heartbeat import (
    AGENTS_CHANNEL,
    Heartbeat,
    decode_heartbeats,
    heartbeat_index_key,
    heartbeat_key,
    served_namespaces_key,
)

from .conditions import READY, Cond, Reason, set_condition

__all__ = ["ACKNOWLEDGED", "AckAggregator", "Fleet", "Tally", "Tracked", "desired_status", "read_fleet", "tally"]

log = logging.getLogger("agent_saga_operator.acks")

ACKNOWLEDGED = "Acknowledged"
MAX_NAMES = 20


@dataclass(frozen=True, slots=True)
class Fleet:
    """The live heartbeats, as read at ``read_at`` (epoch seconds)."""

    beats: tuple[Heartbeat, ...]
    read_at: float
    problems: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Tracked:
    """What the tally needs to know about one resource (set by its reconciliation)."""

    kind: str
    namespace: str
    name: str
    uid: str
    generation: int
    engaged: bool = True
    applies_to: tuple[str, ...] | None = None
    mode: str = "Enforce"

    @property
    def id(self) -> str:
        """``namespace/name``: the key heartbeats name the resource by."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Tally:
    """How many agents a resource governs, how many applied it, and who still lags."""

    matched: int
    acknowledged: int
    lagging: tuple[str, ...] = ()
    acked_by: tuple[str, ...] = ()

    def to_status(self) -> dict[str, Any]:
        """The ``status.agents`` block (lagging and acknowledging names capped)."""
        lagging = list(self.lagging[:MAX_NAMES])
        if len(self.lagging) > MAX_NAMES:
            lagging.append(f"... and {len(self.lagging) - MAX_NAMES} more")
        return {"matched": self.matched, "acknowledged": self.acknowledged, "lagging": lagging}


_CONTROL = {"KillSwitch": ("killswitches", "kill switch"), "SagaPolicy": ("policies", "SagaPolicy reader"),
            "ModelRoute": ("routes", "router")}


def _labels(beats: Iterable[Heartbeat]) -> dict[str, str]:
    """id -> ``agent@pod``, with ``.pid`` added where two processes share a label."""
    beats = list(beats)
    counts: dict[str, int] = {}
    for b in beats:
        counts[b.label] = counts.get(b.label, 0) + 1
    return {b.id: b.label if counts[b.label] == 1 else f"{b.label}.{b.pid}" for b in beats}


def tally(fleet: Fleet, t: Tracked) -> Tally:
    """Which live agents ``t`` governs, and which of them applied it (see the module doc)."""
    import fnmatch

    attr, what = _CONTROL[t.kind]
    beats = [b for b in fleet.beats if b.reads(t.namespace)
             and (t.applies_to is None or any(fnmatch.fnmatchcase(b.agent, g) for g in t.applies_to))]
    labels = _labels(beats)
    acked, lagging = [], []
    for b in sorted(beats, key=lambda b: labels[b.id]):
        refs = getattr(b, attr)
        if refs is None:
            lagging.append(f"{labels[b.id]} (no {what})")
        elif any(r.uid == t.uid and r.generation == t.generation for r in refs):
            acked.append(labels[b.id])
        else:
            lagging.append(labels[b.id])
    return Tally(len(beats), len(acked), tuple(lagging), tuple(acked))


def _who(t: Tracked) -> str:
    agents = f"matching {', '.join(t.applies_to)} " if t.applies_to else ""
    return f"agent {agents}reads namespace {t.namespace}"


def desired_status(t: Tracked, fleet: Fleet | None) -> tuple[dict[str, Any], tuple[Cond, ...]]:
    """The status fields and conditions the heartbeats justify for ``t``."""
    if fleet is None:
        unknown = "agent heartbeats have not been read yet"
        conds = [Cond(ACKNOWLEDGED, "Unknown", Reason.AGENTS_UNKNOWN, unknown)]
        if t.kind in ("SagaPolicy", "ModelRoute"):
            conds.append(Cond(READY, "Unknown", Reason.AGENTS_UNKNOWN, f"{unknown}: whether an agent enforces it "
                              f"is not known"))
        return {}, tuple(conds)
    n = tally(fleet, t)
    fields: dict[str, Any] = {"agents": n.to_status(), "acked": f"{n.acknowledged}/{n.matched}"}
    lag = f"; lagging: {', '.join(n.lagging[:MAX_NAMES])}" if n.lagging else ""
    if t.kind == "KillSwitch" and not t.engaged:
        ack = Cond(ACKNOWLEDGED, "False", Reason.NOT_ENGAGED, "not in force: there is nothing to acknowledge")
    elif n.matched == 0:
        ack = Cond(ACKNOWLEDGED, "False", Reason.NO_AGENTS,
                   f"no {_who(t)} (no live agent heartbeat in the policy plane): nothing obeys it")
    elif n.acknowledged == n.matched:
        ack = Cond(ACKNOWLEDGED, "True", Reason.ACKNOWLEDGED,
                   f"all {n.matched} agent(s) that read namespace {t.namespace} apply generation {t.generation}")
    else:
        ack = Cond(ACKNOWLEDGED, "False", Reason.LAGGING,
                   f"{n.acknowledged} of {n.matched} agent(s) apply generation {t.generation}{lag}")
    if t.kind == "ModelRoute":
        return fields, (ack, _route_ready(t, n, lag))
    if t.kind != "SagaPolicy":
        return fields, (ack,)
    fields["enforcedBy"] = list(n.acked_by[:MAX_NAMES])
    verb = "observed" if t.mode == "Observe" else "enforced"
    if n.acknowledged:
        ready = Cond(READY, "True", Reason.OBSERVING if t.mode == "Observe" else Reason.ENFORCED,
                     f"{verb} by {n.acknowledged} of {n.matched} agent(s): {', '.join(n.acked_by[:MAX_NAMES])}{lag}")
    elif n.matched == 0:
        ready = Cond(READY, "False", Reason.NO_CONSUMER,
                     f"projected, but no {_who(t)}: nothing enforces this policy yet")
    else:
        ready = Cond(READY, "False", Reason.NOT_APPLIED,
                     f"{n.matched} agent(s) match, none has applied generation {t.generation} yet{lag}")
    return fields, (ack, ready)


def _route_ready(t: Tracked, n: Tally, lag: str) -> Cond:
    """A ModelRoute is Ready once a router routes by it (its heartbeat lists the route)."""
    if n.acknowledged:
        return Cond(READY, "True", Reason.ROUTED, f"routing {n.acknowledged} of {n.matched} agent(s): "
                                                  f"{', '.join(n.acked_by[:MAX_NAMES])}{lag}")
    if n.matched == 0:
        return Cond(READY, "False", Reason.NO_CONSUMER, f"projected, but no {_who(t)}: no router routes by it yet")
    return Cond(READY, "False", Reason.NOT_APPLIED,
                f"{n.matched} agent(s) match, none routes by generation {t.generation} (an agent routes by one "
                f"ModelRoute: the first by name that applies to it, once its router has read it){lag}")


async def read_fleet(client: Any, prefix: str, *, now: float | None = None) -> Fleet:
    """The live heartbeats (``prefix`` is ``P:v1``); expired index entries are removed.
    Raises whatever the client raises."""
    now = time.time() if now is None else now
    index = heartbeat_index_key(prefix)
    await client.zremrangebyscore(index, "-inf", int(now * 1000))
    ids = [m.decode() if isinstance(m, bytes) else str(m)
           for m in await client.zrangebyscore(index, int(now * 1000), "+inf")]
    if not ids:
        return Fleet((), now)
    raws = await client.mget([heartbeat_key(prefix, i) for i in ids])
    beats, problems = decode_heartbeats(ids, raws, now)
    return Fleet(tuple(beats), now, tuple(problems))


@dataclass(slots=True)
class AckAggregator:
    """The task that keeps Acknowledged / Ready in line with the heartbeats (module doc)."""

    ctx: Any
    api_client: Any
    interval: float = 1.0
    patches: int = 0
    _written: dict[tuple[str, str], Any] = field(default_factory=dict)

    @property
    def prefix(self) -> str:
        """The policy-plane key prefix heartbeats are read under."""
        return f"{self.ctx.config.key_prefix}:v1"

    async def step(self) -> None:
        """Announce the namespaces served, read the heartbeats once, and patch every
        resource whose tally changed."""
        client = self.ctx.projector.client
        served = self.ctx.config.namespaces or ("*",)
        await client.sadd(served_namespaces_key(self.prefix), *served)
        fleet = await read_fleet(client, self.prefix)
        for p in fleet.problems:
            log.warning("unreadable agent heartbeat %s (skipped)", p)
        self.ctx.fleet = fleet
        for key, t in list(self.ctx.tracked.items()):
            desired = desired_status(t, fleet)
            if self.ctx.acks_written.get(key) == desired:
                continue
            try:
                await self._patch(t, desired)
            except Exception as exc:  # noqa: BLE001 - one object failing must not stop the others
                log.warning("could not update the status of %s %s (%s: %s); retrying", t.kind, t.id,
                            type(exc).__name__, exc)

    async def _patch(self, t: Tracked, desired: tuple[dict[str, Any], tuple[Cond, ...]]) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        from .models import GROUP, KINDS, VERSION

        api = client.CustomObjectsApi(self.api_client)
        plural = {m.info.kind: m.info.plural for m in KINDS}[t.kind]
        for _ in range(5):
            try:
                obj = await asyncio.to_thread(api.get_namespaced_custom_object, GROUP, VERSION, t.namespace,
                                              plural, t.name)
            except ApiException as e:
                if e.status == 404:
                    self.ctx.tracked.pop((t.kind, t.id), None)
                    return
                raise
            obj = cast(dict[str, Any], obj)
            meta = obj.get("metadata") or {}
            if meta.get("uid") != t.uid or int(meta.get("generation") or 0) != t.generation:
                return  # a newer generation: its reconciliation tracks it anew
            status = dict(obj.get("status") or {})
            fields, conds = desired
            now = datetime.now(UTC)
            new_conds = status.get("conditions")
            for c in conds:
                new_conds = set_condition(new_conds, c, generation=t.generation, now=now)
            diff = {k: v for k, v in {**fields, "conditions": new_conds}.items() if status.get(k) != v}
            if not diff:
                self.ctx.acks_written[(t.kind, t.id)] = desired
                return
            body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": diff}
            try:
                await asyncio.to_thread(api.patch_namespaced_custom_object_status, GROUP, VERSION, t.namespace,
                                        plural, t.name, body)
            except ApiException as e:
                if e.status == 409:
                    continue  # written in between: read it again
                raise
            self.patches += 1
            self.ctx.acks_written[(t.kind, t.id)] = desired
            _event(obj, status.get("conditions"), new_conds)
            return

    async def run(self, stop: asyncio.Event) -> None:
        """Until ``stop``: a step on every agent notification and every ``interval``."""
        channel = f"{self.prefix}:{AGENTS_CHANNEL}"
        while not stop.is_set():
            pubsub = None
            try:
                pubsub = self.ctx.projector.client.pubsub()
                await pubsub.subscribe(channel)
                while not stop.is_set():
                    await self.step()
                    deadline = time.monotonic() + self.interval
                    while not stop.is_set() and (left := deadline - time.monotonic()) > 0:
                        msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(left, 0.5))
                        if msg is not None:
                            break
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis or API trouble: retry, keep status as last written
                log.warning("acknowledgement tally paused (%s: %s); retrying", type(exc).__name__, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.interval)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()


def _event(obj: Mapping[str, Any], old: Any, new: Any) -> None:
    """An Event on a Ready transition this task made (as the kopf handlers post them)."""
    from .conditions import changed, find

    before, after = find(old, READY), find(new, READY)
    if after is None or not changed(before, after):
        return
    try:
        import kopf

        kopf.event(cast(Any, dict(obj)), type="Normal" if after["status"] == "True" else "Warning",
                   reason=str(after["reason"]), message=str(after.get("message", "")))
    except Exception as exc:  # noqa: BLE001 - an Event is a courtesy; status is the record
        log.debug("could not post an Event for %s: %s", (obj.get("metadata") or {}).get("name"), exc)
