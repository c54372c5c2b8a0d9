"""Acknowledgement: which agents apply each lever, folded from their heartbeats into status.

Every agent process keeps a heartbeat in the policy plane (``agent_saga.heartbeat``,
docs/policy-plane.md "Agent heartbeats") listing the KillSwitches, BudgetLimits,
SagaPolicies and ModelRoutes (``routes``: only a process with a router) it has applied, by
uid and generation. This module reads them and says, per resource:

    matched       the live agents the resource governs (they read its namespace; for a
                  SagaPolicy or ModelRoute, ``appliesTo`` also matches their name)
    acknowledged  those whose heartbeat lists this uid at this generation
    lagging       the others, by name (an agent that does not read that control at all
                  is lagging too, and says so: it does not obey)

and turns that into the same three answers on all four kinds (docs/crds.md, "READY,
ACKED, Acknowledged"):

    ACKED         ``acknowledged/matched``
    Acknowledged  True when every agent it governs applies this generation (and at least one does)
    Ready         True when it is projected and at least one agent it governs applies this
                  generation: in force somewhere; False ``NoConsumer`` / ``NotApplied`` otherwise

A message that says no agent matches names the namespaces the live agents do read.
A BudgetLimit's and a SagaPolicy's status also counts what the agents report it made
them refuse or hold for a human (``status.refusals``; ``refusals``).

``AckAggregator`` is one task per operator process: it subscribes to
``P:v1:agents:events`` (an agent notifies when what it applied changes), re-reads the
heartbeats on every notification and every ``interval`` seconds anyway (an agent that
died only stops beating), and patches the status of each resource whose status on the
API server differs from what the heartbeats justify. It is not the only writer of that
status: a kopf handler's patch (computed from the heartbeats it had read, applied after
it returns) can land after the tally's. So the tally compares with what the API server
holds, as kopf's watch last showed it (``observe``: every watch event of a tracked object),
never with a memory of what it wrote itself; a watch event showing a status the
heartbeats do not justify is corrected at once.

Invariants:
- Status claims only what heartbeats show: no heartbeat read yet is ``Unknown``, no
  matching agent is ``NoAgents`` / ``NoConsumer``, never a silent True.
- A heartbeat whose ``ts + ttl`` has passed does not count (its process stopped beating),
  whether or not Redis expired it yet; expired index entries are removed.
- Status patches carry the object's ``resourceVersion``: a conflicting write (a kopf
  reconcile in between) is re-read and recomputed, never overwritten blindly.
- A later write that undoes the tally's (kopf's merge patch carries no
  ``resourceVersion``) is seen in the watch and corrected: no status waits for a resync.
- One read per burst: when a change reaches a thousand agents, a thousand notifications
  arrive within a second. Every notification already received when the tally wakes is
  taken with the first (at most ``DRAIN`` of them; more wait for the next read), so the
  heartbeats are read once per burst, not once per agent: the tally's cost per change is
  O(agents), never O(agents^2). No notification is lost: each one only says "read again",
  and the read that follows it sees every heartbeat written before it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, cast

from agent_saga.heartbeat import (
    AGENTS_CHANNEL,
    Heartbeat,
    decode_heartbeats,
    heartbeat_buckets_key,
    heartbeat_index_keys,
    heartbeat_key,
    served_namespaces_key,
    split_index,
)

from .conditions import READY, Cond, Reason, set_condition
from .refusals import RefusalBook, RefusalTotal

__all__ = ["ACKNOWLEDGED", "AckAggregator", "Fleet", "Observed", "Tally", "Tracked", "desired_status", "read_fleet",
           "status_diff", "tally"]

log = logging.getLogger("agent_saga_operator.acks")

#: A heartbeat index key with more entries than this is past ~64 KB (~130 B an entry):
#: the operator warns and ``agentsaga_operator_heartbeat_bucket_max`` shows it.
BUCKET_WARN = 480

ACKNOWLEDGED = "Acknowledged"
MAX_NAMES = 20
#: Notifications taken together with the one that woke the tally (module doc, "One read per burst").
DRAIN = 100_000


@dataclass(frozen=True, slots=True)
class Fleet:
    """The live heartbeats, as read at ``read_at`` (epoch seconds)."""

    beats: tuple[Heartbeat, ...]
    read_at: float
    problems: tuple[str, ...] = ()
    #: What each document (by uid) made the agents refuse or hold (``refusals.RefusalBook``).
    refusals: Mapping[str, RefusalTotal] = field(default_factory=dict)
    #: The most entries one heartbeat index key held (``heartbeat.INDEX_BUCKETS``).
    largest_bucket: int = 0


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
    #: Ready=True's reason and the sentence saying what it does once applied.
    reason: str = Reason.ENFORCED
    text: str = ""

    @property
    def id(self) -> str:
        """``namespace/name``: the key heartbeats name the resource by."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Observed:
    """An object as the API server last showed it (a kopf watch event)."""

    uid: str
    generation: int
    status: Mapping[str, Any]


