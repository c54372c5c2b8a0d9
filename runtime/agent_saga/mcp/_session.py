"""One client session's tool calls as saga steps: the gate, the WAL, the boundary.

Every ``tools/call`` of a declared tool is a ``Saga.execute`` step: the gate decides
(kill switch, breaker, the SagaPolicies, limits, rules, approvals) with the call's
``arguments`` as its policy arguments (a policy's ``policyArgs`` paths read them), the
intent is logged, the call goes to the upstream, and for a COMPENSABLE tool the inverse
derived from the result — another tool of the same server, its arguments by JSONPath —
is durable in the WAL before the client sees the answer.

What the engine is told about a tool (the proxy has no code of its own to declare it):
a tool some policy declares runs as the policy says (the gate tightens the step to the
policy's semantics; a ``compensate: {tool: ...}`` becomes the step's compensation,
handler ``mcp:<name>``); a tool no policy declares is IRREVERSIBLE (the gate refuses it
when ``undeclaredTools`` is ``Refuse``, the default).

The inverse's arguments are built when the call answers, from the call's ``arguments``
(``compensate.callArgs``), the policy's constants (``values``) and the result
(``args``): the call's ``structuredContent``, else the first text content parsed as JSON,
else the whole ``result``. They are in the WAL with the step (the compensation
descriptor), so a recovery process after a crash runs the same inverse.

Boundaries (``--boundary``): ``session`` — one saga per session: a clean end commits it,
anything else rolls it back; ``explicit`` — the same, and ``saga_commit`` /
``saga_rollback`` end the current saga (the next call opens a new one); ``none`` — one
saga per call, completed whatever happened: gate, limits and audit, never a rollback.

Invariants:
- A call the gate refused was not sent: the client gets error ``REFUSED`` with the reason.
- A call whose answer cannot arrive (the upstream died, the client cancelled it) is
  STEP_UNKNOWN and its client gets ``OUTCOME_UNKNOWN``: never assumed not to have happened.
- The saga's scope lives in one task of its own (``_SagaOwner``); calls run as sibling
  steps, so 32 concurrent calls are 32 steps of one saga.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from ..compensation import Compensation
from ..controls.policy import Compensate, PolicySource
from ..errors import CompensationError, ConfigurationError, SagaError, SagaRefused
from ..gates import Gate
from ..rollback import RollbackReport
from ..scope import saga_scope
from ..semantics import ActionSemantics
from ..wal.base import BaseWAL
from ._stdio import StdioUpstream, UpstreamGone, tool_result
from ._wire import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    OUTCOME_UNKNOWN,
    REFUSED,
    UPSTREAM_UNAVAILABLE,
    error,
)
from .upstreams import IDEMPOTENCY_META, UpstreamSpec, handler_name

__all__ = ["COMMIT_TOOL", "ROLLBACK_TOOL", "Boundary", "OutcomeUnknown", "ToolSession"]

log = logging.getLogger("agent_saga.mcp")

Boundary = Literal["session", "explicit", "none"]
COMMIT_TOOL = "saga_commit"
ROLLBACK_TOOL = "saga_rollback"
BOUNDARY_TOOLS: tuple[dict[str, Any], ...] = (
    {"name": COMMIT_TOOL, "description": (
        "Commit the work done since the last commit: those calls will not be undone. Call it when the task "
        "succeeded."), "inputSchema": {"type": "object", "properties": {}}},
    {"name": ROLLBACK_TOOL, "description": (
        "Undo the calls made since the last commit: each undoable call is compensated, in reverse order; calls "
        "that cannot be undone are reported. Call it when the task failed."),
     "inputSchema": {"type": "object", "properties": {}}},
)


class OutcomeUnknown(BaseException):  # noqa: N818 - a BaseException: the engine records STEP_UNKNOWN
    """The call was sent and its answer will never arrive (the upstream died, the client
    cancelled it): it may have happened."""


class _ToolFailed(Exception):
    """The upstream answered with an error or ``isError``: the step did not complete."""

    def __init__(self, response: dict[str, Any]) -> None:
        super().__init__(_describe(response))
        self.response = response


class SessionDropped(Exception):  # noqa: N818 - the cause a rollback records
    """The client session did not end cleanly: what the saga is rolled back for."""


def result_document(result: Any) -> Any:
    """What a ``compensate.args`` path reads (see the module doc)."""
    if not isinstance(result, dict):
        return result
    structured = result.get("structuredContent")
    if isinstance(structured, dict):
        return structured
    for c in result.get("content") or ():
        if isinstance(c, dict) and c.get("type") == "text" and isinstance(c.get("text"), str):
            try:
                doc = json.loads(c["text"])
            except ValueError:
                break
            if isinstance(doc, dict | list):
                return doc
            break
    return result


class _SagaOwner:
    """One saga's scope, held open by a task of its own until ``end``."""

    def __init__(self, scope: Any) -> None:
        self._scope = scope
        self._end: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
        self.ready: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self.task = asyncio.ensure_future(self._hold())

    async def _hold(self) -> None:
        try:
            async with self._scope as saga:
                self.ready.set_result(saga)
                cause = await self._end
                if cause is not None:
                    raise cause
        except BaseException as exc:
            if not self.ready.done():
                self.ready.set_exception(exc)
            raise

    async def end(self, cause: BaseException | None) -> tuple[Any, BaseException | None]:
        """Commit (``cause`` None) or roll back; the saga and what its scope raised."""
        saga = self.ready.result() if self.ready.done() and not self.ready.exception() else None
        if not self._end.done():
            self._end.set_result(cause)
        try:
            await self.task
        except BaseException as exc:  # noqa: BLE001 - the rollback re-raises its cause
            return saga, None if exc is cause else exc
        return saga, None


