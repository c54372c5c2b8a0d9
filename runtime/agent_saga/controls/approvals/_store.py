"""Where approval requests and decisions live while a human decides.

``FileApprovalStore`` (one machine: a directory, ``_local``) and ``RedisApprovalStore``
(the policy plane, ``_redis``) hold the two documents of ``_model``: the request, written and updated by agents, and
the decision, written once by whoever decides. The agent that asked waits for the
decision to land in the store; no connection into the agent is ever needed.

Invariants:
- ``decide`` writes a decision only if there is none: a decision, once made, is never
  overwritten, whoever tries (the CLI, the operator, an agent giving up). The one
  exception is an approval the agents ignore (unsigned, or not signed by a key they
  trust, for its approver): a proven decision may replace exactly that document
  (``replaces``), so an unproven approval cannot hold a request hostage until expiry.
- ``update`` changes the request document by compare-and-set (a lock file on disk, a
  Lua script in Redis): two agents never both use one approval.
- ``mark_consumed`` records an approval's use in a place of its own, written once and
  never cleared: resetting the request document's ``consumedAt`` replays nothing.
- A store that cannot be reached raises ``ApprovalStoreUnavailable`` naming it; the
  gateway then denies (approvals fail closed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from ..._identity import process_identity
from ...clocks import format_instant
from ...errors import SagaError, StoreUnavailable
from ._model import ApprovalRequest, Decision
from ._names import name_problem
from ._render import ActionView
from ._signing import ENV_SIGNING_KEY, DecisionSigner, TrustedKeys

__all__ = [
    "ApprovalRefused",
    "ApprovalStore",
    "ApprovalStoreUnavailable",
    "Change",
    "decide_request",
    "resolve_id",
    "unproven",
]


class ApprovalStoreUnavailable(StoreUnavailable):
    """The approval store could not be read or written; ``store`` names it."""

    def __init__(self, message: str, *, store: str) -> None:
        super().__init__(message, store=store)


class ApprovalRefused(SagaError):
    """A decision that cannot be recorded: unknown id, already decided, expired, no
    approver. The message says which and what to do."""


Change = Callable[[ApprovalRequest], "ApprovalRequest | None"]


@runtime_checkable
class ApprovalStore(Protocol):
    """Blocking primitives (the gateway calls them in a worker thread). Each raises
    ``ApprovalStoreUnavailable`` when the store cannot be reached."""

    def describe(self) -> str:
        """A name for messages (never a password)."""

    def create(self, request: ApprovalRequest) -> tuple[ApprovalRequest, bool]:
        """Store ``request`` unless one with its id exists; return (the stored one, created)."""
        ...

    def get(self, request_id: str) -> ApprovalRequest | None:
        """The request with its decision, if any."""
        ...

    def update(self, request_id: str, change: Change) -> ApprovalRequest | None:
        """Apply ``change`` to the request document atomically (compare-and-set, retried on
        a concurrent write); ``change`` returns the new request or ``None`` (no change).
        Returns the request afterwards (``None`` if there is none)."""
        ...

    def decide(self, request_id: str, decision: Decision, *,
               replaces: Decision | None = None) -> ApprovalRequest | None:
        """Write ``decision`` unless the request already has one (or the one it has is
        exactly ``replaces``: an approval judged unproven); return the request with the
        decision that is stored now (``None`` if there is no such request)."""
        ...

    def list(self, *, pending_only: bool = False) -> list[ApprovalRequest]:
        """Requests, newest first (``pending_only``: those without a decision)."""
        ...

    def mark_consumed(self, request: ApprovalRequest, by: str, now: float) -> str | None:
        """Record, once and for good, that ``request``'s approval was used: ``None`` when
        this call recorded it, else the earlier record. Only the request's agent writes it."""
        ...

    def close(self) -> None:
        """Release connections."""


