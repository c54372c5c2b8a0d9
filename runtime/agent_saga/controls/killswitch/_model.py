"""Kill-switch levers: what an operator pulled, on what, why, by whom, until when.

A ``Lever`` is one engaged HALT, DRAIN or QUARANTINE. It is stored as a policy-plane
document (docs/policy-plane.md, docs/killswitch.md; the operator projects ``KillSwitch``
resources into the same form, with ``rev``, ``uid`` and ``generation`` added)::

    {"v": 1, "kind": "KillSwitch", "id": "cli/halt-3fa2b1c0d4e5-9c1d07ee", "namespace": "cli",
     "name": "halt-3fa2b1c0d4e5-9c1d07ee", "action": "Halt", "scope": "tool:stripe.*",
     "reason": "fraud pattern", "requestedBy": "soc@corp", "ttl": 600,
     "engagedAt": "2025-06-01T03:00:00.000000Z", "expiresAt": "2025-06-01T03:10:00.000000Z"}

Scopes, and what each action may be scoped to:

    global          HALT: every step.           DRAIN: every new saga.
    tool:<glob>     HALT: steps whose tool matches the glob.
    tag:<tag>       HALT: steps of sagas tagged <tag>.   DRAIN: new sagas tagged <tag>.
    saga:<id>       QUARANTINE: that one saga.

Glob rules (tool scopes): the glob must match the WHOLE tool name, case-sensitively.
``*`` matches any run of characters, dots included; ``?`` matches exactly one
character; every other character (``.`` too) matches only itself; there are no
character classes. So ``stripe.*`` matches ``stripe.charge`` and ``stripe.refund.create``
but not ``stripe_mock.x`` nor ``stripe`` itself; ``*.send`` matches ``wire.send``.

Invariants:
- A lever is a frozen value; ``Lever.from_doc`` validates a document and raises
  ``LeverUnreadable`` naming the field, never guesses.
- ``expires_at`` is wall-clock epoch seconds: an instant every process agrees on.
"""

from __future__ import annotations

import enum
import hashlib
import math
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...clocks import format_instant, parse_instant
from ...errors import ConfigurationError
from ...records import ID_PATTERN
from ...scrubber import redact_text

__all__ = [
    "Lever",
    "LeverAction",
    "LeverUnreadable",
    "cli_lever_id",
    "compile_glob",
    "parse_scope",
]

DOC_VERSION = 1

_TOOL_GLOB = re.compile(r"^[A-Za-z0-9_*?][A-Za-z0-9_.:/*?-]{0,252}$")
_TAG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,62}$")
_ID_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$")


class LeverAction(enum.StrEnum):
    """The three levers (a TTL is the fourth, on any of them). Values are the document's."""

    HALT = "Halt"
    DRAIN = "Drain"
    QUARANTINE = "Quarantine"

    @classmethod
    def parse(cls, value: object) -> LeverAction:
        """The action ``value`` names (case-insensitive); raises ``ValueError``."""
        if isinstance(value, LeverAction):
            return value
        if isinstance(value, str):
            for a in cls:
                if value.strip().lower() == a.value.lower():
                    return a
        raise ValueError(f"action must be Halt, Drain or Quarantine, got {value!r}")


_ALLOWED = {
    LeverAction.HALT: ("global", "tool", "tag"),
    LeverAction.DRAIN: ("global", "tag"),
    LeverAction.QUARANTINE: ("saga",),
}


class LeverUnreadable(ValueError):
    """A lever document (or a scope) that cannot be read; the message names the field."""


def parse_scope(scope: object) -> tuple[str, str]:
    """``(kind, value)`` of a scope: ``("global", "")``, ``("tool", glob)``,
    ``("tag", tag)`` or ``("saga", id)``.

    Accepts the text form (``"global"``, ``"tool:wire.send"``, ``"tag:eu"``,
    ``"saga:saga-8f3c"``; empty or ``"*"`` is global) and the object form the
    ``KillSwitch`` resource uses (``{"tool": ...}``, ``{"tag": ...}``, ``{"sagaId": ...}``,
    ``{}``). Raises ``LeverUnreadable`` with what to write instead.
    """
    if scope is None:
        return ("global", "")
    if isinstance(scope, Mapping):
        named = [(k, v) for k, v in scope.items() if v is not None]
        if not named:
            return ("global", "")
        if len(named) > 1:
            raise LeverUnreadable(f"scope {dict(scope)!r} names more than one of tool, tag, sagaId")
        key, value = named[0]
        kind = {"tool": "tool", "tag": "tag", "sagaId": "saga", "saga_id": "saga", "saga": "saga"}.get(str(key))
        if kind is None:
            raise LeverUnreadable(f"scope {dict(scope)!r}: unknown key {key!r} (tool, tag or sagaId)")
        return _check_scope(kind, value)
    if not isinstance(scope, str):
        raise LeverUnreadable(f"scope must be text like 'tool:wire.send', got {scope!r}")
    text = scope.strip()
    if text in ("", "*", "global"):
        return ("global", "")
    kind, sep, value = text.partition(":")
    if not sep or kind not in ("tool", "tag", "saga"):
        raise LeverUnreadable(
            f"scope {scope!r} is not one of: global, tool:<name or glob>, tag:<tag>, saga:<saga id>"
        )
    return _check_scope(kind, value)


