"""Predictive pre-execution: run a REVERSIBLE step before the model asks for it.

While the model is still deciding, an agent may run a step it is likely to ask for (a
search, a quote, a read) so the answer is ready. The result is held behind a lease: an
HMAC-SHA256 tag, under a key only this process holds, over (intent, tool, arguments
digest, expiry, lease id). When the model does ask, ``redeem`` hands the result back only
if the lease verifies and names exactly that intent, tool and arguments::

    spec = Speculator(wal=wal, ttl=30)
    lease = await spec.speculate("intent-7", "search_docs", search, {"q": "refund policy"},
                                 semantics="REVERSIBLE")
    ...                                     # the model decides
    result = await spec.redeem(lease.token, intent="intent-7", tool="search_docs",
                               args={"q": "refund policy"})
    await spec.sweep()                      # rolls back what nobody redeemed in time

Refused, always (``SpeculationRefused``, ``code`` saying which): a step that is not
REVERSIBLE (a charge must wait for the decision: nothing may be done ahead of it that
cannot be undone); a lease whose tag does not verify (forged or altered); a lease of
another intent (cross-intent); other arguments or another tool; a lease past its expiry
(stale: its result is rolled back); a lease already redeemed or discarded.

Invariants:
- The HMAC key never leaves the process: not in a lease, a record, a log line or a repr.
  Tags are compared in constant time (``hmac.compare_digest``).
- A lease is redeemed at most once; an unredeemed speculation is rolled back (its
  ``undo`` is called with the result) when it expires (``sweep``), is discarded, or the
  speculator closes. An ``undo`` that raises is logged and recorded, never hidden.
- WAL records (``SPECULATION_STARTED`` / ``_REDEEMED`` / ``_REFUSED`` / ``_ROLLED_BACK``,
  saga ``speculation``) carry the lease id, intent, tool, arguments digest and expiry.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import inspect
import json
import logging
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .clocks import SYSTEM_CLOCK, ControlClock, format_instant
from .errors import ConfigurationError, SagaRefused
from .records import canonical_json
from .semantics import ActionSemantics
from .wal.base import BaseWAL

__all__ = ["Lease", "SpeculationRefused", "Speculator", "arguments_digest"]

log = logging.getLogger("agent_saga.speculation")

SPECULATION_SAGA = "speculation"
STARTED, REDEEMED, REFUSED, ROLLED_BACK = ("SPECULATION_STARTED", "SPECULATION_REDEEMED", "SPECULATION_REFUSED",
                                           "SPECULATION_ROLLED_BACK")
_DOMAIN = b"agent-saga.speculation-lease/v1\n"


def arguments_digest(tool: str, args: Mapping[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of the tool and its exact arguments."""
    return "sha256:" + hashlib.sha256(canonical_json({"tool": tool, "args": dict(args)}).encode()).hexdigest()