class ToolSession:
    """The tool calls of one client session (see the module doc)."""

    def __init__(self, *, wal: BaseWAL, gate: Gate | None, policy: PolicySource | None, boundary: Boundary,
                 upstream_name: str, upstream: StdioUpstream | None, spec: UpstreamSpec | None,
                 forward: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]],
                 lease_seconds: float | None = None, agent: str = "mcp-proxy") -> None:
        self.wal = wal
        self.gate = gate
        self.policy = policy
        self.boundary = boundary
        self.upstream_name = upstream_name
        self.upstream = upstream
        self.spec = spec
        self._forward = forward
        self._lease = lease_seconds
        self._agent = agent
        self._owner: _SagaOwner | None = None
        self._opening = asyncio.Lock()
        self.sagas: list[str] = []
        self.reports: list[RollbackReport] = []

    # ------------------------------------------------------------------ the saga
    def _scope(self) -> Any:
        return saga_scope(self.wal, self.gate, name=f"mcp-{self.upstream_name}",
                          tags=("mcp", f"mcp:{self.upstream_name}"), lease_seconds=self._lease)

    async def _saga(self) -> Any:
        async with self._opening:
            if self._owner is None:
                self._owner = _SagaOwner(self._scope())
            owner = self._owner
        try:
            saga = await owner.ready
        except BaseException:
            async with self._opening:
                if self._owner is owner:
                    self._owner = None
            await asyncio.gather(owner.task, return_exceptions=True)
            raise
        if saga.saga_id not in self.sagas:
            self.sagas.append(saga.saga_id)
        return saga

    async def end(self, clean: bool, why: str = "") -> str:
        """End the open saga: commit when ``clean``, else roll back. What happened, in a
        sentence (``""``: no saga was open)."""
        async with self._opening:
            owner, self._owner = self._owner, None
        if owner is None:
            return ""
        cause = None if clean else SessionDropped(why or "the client session ended without a clean shutdown")
        saga, raised = await owner.end(cause)
        if saga is None:
            return f"the saga could not start ({raised})" if raised else ""
        report = saga.rollback_report
        if report is not None:
            self.reports.append(report)
            return str(report.summary())
        if raised is not None:
            return f"saga {saga.saga_id} ended with {type(raised).__name__}: {raised}"
        return f"saga {saga.saga_id} committed ({saga.status})"

    # ------------------------------------------------------------------ one call
    async def call(self, msg: dict[str, Any],
                   forward: Callable[[dict[str, Any]], Awaitable[dict[str, Any]]] | None = None) -> dict[str, Any]:
        """The response to the client's ``tools/call`` request ``msg`` (sent upstream by
        ``forward``, default: the session's)."""
        send = forward or self._forward
        id_ = msg["id"]
        params = msg.get("params")
        if not isinstance(params, dict) or not isinstance(params.get("name"), str) or not params["name"]:
            return error(id_, INVALID_PARAMS, 'tools/call needs params {"name": TOOL, "arguments": {...}}')
        tool = params["name"]
        arguments = params.get("arguments") or {}
        if not isinstance(arguments, dict):
            return error(id_, INVALID_PARAMS, f"tools/call {tool}: arguments must be an object")
        if self.boundary == "explicit" and tool in (COMMIT_TOOL, ROLLBACK_TOOL):
            text = await self.end(tool == COMMIT_TOOL, "saga_rollback was called") or "nothing to do: no call since "\
                "the last commit"
            return {"jsonrpc": "2.0", "id": id_, "result": {"content": [{"type": "text", "text": text}]}}
        semantics, factory = self._declaration(tool, arguments)
        answered: list[dict[str, Any]] = []

        async def step() -> dict[str, Any]:
            resp = await send(msg)
            answered.append(resp)
            if "error" in resp or (isinstance(resp.get("result"), dict) and resp["result"].get("isError") is True):
                raise _ToolFailed(resp)
            return resp

        try:
            if self.boundary == "none":
                async with saga_scope(self.wal, self.gate, name=f"mcp-{self.upstream_name}",
                                      tags=("mcp", f"mcp:{self.upstream_name}"), lease_seconds=self._lease) as one:
                    self.sagas.append(one.saga_id)
                    try:
                        return await self._step(one, tool, semantics, step, factory, arguments, id_, answered)
                    except OutcomeUnknown as exc:  # recorded; no rollback under --boundary none
                        return _unknown(id_, tool, exc)
            saga = await self._saga()
            return await self._step(saga, tool, semantics, step, factory, arguments, id_, answered)
        except OutcomeUnknown as exc:
            return _unknown(id_, tool, exc)
        except SagaRefused as exc:  # the saga itself was refused (a DRAIN): nothing was sent
            return _refusal(id_, tool, getattr(exc, "reason", "") or exc.message, getattr(exc, "decided_by", ""))

    async def _step(self, saga: Any, tool: str, semantics: ActionSemantics, forward: Callable[[], Any],
                    factory: Callable[[Any], Any] | None, arguments: dict[str, Any], id_: Any,
                    answered: list[dict[str, Any]]) -> dict[str, Any]:
        try:
            return await saga.execute(tool, semantics, forward, factory, policy_args=arguments)  # type: ignore[no-any-return]
        except SagaRefused as exc:
            return _refusal(id_, tool, getattr(exc, "reason", "") or exc.message, getattr(exc, "decided_by", ""),
                            exc.step_id)
        except _ToolFailed as exc:
            return exc.response
        except UpstreamGone as exc:  # not sent (STEP_FAILED: it did not happen)
            return error(id_, UPSTREAM_UNAVAILABLE, f"{tool} was not sent: {exc}")
        except CompensationError as exc:
            # The effect happened and is committed; its inverse could not be derived: the
            # rollback escalates it to a human. The client still gets what the tool said.
            log.error("agent-saga mcp: %s: %s", tool, exc.message)
            if answered:
                return answered[0]
            return error(id_, INTERNAL_ERROR, f"agent-saga: {exc.message}")
        except ConfigurationError as exc:  # arguments that cannot be logged (not JSON, a secret): not sent
            return _refusal(id_, tool, exc.message, "agent-saga")
        except SagaError as exc:  # the WAL failed: the call may have happened
            if answered:
                log.error("agent-saga mcp: %s answered, but the log failed: %s", tool, exc.message)
            return error(id_, OUTCOME_UNKNOWN, f"agent-saga could not record {tool}: {exc.message}")

    def _declaration(self, tool: str, arguments: dict[str, Any]
                     ) -> tuple[ActionSemantics, Callable[[Any], Any] | None]:
        """How the engine is told about ``tool`` (see the module doc)."""
        view = self.policy.view() if self.policy is not None else None
        if view is None or not view.usable:
            return ActionSemantics.IRREVERSIBLE, None  # the gate refuses, naming the problem
        declared = False
        for p in view.policies.enforced:
            decl = p.policy.tools.get(tool)
            if decl is None:
                continue
            declared = True
            comp = decl.compensate
            if comp is not None and comp.tool is not None:
                return ActionSemantics.REVERSIBLE, self._factory(tool, comp, arguments)
        if declared:
            return ActionSemantics.REVERSIBLE, None  # the gate tightens it to the policy's semantics
        return ActionSemantics.IRREVERSIBLE, None

    def _factory(self, tool: str, comp: Compensate, arguments: dict[str, Any]
                 ) -> Callable[[Any], Compensation | None]:
        hname = handler_name(self.upstream_name)
        inverse = str(comp.tool)

        def factory(resp: Any) -> Compensation | None:
            if resp is None:
                return None  # the outcome is unknown: nothing to derive from; the rollback escalates
            doc = result_document(resp.get("result") if isinstance(resp, dict) else None)
            kwargs = {"tool": inverse, "arguments": comp.kwargs_for(arguments, doc)}
            return Compensation(fn=self.undo, handler=hname, kwargs=kwargs,
                                description=f"{inverse} on MCP upstream {self.upstream_name} (undoes {tool})")

        return factory

    async def undo(self, tool: str, arguments: Mapping[str, Any], idempotency_key: str | None = None) -> None:
        """Call the inverse ``tool``: over this session's upstream while it runs, else on a
        fresh one (the registered upstream's command)."""
        params: dict[str, Any] = {"name": tool, "arguments": dict(arguments)}
        if idempotency_key:
            params["_meta"] = {IDEMPOTENCY_META: idempotency_key}
        if self.upstream is not None and self.upstream.alive:
            tool_result(await self.upstream.request("tools/call", params), tool)
            return
        if self.spec is None:
            raise RuntimeError(f"the upstream server is gone and no command is known to start it for {tool}")
        await self.spec.call_tool(tool, arguments, idempotency_key)


def _refusal(id_: Any, tool: str, reason: str, decided_by: str, step_id: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"refused": True, "tool": tool, "reason": reason, "decidedBy": decided_by}
    if step_id:
        data["step"] = step_id
    text = reason.rstrip(". ")
    if "nothing was executed" not in text.lower():
        text += ". Nothing was executed"
    return error(id_, REFUSED, f"agent-saga refused {tool}: {text}.", {"agentSaga": data})


def _unknown(id_: Any, tool: str, exc: BaseException) -> dict[str, Any]:
    return error(id_, OUTCOME_UNKNOWN, (
        f"the outcome of {tool} is unknown: {exc}. It may have happened; it is recorded as unknown and is "
        f"never assumed not to have happened. Do not simply retry it."), {"agentSaga": {"unknown": True, "tool": tool}})


def _describe(resp: Mapping[str, Any]) -> str:
    if isinstance(resp.get("error"), dict):
        return f"JSON-RPC error {resp['error'].get('code')}: {resp['error'].get('message')}"
    return "the tool reported an error (isError)"