def _check_scope(kind: str, value: object) -> tuple[str, str]:
    if not isinstance(value, str) or not value:
        raise LeverUnreadable(f"scope {kind}: needs a value, got {value!r}")
    if kind == "tool" and not _TOOL_GLOB.match(value):
        raise LeverUnreadable(
            f"tool scope {value!r} is not a tool name or glob: letters, digits, _ . - : / and the "
            f"wildcards * and ? (no spaces, no brackets)"
        )
    if kind == "tag" and not _TAG.match(value):
        raise LeverUnreadable(f"tag scope {value!r} is not a tag: letters, digits and _ . : / -")
    if kind == "saga" and not ID_PATTERN.match(value):
        raise LeverUnreadable(f"saga scope {value!r} is not a saga id")
    return (kind, value)


def format_scope(kind: str, value: str) -> str:
    """The canonical text of a scope (``global``, ``tool:wire.send``, ...)."""
    return "global" if kind == "global" else f"{kind}:{value}"


def compile_glob(glob: str) -> re.Pattern[str]:
    """The regular expression of a tool glob (see the module doc for the rules)."""
    out = []
    for ch in glob:
        if ch == "*":
            out.append(".*")
        elif ch == "?":
            out.append(".")
        else:
            out.append(re.escape(ch))
    return re.compile("".join(out), re.DOTALL)


def cli_lever_id(action: LeverAction, scope: str) -> str:
    """A fresh id for a lever the CLI engages on ``scope``: ``cli/<action>-<12 hex>-<8 hex>``.

    The first part is derived from (action, scope), so levers on one scope sort together;
    the second is random, so two operators (two hosts, two processes) halting the same
    scope engage two levers, each with its own who/why/TTL, instead of one silently
    replacing the other. ``resume --scope`` lifts every CLI lever on the scope."""
    kind, value = parse_scope(scope)
    digest = hashlib.sha256(f"{action.value}\n{format_scope(kind, value)}".encode()).hexdigest()[:12]
    return f"cli/{action.value.lower()}-{digest}-{secrets.token_hex(4)}"