class SpeculationRefused(SagaRefused):
    """A speculation that may not run or a lease that may not be redeemed. ``code``:
    ``not-reversible``, ``forged``, ``cross-intent``, ``other-action``, ``stale``,
    ``spent``; the message says which and why."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True, slots=True)
class Lease:
    """A claim on one speculative result (``token`` is what the caller hands back)."""

    lease_id: str
    intent: str
    tool: str
    args_digest: str
    expires_at: float
    tag: str

    def body(self) -> dict[str, Any]:
        """The fields the tag covers."""
        return {"id": self.lease_id, "intent": self.intent, "tool": self.tool, "args": self.args_digest,
                "exp": repr(float(self.expires_at))}

    @property
    def token(self) -> str:
        """The lease as one opaque string (base64url JSON of the body and the tag)."""
        raw = canonical_json({**self.body(), "tag": self.tag}).encode()
        return base64.urlsafe_b64encode(raw).decode()

    @classmethod
    def from_token(cls, token: str) -> Lease:
        """Read a token; raises ``SpeculationRefused`` (``forged``) for anything malformed."""
        try:
            doc = json.loads(base64.urlsafe_b64decode(token.encode()))
            return cls(str(doc["id"]), str(doc["intent"]), str(doc["tool"]), str(doc["args"]),
                       float(doc["exp"]), str(doc["tag"]))
        except (ValueError, KeyError, TypeError, AttributeError):
            raise SpeculationRefused("forged", "the lease token cannot be read: it was not issued here") from None


@dataclass
class _Held:
    lease: Lease
    result: Any
    undo: Callable[[Any], Any] | None


class Speculator:
    """Runs REVERSIBLE steps ahead of the decision and holds their results behind leases.

    ``key``: the HMAC key (32 random bytes by default, made here and never exported;
    pass your own only to share leases between processes you trust). ``ttl``: seconds a
    lease stays redeemable. ``wal``: where speculations are recorded (optional).
    ``clock``: the time seam."""

    def __init__(self, *, key: bytes | None = None, ttl: float = 30.0, wal: BaseWAL | None = None,
                 clock: ControlClock | None = None) -> None:
        if key is not None and (not isinstance(key, bytes) or len(key) < 16):
            raise ConfigurationError("Speculator key must be at least 16 bytes (default: 32 random bytes)")
        if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl < math.inf:
            raise ConfigurationError(f"Speculator ttl must be a positive number of seconds, got {ttl!r}")
        if wal is not None and not isinstance(wal, BaseWAL):
            raise ConfigurationError(f"Speculator wal must be a WAL (FileWAL, RedisWAL, ...), got {wal!r}")
        self.__key = key or secrets.token_bytes(32)
        self.ttl = float(ttl)
        self.wal = wal
        self._clock = clock or SYSTEM_CLOCK
        self._held: dict[str, _Held] = {}

    def __repr__(self) -> str:
        return f"Speculator(ttl={self.ttl:g}, pending={len(self._held)})"

    @property
    def pending(self) -> int:
        """How many speculative results are held, unredeemed."""
        return len(self._held)

    def _tag(self, lease: Lease) -> str:
        return hmac.new(self.__key, _DOMAIN + canonical_json(lease.body()).encode(), hashlib.sha256).hexdigest()

    def _record(self, type_: str, lease: Lease | None, **extra: Any) -> None:
        if self.wal is None:
            return
        about = {} if lease is None else {"lease_id": lease.lease_id, "intent": lease.intent, "tool": lease.tool,
                                          "args_digest": lease.args_digest,
                                          "expires_at": format_instant(lease.expires_at)}
        self.wal.append(type_, SPECULATION_SAGA, None, {**about, **extra})

    async def speculate(self, intent: str, tool: str, forward: Callable[..., Any], args: Mapping[str, Any], *,
                        semantics: ActionSemantics | str, undo: Callable[[Any], Any] | None = None) -> Lease:
        """Run ``forward(**args)`` now and hold its result behind a new lease.

        Only a REVERSIBLE step may be speculated (anything else is refused before it
        runs). ``undo(result)`` rolls it back when nobody redeems it. If ``forward``
        raises, the error propagates and nothing is held."""
        sem = str(getattr(semantics, "value", semantics)).upper()
        if sem != ActionSemantics.REVERSIBLE.value:
            self._record(REFUSED, None, intent=intent, tool=tool, code="not-reversible", semantics=sem)
            raise SpeculationRefused("not-reversible", f"{tool} is {sem}: only REVERSIBLE steps may run before the "
                                     f"model decides (an effect that cannot be undone waits for the decision)")
        if not intent or not tool:
            raise ConfigurationError("speculate needs an intent and a tool name")
        digest = arguments_digest(tool, args)
        unsigned = Lease(secrets.token_hex(16), intent, tool, digest, self._clock.time() + self.ttl, "")
        lease = Lease(unsigned.lease_id, intent, tool, digest, unsigned.expires_at, self._tag(unsigned))
        result = forward(**dict(args))
        if inspect.isawaitable(result):
            result = await result
        self._held[lease.lease_id] = _Held(lease, result, undo)
        self._record(STARTED, lease)
        return lease

    async def redeem(self, lease: Lease | str, *, intent: str, tool: str, args: Mapping[str, Any]) -> Any:
        """The speculative result, if ``lease`` verifies and names exactly this intent,
        tool and arguments, before its expiry, once; else ``SpeculationRefused``."""
        try:
            return self._take(Lease.from_token(lease) if isinstance(lease, str) else lease, intent, tool, args)
        except SpeculationRefused as exc:
            self._record(REFUSED, lease if isinstance(lease, Lease) else None, code=exc.code, why=exc.message,
                         asked_intent=intent, asked_tool=tool)
            if exc.code == "stale":
                await self.sweep()
            raise

    def _take(self, lease: Lease, intent: str, tool: str, args: Mapping[str, Any]) -> Any:
        if not hmac.compare_digest(self._tag(lease), lease.tag):
            raise SpeculationRefused("forged", f"lease {lease.lease_id[:8]} does not verify: it was forged, altered "
                                     f"or issued by another speculator")
        if lease.intent != intent:
            raise SpeculationRefused("cross-intent", f"lease {lease.lease_id[:8]} was issued for intent "
                                     f"{lease.intent!r}, not {intent!r}: a speculation serves only its own intent")
        if lease.tool != tool or lease.args_digest != arguments_digest(tool, args):
            raise SpeculationRefused("other-action", f"lease {lease.lease_id[:8]} is for {lease.tool} with other "
                                     f"arguments than {tool} asked now: run the call for real")
        held = self._held.get(lease.lease_id)
        if held is None:
            raise SpeculationRefused("spent", f"lease {lease.lease_id[:8]} was already redeemed or rolled back")
        if self._clock.time() >= lease.expires_at:
            raise SpeculationRefused("stale", f"lease {lease.lease_id[:8]} expired at "
                                     f"{format_instant(lease.expires_at)}: its result is rolled back")
        del self._held[lease.lease_id]
        self._record(REDEEMED, lease)
        return held.result

    async def discard(self, lease: Lease | str) -> bool:
        """Roll back one unredeemed speculation now; False if it was not held."""
        lid = (Lease.from_token(lease) if isinstance(lease, str) else lease).lease_id
        held = self._held.pop(lid, None)
        if held is None:
            return False
        await self._undo(held, "discarded")
        return True

    async def sweep(self) -> int:
        """Roll back every speculation past its expiry; returns how many."""
        now = self._clock.time()
        stale = [lid for lid, h in self._held.items() if now >= h.lease.expires_at]
        for lid in stale:
            held = self._held.pop(lid, None)
            if held is not None:
                await self._undo(held, "expired")
        return len(stale)

    async def close(self) -> None:
        """Roll back everything still held (call it when the agent's turn ends)."""
        for lid in list(self._held):
            held = self._held.pop(lid, None)
            if held is not None:
                await self._undo(held, "closed")

    async def _undo(self, held: _Held, why: str) -> None:
        error = None
        if held.undo is not None:
            try:
                out = held.undo(held.result)
                if inspect.isawaitable(out):
                    await out
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - recorded, never hidden
                error = f"{type(exc).__name__}: {exc}"
                log.error("speculation %s (%s): undo failed: %s", held.lease.lease_id[:8], held.lease.tool, error)
        self._record(ROLLED_BACK, held.lease, why=why, **({"undo_error": error} if error else {}))
