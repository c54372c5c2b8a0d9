"""The agent heartbeat: what one agent process has applied, kept fresh in the policy plane.

    P:v1:agent:<ns>/<instance>   STRING  the heartbeat (JSON), expires after ``ttl`` seconds
    P:v1:agent:index             ZSET    "<ns>/<instance>" -> when it expires (epoch ms)
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
- A reader drops a heartbeat whose ``ts + ttl`` has passed even if Redis has not expired
  it yet, and skips a ``v`` it does not know.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

__all__ = [
    "AGENTS_CHANNEL",
    "HEARTBEAT_VERSION",
    "AppliedRef",
    "Heartbeat",
    "RefusalCount",
    "heartbeat_index_key",
    "heartbeat_key",
    "decode_heartbeats",
    "read_heartbeats",
    "served_namespaces_key",
]

HEARTBEAT_VERSION = 1
AGENTS_CHANNEL = "agents:events"
Posture = Literal["ok", "degraded", "closed", "unknown"]


def heartbeat_key(prefix: str, id_: str) -> str:
    """``P:v1:agent:<ns>/<instance>`` (``prefix`` is ``P:v1``)."""
    return f"{prefix}:agent:{id_}"


def heartbeat_index_key(prefix: str) -> str:
    return f"{prefix}:agent:index"


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
    ids = [m.decode() if isinstance(m, bytes) else str(m)
           for m in client.zrangebyscore(heartbeat_index_key(prefix), int(now * 1000), "+inf")]
    raws = client.mget([heartbeat_key(prefix, i) for i in ids]) if ids else []
    return decode_heartbeats(ids, raws, now)


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
