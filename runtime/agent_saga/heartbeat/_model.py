"""The agent heartbeat: what one agent process has applied, kept fresh in the policy plane.

    P:v1:agent:<ns>/<instance>   STRING  the heartbeat (JSON), expires after ``ttl`` seconds
    P:v1:agent:index:<b>         ZSET    "<ns>/<instance>" -> when it expires (epoch ms), for the
                                         instances whose "<ns>/<pod>" hashes to bucket ``b``
                                         (CRC-32 mod ``INDEX_BUCKETS``)
    P:v1:agent:index             ZSET    the same, unbucketed: what the previous release writes
                                         and reads; a writer adds to it too while no operator
                                         that reads the buckets has said so (below)
    P:v1:agents:buckets          STRING  "1" while an operator that reads the buckets runs
                                         (it refreshes it with a short expiry)
    P:v1:agents:events           CHANNEL {"v":1,"kind":"AgentHeartbeat","id":...,"op":"put"|"delete"}
                                         when what the agent has applied changes (not on a refresh)

``<instance>`` is ``<pod>.<pid>``: one heartbeat per process. The operator reads them and
folds them into status (docs/policy-plane.md, "Agent heartbeats"): a KillSwitch is
acknowledged by an agent whose heartbeat lists its ``uid`` and ``generation``; a
SagaPolicy is enforced by the agents that list it; a ModelRoute is routed by the agents
whose router lists it under ``routes`` (``null`` in a process without a router).

Invariants:
- A heartbeat says only what the process has applied (the documents it loaded and
  enforces now), never what it was asked to do: a control that is not wired is ``null``,
  a control that is wired and holds nothing is ``[]``.
- It carries no secret and no argument value: names, ids, revisions and posture, and
  (``refusals``) how many calls each BudgetLimit or SagaPolicy made the process refuse or
  hold for a human, with the tool, saga and rule of the last (``_refusals``); ``null``:
  a process that does not count them.
- No index key grows with the fleet beyond ``N / INDEX_BUCKETS`` members (~130 B each):
  64 KB per bucket holds ~500 members, so the buckets stay under 64 KB up to ~100,000
  agent processes on one prefix (docs/scale.md; the operator's
  ``agentsaga_operator_heartbeat_bucket_max`` gauge shows the fullest bucket). A reader
  reads every bucket and the unbucketed index in one pipelined round trip.
- A reader drops a heartbeat whose ``ts + ttl`` has passed even if Redis has not expired
  it yet, and skips a ``v`` it does not know.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "AGENTS_CHANNEL",
    "HEARTBEAT_VERSION",
    "AppliedRef",
    "Heartbeat",
    "RefusalCount",
    "INDEX_BUCKETS",
    "heartbeat_buckets_key",
    "heartbeat_index_key",
    "heartbeat_index_keys",
    "heartbeat_key",
    "heartbeat_legacy_index_key",
    "decode_heartbeats",
    "read_heartbeats",
    "split_index",
    "served_namespaces_key",
]

HEARTBEAT_VERSION = 1
AGENTS_CHANNEL = "agents:events"
Posture = Literal["ok", "degraded", "closed", "unknown"]


def heartbeat_key(prefix: str, id_: str) -> str:
    """``P:v1:agent:<ns>/<instance>`` (``prefix`` is ``P:v1``)."""
    return f"{prefix}:agent:{id_}"


#: The heartbeats' index is split into this many sorted sets (see the module doc).
INDEX_BUCKETS = 256


def heartbeat_index_key(prefix: str, identity: str) -> str:
    """``P:v1:agent:index:<b>``: the index bucket of the agent ``identity``
    (``<ns>/<pod>``, without the pid: its Redis user names it before the process runs)."""
    return f"{prefix}:agent:index:{zlib.crc32(identity.encode()) % INDEX_BUCKETS}"


def heartbeat_legacy_index_key(prefix: str) -> str:
    """``P:v1:agent:index``: the unbucketed index of the previous release."""
    return f"{prefix}:agent:index"


def heartbeat_index_keys(prefix: str) -> list[str]:
    """Every index key a reader reads: the buckets, then the unbucketed index."""
    return [f"{prefix}:agent:index:{b}" for b in range(INDEX_BUCKETS)] + [heartbeat_legacy_index_key(prefix)]


def heartbeat_buckets_key(prefix: str) -> str:
    """``P:v1:agents:buckets``: set (with a short expiry) by an operator that reads the
    buckets; while it is missing, writers add their entry to the unbucketed index too, so
    an operator of the previous release still counts them."""
    return f"{prefix}:agents:buckets"


def served_namespaces_key(prefix: str) -> str:
    """``P:v1:namespaces``: a SET of the namespaces the operators on this plane serve
    (``*``: every namespace). Written by the operator; an agent whose namespace is not
    in it refuses to start, naming the fix."""
    return f"{prefix}:namespaces"


@dataclass(frozen=True, slots=True)
class AppliedRef:
    """One policy-plane document an agent applied: ``<ns>/<name>``, the resource's uid
    and the generation it was projected from."""

    id: str
    uid: str = ""
    generation: int = 0

    def to_doc(self) -> dict[str, Any]:
        return {"id": self.id, "uid": self.uid, "generation": self.generation}

    @classmethod
    def from_doc(cls, doc: Any) -> AppliedRef:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("id"), str):
            raise ValueError(f"an applied document is {{id, uid, generation}}, got {doc!r:.100}")
        return cls(doc["id"], str(doc.get("uid") or ""), int(doc.get("generation") or 0))

    @classmethod
    def from_document(cls, doc: Mapping[str, Any]) -> AppliedRef:
        """The reference to a policy-plane document (its envelope's id, uid, generation)."""
        return cls(str(doc.get("id", "")), str(doc.get("uid") or ""), int(doc.get("generation") or 0))


@dataclass(frozen=True, slots=True)
class RefusalCount:
    """What one document made this process refuse (``refused``) or hold for a human
    (``held``), and the last of them: ``{"outcome", "tool", "saga", "by", "at"}``."""

    id: str
    uid: str
    refused: int = 0
    held: int = 0
    last: Mapping[str, Any] | None = None

    def to_doc(self) -> dict[str, Any]:
        return {"id": self.id, "uid": self.uid, "refused": self.refused, "held": self.held,
                "last": None if self.last is None else dict(self.last)}

    @classmethod
    def from_doc(cls, doc: Any) -> RefusalCount:
        if not isinstance(doc, Mapping) or not isinstance(doc.get("id"), str) or not isinstance(doc.get("uid"), str):
            raise ValueError(f"a refusal count is {{id, uid, refused, held, last}}, got {doc!r:.100}")
        last = doc.get("last")
        if last is not None and not isinstance(last, Mapping):
            raise ValueError(f"refusal count {doc['id']}: last must be an object or null")
        refused, held = int(doc.get("refused") or 0), int(doc.get("held") or 0)
        if refused < 0 or held < 0:
            raise ValueError(f"refusal count {doc['id']}: counts cannot be negative")
        return cls(doc["id"], doc["uid"], refused, held, None if last is None else dict(last))


def _refs(value: Any) -> tuple[AppliedRef, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"a list of applied documents or null, got {value!r:.100}")
    return tuple(AppliedRef.from_doc(v) for v in value)


def _refusals(value: Any) -> tuple[RefusalCount, ...] | None:
    if value is None:
        return None
    if not isinstance(value, list):
        raise ValueError(f"a list of refusal counts or null, got {value!r:.100}")
    return tuple(RefusalCount.from_doc(v) for v in value)


def _dump(refs: Iterable[AppliedRef] | None) -> list[dict[str, Any]] | None:
    return None if refs is None else [r.to_doc() for r in sorted(refs, key=lambda r: r.id)]


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """One agent process's heartbeat (see the module doc)."""

    namespace: str
    agent: str
    pod: str
    pid: int
    ts: float
    ttl: float
    started_at: float = 0.0
    namespaces: tuple[str, ...] = ()
    rev: str | None = None
    posture: Posture = "unknown"
    killswitches: tuple[AppliedRef, ...] | None = None
    policies: tuple[AppliedRef, ...] | None = None
    limits: tuple[AppliedRef, ...] | None = None
    runtime: str = ""
    routes: tuple[AppliedRef, ...] | None = None
    refusals: tuple[RefusalCount, ...] | None = None

    @property
    def instance(self) -> str:
        return f"{self.pod}.{self.pid}"

    @property
    def id(self) -> str:
        return f"{self.namespace}/{self.instance}"

    @property
    def label(self) -> str:
        """How status names this process: ``<agent>@<pod>``."""
        return f"{self.agent}@{self.pod}"

    def reads(self, namespace: str) -> bool:
        """Does this process read the policy of ``namespace``?"""
        return namespace in (self.namespaces or (self.namespace,))

    def alive(self, now: float) -> bool:
        return self.ts + self.ttl > now

    def applied(self) -> dict[str, Any]:
        """What the process has applied (a change of it is worth a notification)."""
        return {"rev": self.rev, "posture": self.posture, "killswitches": _dump(self.killswitches),
                "policies": _dump(self.policies), "limits": _dump(self.limits), "routes": _dump(self.routes),
                "namespaces": list(self.namespaces)}

    def to_doc(self) -> dict[str, Any]:
        return {
            "v": HEARTBEAT_VERSION, "kind": "AgentHeartbeat", "id": self.id, "namespace": self.namespace,
            "agent": self.agent, "pod": self.pod, "pid": self.pid, "startedAt": self.started_at, "ts": self.ts,
            "ttl": self.ttl, "namespaces": list(self.namespaces), "rev": self.rev, "posture": self.posture,
            "killswitches": _dump(self.killswitches), "policies": _dump(self.policies),
            "limits": _dump(self.limits), "routes": _dump(self.routes), "runtime": self.runtime,
            "refusals": None if self.refusals is None else [c.to_doc() for c in self.refusals],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_doc(), separators=(",", ":"), sort_keys=False)

    @classmethod
    def from_doc(cls, doc: Any) -> Heartbeat:
        """Raises ``ValueError`` for anything but a v1 heartbeat."""
        if not isinstance(doc, Mapping) or doc.get("kind") != "AgentHeartbeat":
            raise ValueError(f"not an agent heartbeat: {doc!r:.120}")
        if doc.get("v") != HEARTBEAT_VERSION:
            raise ValueError(f"heartbeat v={doc.get('v')!r} is not supported")
        try:
            posture = doc.get("posture") if doc.get("posture") in ("ok", "degraded", "closed") else "unknown"
            return cls(
                namespace=str(doc["namespace"]), agent=str(doc["agent"]), pod=str(doc["pod"]), pid=int(doc["pid"]),
                ts=float(doc["ts"]), ttl=float(doc["ttl"]), started_at=float(doc.get("startedAt") or 0.0),
                namespaces=tuple(str(n) for n in doc.get("namespaces") or ()),
                rev=None if doc.get("rev") is None else str(doc["rev"]),
                posture=posture,  # type: ignore[arg-type]
                killswitches=_refs(doc.get("killswitches")), policies=_refs(doc.get("policies")),
                limits=_refs(doc.get("limits")), runtime=str(doc.get("runtime") or ""),
                routes=_refs(doc.get("routes")), refusals=_refusals(doc.get("refusals")),
            )
        except (KeyError, TypeError) as exc:
            raise ValueError(f"heartbeat {doc.get('id')!r} is missing or mistypes {exc}") from None


def read_heartbeats(client: Any, prefix: str, *, now: float | None = None) -> tuple[list[Heartbeat], list[str]]:
    """The live heartbeats (a synchronous ``redis`` client; ``prefix`` is ``P:v1``) and
    the problems met (unreadable documents, skipped). Does not write."""
    import time

    now = time.time() if now is None else now
    keys = heartbeat_index_keys(prefix)
    pipe = client.pipeline(transaction=False)
    for k in keys:
        pipe.zrange(k, 0, -1, withscores=True)
    ids, _, _ = split_index(keys, pipe.execute(), now)
    raws = client.mget([heartbeat_key(prefix, i) for i in ids]) if ids else []
    return decode_heartbeats(ids, raws, now)


def split_index(keys: list[str], rows: list[Any], now: float) -> tuple[list[str], list[str], int]:
    """From ``ZRANGE key 0 -1 WITHSCORES`` of each index key: the live ids (each once),
    the keys holding expired entries, and the most entries one key holds."""
    live: dict[str, None] = {}
    expired: list[str] = []
    cutoff = now * 1000
    for key, row in zip(keys, rows, strict=True):
        stale = False
        for member, score in row:
            if score > cutoff:
                live[member.decode() if isinstance(member, bytes) else str(member)] = None
            else:
                stale = True
        if stale:
            expired.append(key)
    return list(live), expired, max((len(r) for r in rows), default=0)


def decode_heartbeats(ids: list[str], raws: list[Any], now: float) -> tuple[list[Heartbeat], list[str]]:
    """The live heartbeats among the documents ``raws`` (read for ``ids``; ``None``: gone),
    sorted by id, and the problems met (unreadable documents, skipped)."""
    beats, problems = [], []
    for id_, raw in zip(ids, raws, strict=True):
        if raw is None:
            continue
        try:
            hb = Heartbeat.from_doc(json.loads(raw))
        except ValueError as exc:
            problems.append(f"{id_}: {exc}")
            continue
        if hb.alive(now):
            beats.append(hb)
    return sorted(beats, key=lambda b: b.id), problems