Desired = tuple[dict[str, Any], tuple[Cond, ...]]


def status_diff(status: Mapping[str, Any], desired: Desired, generation: int, now: datetime) -> dict[str, Any]:
    """The status fields to patch so that ``status`` says what ``desired`` says (empty:
    it does). Conditions keep their transition time unless their status flips."""
    fields, conds = desired
    new_conds = status.get("conditions")
    for c in conds:
        new_conds = set_condition(new_conds, c, generation=generation, now=now)
    return {k: v for k, v in {**fields, "conditions": new_conds}.items() if status.get(k) != v}


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


_CONTROL = {"KillSwitch": ("killswitches", "kill switch"), "BudgetLimit": ("limits", "limit reader"),
            "SagaPolicy": ("policies", "SagaPolicy reader"), "ModelRoute": ("routes", "router")}


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


def _who(t: Tracked, fleet: Fleet) -> str:
    agents = f"matching {', '.join(t.applies_to)} " if t.applies_to else ""
    return f"no live agent {agents}reads namespace {t.namespace} ({_read_by(fleet)})"


def _read_by(fleet: Fleet) -> str:
    """Which namespaces the live agents read, with how many agents each."""
    counts: dict[str, int] = {}
    for b in fleet.beats:
        for ns in b.namespaces or (b.namespace,):
            counts[ns] = counts.get(ns, 0) + 1
    if not counts:
        return "no live agent heartbeat in the policy plane"
    shown = sorted(counts.items())[:MAX_NAMES]
    more = f" and {len(counts) - MAX_NAMES} more" if len(counts) > MAX_NAMES else ""
    return "live agents read " + ", ".join(f"{ns} ({n})" for ns, n in shown) + more


