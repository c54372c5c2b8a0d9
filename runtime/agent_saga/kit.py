"""AgentKit: the one-object front door onto the saga engine's guarantees.

    kit = AgentKit(name="checkout")
    charge = kit.safe_tool(stripe_charge, semantics="COMPENSABLE",
                           compensate=lambda r: {"handler": "stripe.refund",
                                                 "kwargs": {"charge_id": r["id"]}})
    async with kit.transaction():
        await charge(amount=4200)      # gated, logged, refunded on any failure

Invariants:
- A wrapped tool called inside ``kit.transaction()`` is exactly one ``Saga.execute`` step
  (same records, same gate, same rollback): AgentKit adds no semantics of its own.
- One shape everywhere: a wrapped tool is awaited (``await tool(...)``), sync or async
  ``fn``, inside or outside a transaction, in a script, a notebook or a test. Outside a
  transaction the call is the original, untouched: same arguments, same value, nothing
  logged. ``tool.sync(...)`` is its twin for sync code outside a transaction.
- ``guarantees()`` states what this configuration enforces, versioned, with an explicit
  ``not_claimed`` list; ``status()`` reports live posture and is never "ok" when a
  safety signal cannot be read (fail closed).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from typing import Any

from .engine import CompensationFactory, Saga
from .errors import ConfigurationError
from .executor import tool_executor_stats
from .gates import Gate
from .retry import RetryPolicy
from .scope import saga_scope
from .semantics import ActionSemantics, coerce_semantics
from .wal.base import BaseWAL

__all__ = ["AgentKit", "GUARANTEES_VERSION"]

GUARANTEES_VERSION = "agent-saga.guarantees/v1"


async def _awaited(result: Any) -> Any:
    return await result

_current: ContextVar[Saga | None] = ContextVar("agent_saga_kit_saga", default=None)

#: ``gate=`` not given: a PreFlightGate over the policy plane when the process is wired to one.
_FROM_ENVIRONMENT: Any = object()


class AgentKit:
    """Wrap tools once, run work in transactions, and read back what is guaranteed.

    Args:
        name: the agent's name; prefixes saga ids (``"{name}-{12 hex}"``).
        wal: the write-ahead log (default: the process-wide WAL, see ``get_default_wal``).
        gate: the pre-flight gate for every step. Default: with ``AGENT_SAGA_REDIS_URL``
            set (or after ``connect_policy_plane``), a ``PreFlightGate()`` over the policy
            plane's kill switch, limits, approvals and SagaPolicies; otherwise none
            (IRREVERSIBLE is refused, and a configured kill switch still applies).
            ``gate=None``: no gate.
        tags: strings shown to the gate for every transaction (e.g. ``("eu",)``).

    Raises ``ConfigurationError`` at construction for a half-configured policy plane
    (the URL set but Redis not answering, a namespace no operator serves).
    """

    def __init__(
        self,
        name: str = "agent",
        *,
        wal: BaseWAL | None = None,
        gate: Gate | None = _FROM_ENVIRONMENT,
        tags: tuple[str, ...] = (),
    ) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigurationError(f"AgentKit name must be a non-empty string, got {name!r}")
        self.name = name
        self._wal = wal
        if gate is _FROM_ENVIRONMENT:
            from .plane import plane_from_env

            gate = None
            if plane_from_env() is not None:
                from .controls import PreFlightGate

                gate = PreFlightGate()
        self.gate = gate
        self.tags = tuple(tags)
        self._tools: dict[str, ActionSemantics] = {}

    @property
    def wal(self) -> BaseWAL:
        """The WAL this kit writes to (the process-wide default unless one was given)."""
        if self._wal is None:
            from .wal import get_default_wal

            return get_default_wal()
        return self._wal

    # ------------------------------------------------------------------ tools

    def safe_tool(
        self,
        fn: Callable[..., Any],
        *,
        semantics: ActionSemantics | str,
        compensate: CompensationFactory | None = None,
        name: str | None = None,
        timeout: float | None = None,
        retry: RetryPolicy | None = None,
        policy_args: Callable[..., Mapping[str, Any]] | None = None,
    ) -> Callable[..., Any]:
        """Wrap ``fn`` (sync or async) as a saga step; return an async callable with
        ``fn``'s name and signature, awaited the same way everywhere.

        ``await tool(**kw)``: inside ``transaction()`` one ``Saga.execute`` step of
        ``fn(**kw)`` (tool name ``name`` or ``fn.__qualname__``); outside one, ``fn(**kw)``
        untouched (same value, nothing logged or gated), whether in ``asyncio.run``, a
        notebook's running loop or an async test. ``tool.sync(**kw)`` is the twin for sync
        code outside a transaction (an async ``fn`` runs under ``asyncio.run``); inside a
        transaction, or for an async ``fn`` inside a running loop, it raises
        ``ConfigurationError`` saying to ``await`` it.
        The gate sees the call's keyword arguments as ``policy_args`` (or what
        ``policy_args(**kw)`` returns), so ``arg_exceeds("amount", ...)`` works unchanged.

        Raises ``ConfigurationError`` now, not at the first call, for a declaration that
        can never run (COMPENSABLE without ``compensate``, IRREVERSIBLE with one).
        """
        if not callable(fn):
            raise ConfigurationError(f"safe_tool needs a callable, got {fn!r}")
        sem = coerce_semantics(semantics)
        if sem is ActionSemantics.COMPENSABLE and compensate is None:
            raise ConfigurationError(
                f"safe_tool({getattr(fn, '__qualname__', fn)!r}): COMPENSABLE needs compensate= "
                f"(a factory over the result, e.g. lambda r: {{'handler': 'x.undo', 'kwargs': {{'id': r['id']}}}})"
            )
        if sem is ActionSemantics.IRREVERSIBLE and compensate is not None:
            raise ConfigurationError(
                f"safe_tool({getattr(fn, '__qualname__', fn)!r}): IRREVERSIBLE takes no compensate= "
                f"(if it can be undone, declare it COMPENSABLE)"
            )
        tool = name or f"{getattr(fn, '__module__', '') or ''}.{getattr(fn, '__qualname__', 'tool')}".lstrip(".")
        self._tools[tool] = sem

        async def in_saga(saga: Saga, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
            if policy_args is not None:
                pargs: Mapping[str, Any] | None = policy_args(*args, **kwargs)
            else:
                pargs = _json_kwargs(kwargs)
            return await saga.execute(
                tool, sem, functools.partial(fn, *args, **kwargs), compensate,
                timeout=timeout, retry=retry, policy_args=pargs,
            )

        @functools.wraps(fn)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            saga = _current.get()
            if saga is None:  # untouched: fn's own call, nothing logged or gated
                result = fn(*args, **kwargs)
                return await result if inspect.isawaitable(result) else result
            return await in_saga(saga, args, kwargs)

        def sync(*args: Any, **kwargs: Any) -> Any:
            if _current.get() is not None:
                raise ConfigurationError(
                    f"{tool}.sync() inside kit.transaction(): a step must be awaited so the saga can gate, "
                    f"log and roll it back; write `await {getattr(fn, '__name__', 'tool')}(...)`"
                )
            result = fn(*args, **kwargs)
            if not inspect.isawaitable(result):
                return result
            try:
                asyncio.get_running_loop()
            except RuntimeError:
                return asyncio.run(_awaited(result))
            close = getattr(result, "close", None)
            if callable(close):
                close()  # never started: no "never awaited" warning on top of this error
            raise ConfigurationError(
                f"{tool}.sync() called inside a running event loop (a notebook, an async test or "
                f"handler) for an async tool: write `await {getattr(fn, '__name__', 'tool')}(...)`"
            )

        wrapper.sync = sync  # type: ignore[attr-defined]
        wrapper.__agent_saga_tool__ = tool  # type: ignore[attr-defined]
        return wrapper

    # ------------------------------------------------------------------ transactions

    @asynccontextmanager
    async def transaction(
        self, name: str | None = None, *, saga_id: str | None = None, tags: tuple[str, ...] = ()
    ) -> AsyncIterator[Saga]:
        """A saga boundary: every wrapped tool called inside is one step of one saga.

        Same guarantees as ``saga_scope`` (LIFO rollback on any exception, the original
        exception re-raised after a clean rollback, ``RollbackIncomplete`` after a partial
        one). Nested transactions are refused: a step belongs to exactly one saga.
        """
        if _current.get() is not None:
            raise ConfigurationError(
                "kit.transaction() is already open in this task: nested sagas are not "
                "supported; run the inner work as steps of the outer transaction"
            )
        async with saga_scope(
            self._wal, self.gate, name or self.name, saga_id=saga_id, tags=self.tags + tuple(tags)
        ) as saga:
            token = _current.set(saga)
            try:
                yield saga
            finally:
                _current.reset(token)

    # ------------------------------------------------------------------ introspection

    def guarantees(self) -> dict[str, Any]:
        """A versioned, machine-readable manifest of what this configuration enforces."""
        wal = self.wal
        durability = wal.stats().durability  # the instance's, e.g. FileWAL(sync=False) says "none"
        durable = not durability.startswith("none")
        gate_name = type(self.gate).__name__ if self.gate is not None else None
        enforced = [
            _g("steps.declared_semantics", True,
               "every side effect is declared REVERSIBLE, COMPENSABLE or IRREVERSIBLE; a "
               "COMPENSABLE step without an inverse is refused before it runs"),
            _g("compensation.runtime_derived", True,
               "the inverse is built from the forward result, after the effect, and is durable "
               "before the step returns"),
            _g("rollback.lifo", True, "any exception in a transaction undoes completed steps newest first"),
            _g("rollback.partial_reported", True,
               "a rollback that leaves anything not restored raises RollbackIncomplete; it is never "
               "reported clean"),
            _g("step.unknown_outcome", True,
               "a timed-out step is UNKNOWN: compensated when possible without its result, "
               "otherwise escalated; never assumed not to have happened"),
            _g("idempotency.deterministic_keys", True,
               "idempotency keys are SHA-256(saga_id, step_id, scope): identical across retries, "
               "processes and hosts"),
            _g("wal.hash_chain", True, "every record commits to its predecessor; `agent-saga verify` names the first break"),
            _g("wal.intent_durable_before_effect", durable,
               f"non-REVERSIBLE intents are durable before the tool runs ({durability})"),
            _g("gate.irreversible_requires_control", True,
               "an IRREVERSIBLE step never runs without a gate that allows it"
               + (f" (gate: {gate_name})" if gate_name else " (no gate: IRREVERSIBLE is refused)")),
            _g("wal.no_secrets", True,
               "values that look like credentials are refused before they reach the log; "
               "handlers receive credential references"),
        ]
        return {
            "version": GUARANTEES_VERSION,
            "agent": self.name,
            "wal": {"backend": type(wal).__name__, "durability": durability},
            "gate": gate_name,
            "tools": {t: s.value for t, s in sorted(self._tools.items())},
            "enforced": enforced,
            "not_claimed": [
                "agent-saga does not make a model smarter or its choices correct",
                "a compensation that returned success is an acknowledgement, not a verified "
                "reversal of the external system's state",
                "IRREVERSIBLE effects that ran are not undone: they are listed as NOT_UNDOABLE",
                "REVERSIBLE steps do not wait for the disk: their records can be lost on kill -9",
                "a sync tool that timed out keeps running in its thread; its outcome is UNKNOWN",
                "the hash chain proves one writer's log intact up to its head; truncation is "
                "detected only against a head recorded elsewhere (verify --head)",
                "after a crash, this process does not resume its sagas: a recovery daemon must",
            ],
        }

    def status(self) -> dict[str, Any]:
        """Live posture. ``ok`` is False when any safety signal cannot be read or is bad."""
        signals: dict[str, Any] = {}
        ok = True
        try:
            st = self.wal.stats()
            healthy = st.failed is None
            signals["wal"] = {
                "ok": healthy, "backend": st.backend, "durability": st.durability,
                "appended_seq": st.appended_seq, "durable_seq": st.durable_seq,
                "pending": st.pending, "failed": st.failed,
            }
            if not healthy:
                signals["wal"]["recovery"] = _wal_recovery(self._wal)
            ok = ok and healthy
        except Exception as exc:  # noqa: BLE001 - unreadable signal: report, fail closed
            signals["wal"] = {"ok": False, "error": f"unreadable: {type(exc).__name__}: {exc}"}
            ok = False
        try:
            ex = tool_executor_stats()
            signals["tool_executor"] = {"ok": True, **_asdict(ex)}
        except Exception as exc:  # noqa: BLE001
            signals["tool_executor"] = {"ok": False, "error": f"unreadable: {type(exc).__name__}: {exc}"}
            ok = False
        gate_status = getattr(self.gate, "status", None)
        if callable(gate_status):
            try:
                detail = gate_status()
                # Limits kept from before a policy-plane data loss are not an ok posture.
                source = detail.get("limit_source_status") if isinstance(detail, dict) else None
                healthy = not (isinstance(source, dict) and source.get("data_lost"))
                signals["gate"] = {"ok": healthy, "detail": detail}
                ok = ok and healthy
            except Exception as exc:  # noqa: BLE001
                signals["gate"] = {"ok": False, "error": f"unreadable: {type(exc).__name__}: {exc}"}
                ok = False
        else:
            signals["gate"] = {"ok": True, "detail": None if self.gate is None else type(self.gate).__name__}
        # The gate's pre-checks (kill switch, breaker): each is a safety signal of its own.
        try:
            checks = tuple(getattr(self.gate, "checks", ()) or ())
        except Exception as exc:  # noqa: BLE001
            signals["checks"] = {"ok": False, "error": f"unreadable: {type(exc).__name__}: {exc}"}
            checks, ok = (), False
        for check in checks:
            name = str(getattr(check, "name", type(check).__name__))
            reader = getattr(check, "status", None)
            if not callable(reader):
                continue
            try:
                detail = reader()
            except Exception as exc:  # noqa: BLE001 - unreadable signal: fail closed
                signals[f"check:{name}"] = {"ok": False, "error": f"unreadable: {type(exc).__name__}: {exc}"}
                ok = False
                continue
            # A kill switch that is degraded (in grace) or closed is not an ok posture.
            healthy = not isinstance(detail, dict) or detail.get("posture", "ok") == "ok"
            signals[f"check:{name}"] = {"ok": healthy, "detail": detail}
            ok = ok and healthy
        return {"ok": ok, "agent": self.name, "signals": signals, "guarantees": GUARANTEES_VERSION}


def _wal_recovery(given: BaseWAL | None) -> str:
    """What happens next to a failed WAL: the policy plane replaces its RedisWAL once
    Redis is back and nothing is in doubt; any other WAL stays failed (fail-stop)."""
    if given is None:
        from .plane import get_plane

        plane = get_plane()
        if plane is not None and plane.wal is not None:
            return plane.wal_recovery or "reopened at the next heartbeat"
    return "fail-stop: open a new WAL (pass it to this kit) to continue"


def _g(id_: str, active: bool, statement: str) -> dict[str, Any]:
    return {"id": id_, "active": active, "statement": statement}


def _asdict(obj: Any) -> dict[str, Any]:
    fields = getattr(obj, "__dataclass_fields__", None)
    if fields is not None:
        return {k: getattr(obj, k) for k in fields}
    if isinstance(obj, Mapping):
        return dict(obj)
    return {"value": repr(obj)}


def _json_kwargs(kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """The call's keyword arguments that are plain JSON scalars, for the gate's rules."""
    out = {k: v for k, v in kwargs.items() if isinstance(v, (str, int, float, bool)) or v is None}
    return out or None