@dataclass(frozen=True, slots=True)
class Lever:
    """One engaged lever. ``id`` is ``<namespace>/<name>`` (the ``KillSwitch`` resource's,
    or ``cli/...`` for one engaged with the CLI). ``scope`` is canonical text."""

    id: str
    action: LeverAction
    scope: str
    reason: str
    requested_by: str
    engaged_at: float | None = None
    ttl: float | None = None
    expires_at: float | None = None
    #: The KillSwitch resource's uid and generation (from the operator's document; empty
    #: for a lever engaged with the CLI): what an agent reports it applied.
    uid: str = ""
    generation: int = 0

    @classmethod
    def new(
        cls,
        action: LeverAction | str,
        scope: str,
        *,
        reason: str,
        by: str,
        now: float,
        ttl: float | None = None,
        lever_id: str | None = None,
    ) -> Lever:
        """A lever engaged at ``now`` (epoch seconds); validates everything.

        Raises ``ConfigurationError`` for a missing reason or requester, a bad TTL, a
        scope the action cannot have (a DRAIN by tool, a QUARANTINE not of one saga)."""
        try:
            act = LeverAction.parse(action)
            kind, value = parse_scope(scope)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from exc
        if kind not in _ALLOWED[act]:
            raise ConfigurationError(_combo_error(act, kind))
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigurationError("a lever needs a reason: why it was pulled lands in the WAL")
        if not isinstance(by, str) or not by.strip():
            raise ConfigurationError("a lever needs a requester (--by soc@corp): who pulled it lands in the WAL")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float)
                                or not 0 < ttl < math.inf):
            raise ConfigurationError(f"ttl must be a positive number of seconds, got {ttl!r}")
        canonical = format_scope(kind, value)
        lid = lever_id or cli_lever_id(act, canonical)
        _check_id(lid)
        # The reason is free text shown in refusals, WAL records and the policy plane: a
        # credential pasted into it is redacted before it reaches any of them.
        return cls(lid, act, canonical, redact_text(reason.strip()), by.strip(), now,
                   None if ttl is None else float(ttl), None if ttl is None else now + float(ttl))

    @property
    def kind(self) -> str:
        """``global``, ``tool``, ``tag`` or ``saga``."""
        return parse_scope(self.scope)[0]

    @property
    def value(self) -> str:
        """The scope's value: the tool glob, tag or saga id (``""`` for global)."""
        return parse_scope(self.scope)[1]

    def expired(self, now: float) -> bool:
        """True once the TTL has run out at wall time ``now``."""
        return self.expires_at is not None and now >= self.expires_at

    def to_doc(self) -> dict[str, Any]:
        """The policy-plane document (see the module doc)."""
        ttl: float | int | None = self.ttl
        if ttl is not None and float(ttl).is_integer():
            ttl = int(ttl)
        ns, _, name = self.id.partition("/")
        return {
            "v": DOC_VERSION,
            "kind": "KillSwitch",
            "id": self.id,
            "namespace": ns,
            "name": name,
            "action": self.action.value,
            "scope": self.scope,
            "reason": redact_text(self.reason),  # whoever built the lever: no credential is stored
            "requestedBy": self.requested_by,
            "ttl": ttl,
            "engagedAt": None if self.engaged_at is None else format_instant(self.engaged_at),
            "expiresAt": None if self.expires_at is None else format_instant(self.expires_at),
        }

    def describe(self) -> dict[str, Any]:
        """The document: what WAL records and verdict details carry."""
        return self.to_doc()

    @classmethod
    def from_doc(cls, lever_id: str, doc: object) -> Lever:
        """Read a document; raise ``LeverUnreadable`` naming the field that is wrong."""
        if not isinstance(doc, Mapping):
            raise LeverUnreadable(f"kill switch {lever_id}: the document is not a JSON object")
        v = doc.get("v", DOC_VERSION)
        if v != DOC_VERSION:
            raise LeverUnreadable(f"kill switch {lever_id}: schema v={v!r} is not supported (v={DOC_VERSION})")
        try:
            action = LeverAction.parse(doc.get("action"))
            kind, value = parse_scope(doc.get("scope"))
        except ValueError as exc:
            raise LeverUnreadable(f"kill switch {lever_id}: {exc}") from exc
        if kind not in _ALLOWED[action]:
            raise LeverUnreadable(f"kill switch {lever_id}: {_combo_error(action, kind)}")
        reason, by = doc.get("reason"), doc.get("requestedBy")
        if not isinstance(reason, str) or not isinstance(by, str):
            raise LeverUnreadable(f"kill switch {lever_id}: reason and requestedBy must be text")
        ttl = doc.get("ttl")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, int | float) or ttl <= 0):
            raise LeverUnreadable(f"kill switch {lever_id}: ttl must be a positive number, got {ttl!r}")
        try:
            engaged = parse_instant(doc.get("engagedAt"))
            expires = parse_instant(doc.get("expiresAt"))
        except ValueError as exc:
            raise LeverUnreadable(f"kill switch {lever_id}: engagedAt/expiresAt: {exc}") from exc
        if expires is None and ttl is not None and engaged is not None:
            expires = engaged + float(ttl)
        uid, generation = doc.get("uid"), doc.get("generation")
        return cls(lever_id, action, format_scope(kind, value), reason, by, engaged,
                   None if ttl is None else float(ttl), expires, uid if isinstance(uid, str) else "",
                   generation if isinstance(generation, int) and not isinstance(generation, bool) else 0)


def _combo_error(action: LeverAction, kind: str) -> str:
    if action is LeverAction.QUARANTINE:
        return "a QUARANTINE freezes one saga: scope it saga:<saga id>"
    if kind == "saga":
        return f"a {action.value.upper()} applies to a tool, a tag or everything; to freeze one saga, quarantine it"
    return "a DRAIN starts no new sagas: scope it globally or by tag, not by tool"


def _check_id(lever_id: str) -> None:
    ns, sep, name = lever_id.partition("/")
    if not sep or not _ID_PART.match(ns) or not _ID_PART.match(name):
        raise ConfigurationError(f"lever id {lever_id!r} must be <namespace>/<name> (letters, digits, . _ -)")