def desired_status(t: Tracked, fleet: Fleet | None) -> tuple[dict[str, Any], tuple[Cond, ...]]:
    """The status fields and the Acknowledged and Ready conditions the heartbeats justify
    for ``t`` (a KillSwitch that is not engaged: Acknowledged only; its Ready says Expired)."""
    engaged = not (t.kind == "KillSwitch" and not t.engaged)
    if fleet is None:
        unknown = "agent heartbeats have not been read yet"
        conds = [Cond(ACKNOWLEDGED, "Unknown", Reason.AGENTS_UNKNOWN, unknown)]
        if engaged:
            conds.append(Cond(READY, "Unknown", Reason.AGENTS_UNKNOWN,
                              f"{t.text}; {unknown}: whether an agent applies it is not known"))
        return {}, tuple(conds)
    n = tally(fleet, t)
    fields: dict[str, Any] = {"agents": n.to_status(), "acked": f"{n.acknowledged}/{n.matched}"}
    lag = f"; lagging: {', '.join(n.lagging[:MAX_NAMES])}" if n.lagging else ""
    if not engaged:
        ack = Cond(ACKNOWLEDGED, "False", Reason.NOT_ENGAGED, "not in force: there is nothing to acknowledge")
    elif n.matched == 0:
        ack = Cond(ACKNOWLEDGED, "False", Reason.NO_AGENTS, f"{_who(t, fleet)}: nothing applies it")
    elif n.acknowledged == n.matched:
        ack = Cond(ACKNOWLEDGED, "True", Reason.ACKNOWLEDGED,
                   f"all {n.matched} agent(s) that read namespace {t.namespace} apply generation {t.generation}")
    else:
        ack = Cond(ACKNOWLEDGED, "False", Reason.LAGGING,
                   f"{n.acknowledged} of {n.matched} agent(s) apply generation {t.generation}{lag}")
    if not engaged:
        return fields, (ack,)
    if t.kind == "SagaPolicy":
        fields["enforcedBy"] = list(n.acked_by[:MAX_NAMES])
    if t.kind in _COUNTS_REFUSALS:
        fields["refusals"] = fleet.refusals.get(t.uid, RefusalTotal()).to_status()
    if n.acknowledged:
        ready = Cond(READY, "True", t.reason, f"{t.text}; applied by {n.acknowledged} of {n.matched} agent(s): "
                                              f"{', '.join(n.acked_by[:MAX_NAMES])}{lag}")
    elif n.matched == 0:
        ready = Cond(READY, "False", Reason.NO_CONSUMER,
                     f"{t.text}; projected, but {_who(t, fleet)}: nothing applies it yet")
    else:
        ready = Cond(READY, "False", Reason.NOT_APPLIED,
                     f"{t.text}; {n.matched} agent(s) match, none applies generation {t.generation} yet"
                     f"{_NOT_APPLIED.get(t.kind, '')}{lag}")
    return fields, (ack, ready)


#: The kinds whose status counts what they refused or held for a human.
_COUNTS_REFUSALS = ("BudgetLimit", "SagaPolicy")

_NOT_APPLIED = {"ModelRoute": " (an agent routes by one ModelRoute: the first by name that applies to it, once its "
                              "router has read it)"}


async def read_fleet(client: Any, prefix: str, *, now: float | None = None) -> Fleet:
    """The live heartbeats (``prefix`` is ``P:v1``): every index bucket and the unbucketed
    index read in one pipelined round trip; expired index entries are removed. Raises
    whatever the client raises."""
    now = time.time() if now is None else now
    keys = heartbeat_index_keys(prefix)
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.zrange(k, 0, -1, withscores=True)
    ids, expired, largest = split_index(keys, await pipe.execute(), now)
    if expired:
        pipe = client.pipeline(transaction=False)
        for k in expired:
            pipe.zremrangebyscore(k, "-inf", int(now * 1000))
        await pipe.execute()
    if not ids:
        return Fleet((), now, largest_bucket=largest)
    raws = await client.mget([heartbeat_key(prefix, i) for i in ids])
    beats, problems = decode_heartbeats(ids, raws, now)
    return Fleet(tuple(beats), now, tuple(problems), largest_bucket=largest)


