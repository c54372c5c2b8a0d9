"""The Approval bridge: requests agents write to Redis become ``Approval`` resources, and
decisions made anywhere show on them.

Two directions (docs/approvals.md, docs/policy-plane.md "Approvals"):

    agent --RedisApprovalStore--> P:v1:approval:request:<id> + P:v1:approval:pending
          --bridge (this module)--> Approval/<id> in the request's namespace
    kubectl patch spec.decision --kopf update--> reconcile_approval --LUA_DECIDE-->
          P:v1:approval:decision:<id> (written once) --> the waiting agent
    agent-saga approvals approve (writes Redis directly) --notification--> bridge
          --> reconcile_approval reads the stored decision --> the Approval's status

The bridge is one task per operator process: it subscribes to ``P:v1:events`` and, every
``interval`` seconds anyway (pub/sub is at-most-once), reads the pending set and the
unmirrored set (requests no operator has mirrored yet: one decided or expired while no
operator ran is no longer pending, and still becomes an Approval, showing its decision).

Invariants:
- The Approval's name is the request id (32 lower-case hex, a valid name): creating it
  twice is a 409 the bridge treats as done, so a restarted operator, or a second
  replica, never makes a duplicate.
- The bridge never writes a decision itself: decisions go through ``LUA_DECIDE``
  (written once) in ``reconcile_approval``, which also reflects one made elsewhere.
- A request leaves the unmirrored set only once its Approval exists (created, or a 409),
  or its document has expired: a crash in between mirrors it again, as a 409.
- What the Approval shows is rendered from the request's canonical arguments, escaped
  (``agent_saga.controls.approvals._render``), after checking they hash to its digest; a
  request that fails the check shows no action, only why, and is never approvable
  (``reconcile_approval`` refuses to write an approval of it). A request found under an
  agent's name is taken only if it is that agent's (``owner_problem``).
- Requests in namespaces this operator does not watch are left alone (another operator,
  or nobody, answers them; the agent's deadline still denies), in both sets.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from .config import Context
from .keys_configmap import KeysConfigMap
from .metrics import Waiting
from .models import API_VERSION, GROUP, VERSION

__all__ = ["ApprovalBridge", "approval_object"]

log = logging.getLogger("agent_saga_operator.bridge")

PLURAL = "approvals"
AGENT_LABEL = f"{GROUP}/agent"


def _clip(text: Any, n: int) -> str:
    return str(text or "")[:n]


#: The display key that says what an Approval does not show (and how to see it).
MORE_KEY = "(not shown)"
#: The display key that says why an Approval's action cannot be shown nor approved.
REFUSED_KEY = "(refused)"


#: Characters of a field's name an Approval shows (a longer name makes it NotAllShown).
KEY_SHOWN = 200


def approval_problem(request: Mapping[str, Any]) -> tuple[str, str] | None:
    """Why this request cannot be approved from an Approval (reason, message), or ``None``.

    ``ActionMismatch``: its arguments are missing or do not hash to its digest (what it
    would show is not what the agent will do); ``NotAllShown``: its action has more than
    an Approval can show (approve it with ``agent-saga approvals approve ID --show-all``)."""
    from agent_saga.controls.approvals import ApprovalRequest

    try:
        view = ApprovalRequest.from_doc(request).action_view()
    except ValueError as e:
        return "ActionMismatch", str(e)
    if view.truncated or any(len(k) > KEY_SHOWN for k, _ in view.fields):
        rid = str(request.get("requestId"))
        return "NotAllShown", (f"the action has more than an Approval shows ({len(view.fields)} fields, names of at "
                               f"most {KEY_SHOWN} characters): see it with agent-saga approvals show {rid[:8]} "
                               f"--show-all and approve it there with --show-all")
    return None


def _display(request: Mapping[str, Any]) -> dict[str, str]:
    """The action as the Approval shows it: rendered from the canonical arguments,
    escaped; what is left out (or why nothing is shown) is said in a field of its own."""
    from agent_saga.controls.approvals import FIELDS_SHOWN, VALUE_SHOWN, ApprovalRequest

    try:
        view = ApprovalRequest.from_doc(request).action_view()
    except ValueError as e:
        return {REFUSED_KEY: _clip(f"not approvable: {e}", VALUE_SHOWN)}
    out = {}
    for k, v in view.fields[:FIELDS_SHOWN - 1]:
        cut = f"... [{len(v)} characters: see agent-saga approvals show --show-all]"
        out[_clip(k, KEY_SHOWN)] = v if len(v) <= VALUE_SHOWN else v[:VALUE_SHOWN - len(cut)] + cut
    problem = approval_problem(request)
    if problem is not None:
        out[MORE_KEY] = _clip(problem[1], VALUE_SHOWN)
    elif len(view.fields) == FIELDS_SHOWN:
        k, v = view.fields[-1]
        out[_clip(k, KEY_SHOWN)] = v
    return out


async def read_request(client: Any, prefix: str, request_id: str) -> dict[str, Any] | None:
    """The request document ``request_id`` (``RedisApprovalStore``'s keys): kept under its
    agent's name, and that agent's (``owner_problem``), else the shared-mode key."""
    from agent_saga.controls.approvals import ApprovalRequest

    marker = f"{prefix}:v1:approval:request:"
    if not request_id or any(c in request_id for c in "*?[]\\/"):
        return None
    async for raw_key in client.scan_iter(match=f"{marker}*/{request_id}", count=1000):
        key = raw_key.decode() if isinstance(raw_key, bytes) else str(raw_key)
        raw = await client.get(key)
        if raw is None:
            continue
        try:
            doc = json.loads(raw)
            problem = ApprovalRequest.from_doc(doc).owner_problem(key[len(marker):].rsplit("/", 1)[0])
        except (ValueError, TypeError):
            continue
        if problem is None:
            return dict(doc)
        log.warning("approval request %s: the document at %s is ignored: %s", request_id, key, problem)
    raw = await client.get(marker + request_id)
    if raw is None:
        return None
    doc = json.loads(raw)
    if not isinstance(doc, dict) or doc.get("owner"):
        raise ValueError("a request kept under the shared key names an agent: not that agent's")
    return doc


def approval_object(request: Mapping[str, Any]) -> dict[str, Any]:
    """The ``Approval`` resource mirroring one request document (docs/approvals.md)."""
    spec: dict[str, Any] = {
        "requestId": request["requestId"],
        "tool": request["tool"],
        "sagaId": request["sagaId"],
        "stepId": _clip(request["stepId"], 128),
        "rule": _clip(request["rule"], 100),
        "argumentsDigest": request["argumentsDigest"],
        "requestedAt": request["requestedAt"],
        "deadline": request["deadline"],
    }
    from agent_saga.controls.approvals import escape_text

    if request.get("reason"):
        spec["reason"] = _clip(escape_text(str(request["reason"])), 500)
    if request.get("challenge"):  # approvals must be signed with a passkey: kubectl can only deny
        spec["passkeyRequired"] = True
    display = _display(request)
    if display:
        spec["display"] = display
    labels = {}
    agent = "".join(c if c.isalnum() or c in "-_." else "-" for c in str(request.get("agent") or ""))[:63]
    if agent.strip("-_."):
        labels[AGENT_LABEL] = agent.strip("-_.")
    return {
        "apiVersion": API_VERSION,
        "kind": "Approval",
        "metadata": {"name": request["requestId"], "namespace": request.get("namespace") or "default",
                     "labels": labels},
        "spec": spec,
    }


class ApprovalBridge:
    """Mirrors pending requests into Approvals and nudges reconciliation of decisions.

    ``reflect(namespace, name)`` is the callback that brings one Approval's status in
    line with the policy plane (the handlers pass one built on ``reconcile_approval``).
    """

    def __init__(self, ctx: Context, api_client: Any, *, interval: float,
                 reflect: Callable[[str, str], Any]) -> None:
        from kubernetes import client

        self.ctx = ctx
        self.api = client.CustomObjectsApi(api_client)
        self.interval = interval
        self.reflect = reflect
        self.keys = ctx.projector.keys
        self.mirrored: dict[str, str] = {}  # request id -> namespace, created or found
        self.refused: set[str] = set()      # the API server refused the object: not retried
        self.created = 0
        self.keys_configmap = KeysConfigMap(api_client, ctx.config.approval_keys_configmap, ctx.published_keys)

    def watches(self, namespace: str) -> bool:
        """Does this operator mirror approval requests of ``namespace``?"""
        return self.ctx.config.clusterwide or namespace in self.ctx.config.namespaces

    # ------------------------------------------------------------------ one pass
    async def sync(self) -> None:
        """Mirror every pending request not mirrored yet; reflect the ones decided since."""
        if await self.ctx.projector.publish_keys(self.ctx.published_keys):
            log.info("published %d trusted approver key(s) for agents: %s", len(self.ctx.published_keys),
                     ", ".join(sorted(self.ctx.published_keys)) or "none")
        await self.keys_configmap.sync()
        loaded = await self.ctx.projector.preload_scripts()
        if loaded:
            log.info("loaded %d runtime script(s) agents run by SHA (their ACL may forbid loading them)", loaded)
        client = self.ctx.projector.client
        raw_ids = await client.zrange(self.keys.pending, 0, -1)
        pending = {i.decode() if isinstance(i, bytes) else str(i) for i in raw_ids}
        # Requests no operator has mirrored yet, decided or not; those whose documents
        # have expired leave first (nothing is left to mirror).
        await client.zremrangebyscore(self.keys.unmirrored, "-inf", f"({time.time()!r}")
        raw_ids = await client.zrange(self.keys.unmirrored, 0, -1)
        unmirrored = {i.decode() if isinstance(i, bytes) else str(i) for i in raw_ids}
        for request_id in sorted((pending | unmirrored) - self.mirrored.keys() - self.refused):
            await self.mirror(request_id)
        for request_id in self.ctx.waiting.keys() - pending:
            del self.ctx.waiting[request_id]
        for request_id in sorted(self.mirrored.keys() - pending):
            namespace = self.mirrored.pop(request_id)
            await self._reflect(namespace, request_id)

    def _waits(self, request_id: str, request: Mapping[str, Any]) -> None:
        """Export a mirrored request as waiting (``metrics.Waiting``) while it is pending."""
        from agent_saga.clocks import parse_instant

        asked, deadline = parse_instant(request.get("requestedAt")), parse_instant(request.get("deadline"))
        if asked is not None and deadline is not None:
            self.ctx.waiting[request_id] = Waiting(str(request.get("namespace") or "default"),
                                                   str(request.get("tool") or ""), asked, deadline)

    async def mirror(self, request_id: str) -> None:
        """Create ``Approval/<request id>`` for one request (a 409 means it exists)."""
        from kubernetes.client.exceptions import ApiException

        client = self.ctx.projector.client
        try:
            request = await read_request(client, self.keys.prefix, request_id)
            if request is None:
                await client.zrem(self.keys.unmirrored, request_id)  # expired: nothing to mirror
                return
            obj = approval_object(request)
        except (ValueError, KeyError, TypeError) as e:
            log.warning("approval request %s is unreadable (%s): not mirrored", request_id, e)
            self.refused.add(request_id)
            return
        namespace = obj["metadata"]["namespace"]
        if not self.watches(namespace):
            self.refused.add(request_id)
            return
        try:
            await asyncio.to_thread(self.api.create_namespaced_custom_object, GROUP, VERSION, namespace, PLURAL, obj)
            self.created += 1
            log.info("approval request %s (%s in saga %s) mirrored as Approval %s/%s",
                     request_id, obj["spec"]["tool"], obj["spec"]["sagaId"], namespace, request_id)
        except ApiException as e:
            if e.status == 409:
                pass  # already mirrored (by us before a restart, or by a peer)
            elif e.status in (400, 403, 404, 422):
                log.warning("approval request %s cannot be mirrored into %s (%s %s): %s", request_id,
                            namespace, e.status, e.reason, _clip(e.body, 500))
                self.refused.add(request_id)
                return
            else:
                raise
        await client.zrem(self.keys.unmirrored, request_id)  # the Approval exists
        self.mirrored[request_id] = namespace
        self._waits(request_id, request)

    async def _reflect(self, namespace: str, request_id: str) -> None:
        try:
            result = self.reflect(namespace, request_id)
            if asyncio.iscoroutine(result):
                await result
        except Exception as e:  # noqa: BLE001 - the resync timer reflects it later anyway
            log.warning("could not reflect the decision on Approval %s/%s: %s", namespace, request_id, e)

    async def on_notification(self, data: Any) -> None:
        """Mirror the request a change notification names (others are ignored)."""
        try:
            doc = json.loads(data)
        except (TypeError, ValueError):
            return
        if not isinstance(doc, dict):
            return
        kind, request_id = doc.get("kind"), str(doc.get("id") or "")
        if kind == "ApprovalRequest" and request_id and request_id not in self.mirrored:
            await self.mirror(request_id)
        elif kind == "ApprovalDecision" and request_id:
            self.ctx.waiting.pop(request_id, None)
            namespace = self.mirrored.pop(request_id, None)
            if namespace is None:
                with contextlib.suppress(ValueError, TypeError):
                    doc = await read_request(self.ctx.projector.client, self.keys.prefix, request_id)
                    namespace = (doc.get("namespace") or "default") if doc else None
            if namespace is not None and self.watches(namespace):
                await self._reflect(namespace, request_id)

    # ------------------------------------------------------------------ the loop
    async def run(self, stopped: asyncio.Event) -> None:
        """Until ``stopped``: subscribe, sync, then sync on every notification and every
        ``interval`` seconds. Redis or API failures are logged and retried."""
        while not stopped.is_set():
            pubsub = None
            try:
                pubsub = self.ctx.projector.client.pubsub()
                await pubsub.subscribe(self.keys.channel)  # before the first read: nothing missed
                await self.sync()
                next_sync = asyncio.get_running_loop().time() + self.interval
                while not stopped.is_set():
                    timeout = max(0.0, next_sync - asyncio.get_running_loop().time())
                    msg = await pubsub.get_message(ignore_subscribe_messages=True, timeout=min(timeout, 1.0))
                    if msg is not None and msg.get("type") == "message":
                        await self.on_notification(msg.get("data"))
                    if asyncio.get_running_loop().time() >= next_sync:
                        await self.sync()
                        next_sync = asyncio.get_running_loop().time() + self.interval
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - logged, retried
                log.warning("approval bridge: %s: %s; retrying in %.1fs", type(e).__name__, e, self.interval)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopped.wait(), timeout=self.interval)
            finally:
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()


def utcnow() -> datetime:
    return datetime.now(UTC)