def decide_request(
    store: ApprovalStore,
    request_id: str,
    *,
    approved: bool,
    approver: str,
    now: float,
    note: str | None = None,
    break_glass: bool = False,
    source: str = "",
    signer: DecisionSigner | None = None,
    passkey: Callable[[ApprovalRequest], Mapping[str, Any]] | None = None,
    show_all: bool = False,
    trusted: TrustedKeys | None = None,
) -> ApprovalRequest:
    """Record a human's decision on a pending request (the CLI, ``ApprovalGateway.decide``).

    ``passkey`` makes the approver's assertion over the request's challenge (``sign``
    of ``agent-saga approvals sign``): it is called with the request and returns the
    decision's ``passkey`` field; a request without a challenge is refused.

    ``request_id`` may be a unique prefix. ``signer`` signs the decision (over the request
    id, its action digest and its deadline): agents that trust keys accept an approval
    only when signed by one of them. Raises ``ApprovalRefused`` for no approver, an
    unknown or ambiguous id, a request already decided or past its deadline;
    ``ApprovalStoreUnavailable`` if the store cannot be reached.

    An approval is refused for a request whose arguments do not hash to its digest (it
    was altered: ``ApprovalRequest.action_view``), and for one whose default view leaves
    fields out unless ``show_all`` says the complete action was shown; a signed approval
    covers the tool and the rendered action (``_signing``). A denial needs neither.

    ``trusted``: the approver keys the agents trust (``None``: none known). With them, an
    approval the agents would ignore is refused here (unsigned, signed by a key they do
    not trust, or by a key not bound to ``approver``), and a request holding such an
    ignored approval may be decided again: a proven decision replaces it."""
    approver = (approver or "").strip()
    if not approver:
        raise ApprovalRefused("an approval needs --approver NAME: an anonymous approval is an audit trail "
                              "that proves nothing")
    named = name_problem(approver)
    if named is not None:
        raise ApprovalRefused(f"--approver {approver!r} is refused: {named}")
    if break_glass and not (note or "").strip():
        raise ApprovalRefused("a break-glass approval needs --note: why the normal chain was bypassed is what "
                              "the review will ask")
    full = resolve_id(store, request_id)
    current = store.get(full)
    if current is None:
        raise ApprovalRefused(f"approval request {full} disappeared from {store.describe()}")
    stale = unproven(current, trusted)
    if current.decided and stale is None:
        raise ApprovalRefused(_already(current))
    if now >= current.deadline:
        raise ApprovalRefused(f"approval request {full} expired at {format_instant(current.deadline)} (expiry "
                              f"denies); the agent must ask again")
    view = _approvable(current, show_all) if approved else None
    assertion = None
    if passkey is not None:
        if current.challenge is None:
            raise ApprovalRefused(f"approval request {full} asks for no passkey (it carries no challenge): approve "
                                  f"it with agent-saga approvals approve")
        assertion = dict(passkey(current))
    mine = Decision("Approved" if approved else "Denied", approver, now, current.arguments_digest,
                    (note or "").strip() or None, source or _source(), bool(break_glass and approved),
                    passkey=assertion)
    if signer is not None:
        view = view or _approvable(current, True)
        mine = Decision.from_doc(signer.sign(mine.to_doc(full, current.namespace), expires_at=current.deadline,
                                             tool=current.tool, action_digest=view.digest))
    if approved and trusted is not None and passkey is None:
        assert view is not None
        why = trusted.problem(mine.seal, request_id=full, arguments_digest=current.arguments_digest,
                              deadline=current.deadline, tool=current.tool, action_digest=view.digest,
                              approver=approver)
        if why is not None and signer is None:
            raise ApprovalRefused(
                f"the agents trust signed approvals only (trusted keys: {', '.join(trusted.key_ids) or 'none yet'}), "
                f"so an unsigned approval would be ignored and the request would wait out its deadline. Sign it: "
                f"--signing-key KEY.pem (or ${ENV_SIGNING_KEY}); a key is made with `agent-saga keygen approver "
                f"--approver {approver} --out KEY.pem`, and KEY.pem.pub must be among the trusted keys")
        if why is not None:
            raise ApprovalRefused(f"the agents would ignore this approval ({why}); trusted keys: "
                                  f"{', '.join(trusted.key_ids) or 'none yet'}")
    after = store.decide(full, mine, replaces=current.decision if stale is not None else None)
    if after is None or not mine.same_as(after.decision):
        raise ApprovalRefused(_already(after or current))
    return after


def _approvable(r: ApprovalRequest, show_all: bool) -> ActionView:
    """The action a human approves; refused if it cannot be checked, or was not all shown."""
    try:
        view = r.action_view()
    except ValueError as exc:
        raise ApprovalRefused(str(exc)) from None
    if view.truncated and not show_all:
        raise ApprovalRefused(f"approval request {r.id} has more than the default view shows ({len(view.fields)} "
                              f"fields): see the whole action with agent-saga approvals show {r.id[:8]} --show-all, "
                              f"then approve with --show-all (a human approves only what they could see)")
    return view


def unproven(current: ApprovalRequest, trusted: TrustedKeys | None) -> str | None:
    """Why the approval stored on ``current`` is one the agents ignore (``trusted``: the
    keys they trust), or ``None`` (no decision, a denial or expiry, a proven approval,
    or no keys to judge by). An approval on a request whose arguments no longer hash to
    its digest is ignored too (the agent checks the stored request against its call)."""
    decision = current.decision
    if decision is None or decision.state != "Approved" or trusted is None:
        return None
    try:
        view = current.action_view()
    except ValueError as exc:
        return str(exc)
    return trusted.problem(decision.seal, request_id=current.id, arguments_digest=current.arguments_digest,
                           deadline=current.deadline, tool=current.tool, action_digest=view.digest,
                           approver=decision.approver)


def _already(r: ApprovalRequest) -> str:
    who = f" by {r.approver}" if r.approver else ""
    return f"approval request {r.id} was already {r.state.lower()}{who}; a decision cannot be changed"


def _source() -> str:
    return f"cli:{process_identity().seen_by}"


def resolve_id(store: ApprovalStore, request_id: str) -> str:
    """The full id of the request ``request_id`` names (a unique prefix is enough)."""
    text = (request_id or "").strip().rstrip(".")
    if not text:
        raise ApprovalRefused("name the approval request: agent-saga approvals list shows the ids")
    if store.get(text) is not None:
        return text
    matches = [r.id for r in store.list() if r.id.startswith(text)]
    if not matches:
        raise ApprovalRefused(f"no approval request {text!r} in {store.describe()} (see agent-saga approvals list)")
    if len(matches) > 1:
        raise ApprovalRefused(f"{text!r} matches {len(matches)} approval requests; give more of the id")
    return matches[0]