@dataclass(slots=True)
class AckAggregator:
    """The task that keeps Acknowledged / Ready in line with the heartbeats (module doc)."""

    ctx: Any
    api_client: Any
    interval: float = 1.0
    patches: int = 0
    book: RefusalBook = field(default_factory=RefusalBook)
    _warned: bool = False

    @property
    def prefix(self) -> str:
        """The policy-plane key prefix heartbeats are read under."""
        return f"{self.ctx.config.key_prefix}:v1"

    async def step(self) -> None:
        """Announce the namespaces served, read the heartbeats once, and patch every
        resource whose tally changed."""
        from .metrics import ACK_READS, HEARTBEAT_BUCKET_MAX

        client = self.ctx.projector.client
        served = self.ctx.config.namespaces or ("*",)
        await client.sadd(served_namespaces_key(self.prefix), *served)
        # agents add their index entry to the unbucketed index while this is missing
        await client.set(heartbeat_buckets_key(self.prefix), "1", px=int(max(3 * self.interval, 5.0) * 1000))
        ACK_READS.inc()
        fleet = await read_fleet(client, self.prefix)
        HEARTBEAT_BUCKET_MAX.set(fleet.largest_bucket)
        if fleet.largest_bucket > BUCKET_WARN and not self._warned:
            log.warning("a heartbeat index key holds %d entries (over %d: past ~64 KB); split the plane by "
                        "namespace group (a key prefix each, docs/scale.md)", fleet.largest_bucket, BUCKET_WARN)
        self._warned = fleet.largest_bucket > BUCKET_WARN
        fleet = replace(fleet, refusals=self.book.fold(fleet.beats))
        for p in fleet.problems:
            log.warning("unreadable agent heartbeat %s (skipped)", p)
        self.ctx.fleet = fleet
        for key in list(self.ctx.tracked):
            await self.check(key)

    def stale(self, key: tuple[str, str]) -> Tracked | None:
        """The tracked resource ``key`` if the API server may not show what the heartbeats
        justify: its last watch event differs, or none was seen yet (None: it shows it)."""
        t: Tracked | None = self.ctx.tracked.get(key)
        if t is None or self.ctx.fleet is None:
            return None
        seen = self.ctx.observed.get(key)
        if seen is None or seen.uid != t.uid or seen.generation != t.generation:
            return t  # not seen at this generation yet: read it and see
        desired = desired_status(t, self.ctx.fleet)
        return t if status_diff(seen.status, desired, t.generation, datetime.now(UTC)) else None

    async def check(self, key: tuple[str, str]) -> None:
        """Patch ``key``'s status if the API server does not show what the heartbeats
        justify (see ``stale``); a failure is logged and retried on the next step."""
        t = self.stale(key)
        if t is None:
            return
        try:
            await self._patch(t, desired_status(t, self.ctx.fleet))
        except Exception as exc:  # noqa: BLE001 - one object failing must not stop the others
            log.warning("[%s] could not update the status of %s (%s: %s); retrying", t.id, t.kind,
                        type(exc).__name__, exc)

    async def observe(self, key: tuple[str, str], seen: Observed | None) -> None:
        """A watch event of ``key`` (None: deleted): remember what the API server holds and
        correct it at once if another writer undid the tally's status."""
        if seen is None:
            self.ctx.observed.pop(key, None)
            return
        self.ctx.observed[key] = seen
        await self.check(key)

    async def _patch(self, t: Tracked, desired: Desired) -> None:
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
            diff = status_diff(status, desired, t.generation, datetime.now(UTC))
            if not diff:
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
            _event(obj, status.get("conditions"), diff.get("conditions", status.get("conditions")))
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
                            await _drain(pubsub)
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


async def _drain(pubsub: Any) -> int:
    """Take every notification already received after the first (at most ``DRAIN``): the
    one read that follows covers them all. How many there were, with the first."""
    from .metrics import ACK_NOTIFICATIONS

    n = 1
    while n <= DRAIN and await pubsub.get_message(ignore_subscribe_messages=True, timeout=0) is not None:
        n += 1
    ACK_NOTIFICATIONS.inc(n)
    return n


def _event(obj: Mapping[str, Any], old: Any, new: Any) -> None:
    """An Event on a Ready transition this task made (as the kopf handlers post them)."""
    from .conditions import changed, event_type, find

    before, after = find(old, READY), find(new, READY)
    if after is None or not changed(before, after):
        return
    try:
        import kopf

        kopf.event(cast(Any, dict(obj)), type=event_type(after), reason=str(after["reason"]),
                   message=str(after.get("message", "")))
    except Exception as exc:  # noqa: BLE001 - an Event is a courtesy; status is the record
        log.debug("could not post an Event for %s: %s", (obj.get("metadata") or {}).get("name"), exc)
