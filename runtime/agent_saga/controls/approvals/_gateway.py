"""``ApprovalGateway``: a named human on the hook, durably (the gate's ``ApprovalProvider``).

    gate = PreFlightGate(approval_provider=ApprovalGateway(
        store=RedisApprovalStore(url),                # FileApprovalStore() on one machine
        notifier=WebhookNotifier(os.environ["SLACK_WEBHOOK"]),
        wal=wal,
        policy=ApprovalPolicy(timeout=900, levels=(
            EscalationLevel(targets=("@oncall",)),
            EscalationLevel(targets=("@head-of-risk",), after_seconds=300))),
    ))

The life of one request (docs/approvals.md):
1. Its id is derived from (saga, step, tool, rule). If the store already holds it (a
   retried step, a restarted process), that request is used: nobody is asked twice.
2. Otherwise it is written to the store, then APPROVAL_REQUESTED is made durable in the
   WAL, and only then is the first level notified.
3. The gateway waits for the decision to land in the store (written by the CLI, the
   operator, a web hook: never by a connection into the agent), escalating level by
   level when their ``after_seconds`` pass (APPROVAL_ESCALATED), until the deadline.
4. Approved: the approval is consumed (single use) and APPROVAL_DECIDED is appended
   with the approver, the note, the arguments and the time; a break-glass approval
   writes APPROVAL_BREAK_GLASS with ``requires_review: true`` instead.

Every other path denies, and says why in APPROVAL_DECIDED: denied by the human, the
deadline passed (the request is marked Expired), the store cannot be reached, the
notifier failed (the request is marked Denied by ``agent-saga``), the request holds
other arguments than this call (an approval is bound to a digest of the tool, the exact
policy arguments and the policy version), or its approval was already used.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ..._identity import process_identity
from ...clocks import SYSTEM_CLOCK, ControlClock, format_instant, parse_instant
from ...errors import ConfigurationError, WALError
from ...gates import GateDecision, StepRequest
from ...records import ExtensionType, canonical_json
from ...wal.base import BaseWAL
from ._keyring import ApproverKeyring
from ._model import ApprovalOutcome, ApprovalRequest, Decision, action_digest, request_id_for
from ._names import name_problem
from ._notifiers import ApprovalNotice, Notifier
from ._passkey import ActionChallenge, PasskeyRefused, PasskeyVerifier
from ._render import render_action
from ._signing import DecisionSigner, TrustedKeys, path_stamp
from ._store import ApprovalStore, decide_request

__all__ = ["ApprovalGateway", "ApprovalPolicy", "EscalationLevel"]

log = logging.getLogger("agent_saga.controls")

REQUESTED = ExtensionType.APPROVAL_REQUESTED.value
RESUMED = ExtensionType.APPROVAL_RESUMED.value
ESCALATED = ExtensionType.APPROVAL_ESCALATED.value
DECIDED = ExtensionType.APPROVAL_DECIDED.value
BREAK_GLASS = ExtensionType.APPROVAL_BREAK_GLASS.value

SYSTEM_APPROVER = "agent-saga"
_HOST = process_identity().seen_by  # read once, at import
_DISPLAY_MAX = 32


@dataclass(frozen=True, slots=True)
class EscalationLevel:
    """Whom to ask (``targets``: handles your notifier understands) and when, in
    seconds after the request (``after_seconds``; 0 = at once)."""

    targets: tuple[str, ...]
    after_seconds: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.targets, str) or not self.targets or not all(
            isinstance(t, str) and t.strip() for t in self.targets
        ):
            raise ConfigurationError(f"EscalationLevel targets must be a non-empty tuple of names, got {self.targets!r}")
        object.__setattr__(self, "targets", tuple(self.targets))
        a = self.after_seconds
        if isinstance(a, bool) or not isinstance(a, int | float) or not 0 <= a < math.inf:
            raise ConfigurationError(f"EscalationLevel after_seconds must be >= 0, got {a!r}")


@dataclass(frozen=True, slots=True)
class ApprovalPolicy:
    """The mandatory deadline (``timeout`` seconds; expiry denies), the escalation chain,
    and the policy ``version`` an approval is bound to (change it when the rules that
    ask for approvals change, and earlier approvals stop matching)."""

    timeout: float
    levels: tuple[EscalationLevel, ...] = ()
    version: str = "1"

    def __post_init__(self) -> None:
        t = self.timeout
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf:
            raise ConfigurationError(
                f"ApprovalPolicy timeout must be a positive number of seconds (a deadline is mandatory: "
                f"an unanswered prompt would hold the saga open forever), got {t!r}"
            )
        levels = tuple(self.levels)
        if not all(isinstance(lv, EscalationLevel) for lv in levels):
            raise ConfigurationError("ApprovalPolicy levels must be EscalationLevel(...) values")
        for a, b in zip(levels, levels[1:], strict=False):
            if b.after_seconds < a.after_seconds:
                raise ConfigurationError("ApprovalPolicy levels must be in order of after_seconds")
        for lv in levels:
            if lv.after_seconds >= t:
                raise ConfigurationError(
                    f"escalation to {lv.targets} after {lv.after_seconds:g}s never happens: the timeout is {t:g}s"
                )
        object.__setattr__(self, "levels", levels)
        if not isinstance(self.version, str) or not self.version:
            raise ConfigurationError("ApprovalPolicy version must be a non-empty string")


class ApprovalGateway:
    """Durable human approvals (implements ``ApprovalProvider``); see the module doc.

    ``store``: where requests live (``FileApprovalStore``, ``RedisApprovalStore``).
    ``notifier``: who is told (``None``: nobody; humans watch ``approvals list``).
    ``wal``: where requests and decisions are recorded (required: an approval nobody can
    audit is not an approval). ``poll``: seconds between reads of the store while
    waiting. ``namespace`` / ``agent``: written into each request, so the operator can
    mirror it as an ``Approval`` in that namespace (default ``$AGENT_SAGA_NAMESPACE``,
    ``$POD_NAMESPACE`` or ``default``; ``$AGENT_SAGA_AGENT`` or the host name up to its first ``.``, as the policy plane names it).
    ``clock``: the time seam. ``trusted_keys``: the approver keys whose signature an
    approval needs (``TrustedKeys`` or a PEM file / directory; default
    ``$AGENT_SAGA_APPROVAL_KEYS``); keys the policy plane publishes are trusted too, and
    once any key is trusted an unsigned or forged approval is ignored (the request
    stays pending until it expires). With no key anywhere, approvals are accepted
    unsigned and the WAL says their signature was not checked. ``passkeys``: the
    approver keyring (``PasskeyVerifier``, ``ApproverKeyring`` or its file; default
    ``$AGENT_SAGA_APPROVER_KEYRING``): when set, every IRREVERSIBLE step's request carries
    a challenge, and its approval counts only with a signature over that challenge from
    the approver's own enrolled, unrevoked key (docs/approvals.md, "Passkey approvals").
    """

    def __init__(
        self,
        store: ApprovalStore,
        notifier: Notifier | None = None,
        wal: BaseWAL | None = None,
        policy: ApprovalPolicy | None = None,
        *,
        poll: float = 0.5,
        namespace: str | None = None,
        agent: str | None = None,
        clock: ControlClock | None = None,
        trusted_keys: TrustedKeys | str | os.PathLike[str] | None = None,
        passkeys: PasskeyVerifier | ApproverKeyring | str | os.PathLike[str] | None = None,
    ) -> None:
        if not isinstance(store, ApprovalStore):
            raise ConfigurationError(f"store must be an approval store (FileApprovalStore(), RedisApprovalStore(url)), "
                                     f"got {store!r}")
        if notifier is not None and not callable(getattr(notifier, "notify", None)):
            raise ConfigurationError(f"notifier must have async notify(notice), got {notifier!r}")
        if not isinstance(wal, BaseWAL):
            raise ConfigurationError("ApprovalGateway needs wal=: requests and decisions land in the hash-chained "
                                     "WAL, so who approved what can be proven")
        if policy is None:
            raise ConfigurationError("ApprovalGateway needs policy=ApprovalPolicy(timeout=...): a deadline is mandatory")
        if not isinstance(policy, ApprovalPolicy):
            raise ConfigurationError(f"policy must be an ApprovalPolicy(...), got {policy!r}")
        if not 0 < poll < math.inf:
            raise ConfigurationError(f"poll must be a positive number of seconds, got {poll!r}")
        self.store = store
        self.notifier = notifier
        self.wal = wal
        self.policy = policy
        self._poll = float(poll)
        self._clock = clock or SYSTEM_CLOCK
        self.namespace = namespace or os.environ.get("AGENT_SAGA_NAMESPACE") or os.environ.get("POD_NAMESPACE") \
            or "default"
        self.agent = agent or os.environ.get("AGENT_SAGA_AGENT") or process_identity().short_host
        if trusted_keys is None:
            trusted_keys = TrustedKeys.from_env()
        elif not isinstance(trusted_keys, TrustedKeys):
            trusted_keys = TrustedKeys.from_path(trusted_keys)
        self._configured: TrustedKeys | None = trusted_keys
        self._trust: TrustedKeys | None = trusted_keys
        self._forged: set[str] = set()
        # What this process remembers, whatever the store says later: that trusted keys
        # were seen (then an unsigned approval is refused even when none is published any
        # more: a policy plane that lost its data), and the deadline it set on each request
        # (a document's deadline moved later does not extend a request or an approval).
        self._keys_seen = trusted_keys is not None
        self._own: dict[str, float] = {}
        self._moved: set[str] = set()
        if passkeys is None:
            passkeys = ApproverKeyring.from_env()
        if passkeys is not None and not isinstance(passkeys, PasskeyVerifier):
            passkeys = PasskeyVerifier(passkeys if isinstance(passkeys, ApproverKeyring) else os.fspath(passkeys))
        self.passkeys: PasskeyVerifier | None = passkeys
        #: ``<namespace>/<pod>`` when the store keeps this agent's requests under its own
        #: name (``RedisApprovalStore(owner=...)``); request ids are derived with it.
        self.owner = str(getattr(store, "owner", "") or "")

    def __repr__(self) -> str:
        return f"ApprovalGateway({self.store.describe()}, timeout={self.policy.timeout:g})"

    # ------------------------------------------------------------------ provider
    async def request_approval(self, request: StepRequest, verdict: GateDecision) -> ApprovalOutcome:
        """Ask (or find the earlier request), wait for the decision, return it. Never
        raises for a failure: every failure is a denial that says why."""
        rule = verdict.decided_by or "approval"
        if rule.startswith("rule:"):
            rule = rule[len("rule:"):]  # as the Approval resource shows it: irreversible, limit:wire-ceiling
        rid = request_id_for(request.saga_id, request.step_id, request.tool, rule, self.owner)
        digest = action_digest(request.tool, request.policy_args, self.policy.version)
        try:
            return await self._run(request, verdict, rid, rule, digest)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - every failure path denies
            why = f"the approval could not be completed ({type(exc).__name__}: {exc}); approvals fail closed"
            await self._mark_denied(rid, why, digest)
            return self._deny_locally(request, rid, digest, why)

    async def _mark_denied(self, rid: str, why: str, digest: str = "") -> None:
        """Best effort: a request this process gave up on must not be approved later."""
        decision = Decision("Denied", SYSTEM_APPROVER, self._clock.time(), digest, why[:1024], _source())
        try:
            await asyncio.to_thread(self.store.decide, rid, decision)
        except Exception as exc:  # noqa: BLE001 - denied either way
            log.warning("could not mark approval request %s denied in %s (%s)", rid, self.store.describe(), exc)

    async def _run(
        self, request: StepRequest, verdict: GateDecision, rid: str, rule: str, digest: str
    ) -> ApprovalOutcome:
        await self._learn_keys()
        found = await asyncio.to_thread(self.store.get, rid)
        if found is None:
            now = self._clock.time()
            fresh = ApprovalRequest(
                id=rid, saga_id=request.saga_id, step_id=request.step_id, tool=request.tool, rule=rule,
                reason=verdict.reason[:1024], arguments_digest=digest, policy_version=self.policy.version,
                requested_at=now, deadline=now + self.policy.timeout, display=_display(request.policy_args),
                arguments=_canonical(request.policy_args), owner=self.owner,
                requested_by=_HOST, namespace=self.namespace, agent=self.agent,
                semantics=str(getattr(request.semantics, "value", request.semantics)),
                levels=tuple((lv.targets, float(lv.after_seconds)) for lv in self.policy.levels),
            )
            if self._needs_passkey(request):
                fresh = replace(fresh, challenge=ActionChallenge.issue(
                    request_id=rid, tool=request.tool, arguments_digest=digest, saga_id=request.saga_id,
                    step_id=request.step_id, expires_at=fresh.deadline).to_doc())
            current, created = await asyncio.to_thread(self.store.create, fresh)
            if created:
                self._own[rid] = fresh.deadline
                seq = self.wal.append(REQUESTED, request.saga_id, request.step_id, {
                    **self._about(current), "policy_args": dict(request.policy_args),
                    "levels": [{"targets": list(t), "after_seconds": a} for t, a in current.levels],
                    "timeout": self.policy.timeout, "signatures_required": self._keys_seen,
                })
                await self.wal.barrier(seq)  # durable before anyone is asked
            else:
                await self._recall(current)
        else:
            current = found
            await self._recall(current)
            self.wal.append(RESUMED, request.saga_id, request.step_id, {
                **self._about(self._pin(current)), "state": current.state,
                "note": "the request already existed: nobody is asked again",
            })
        current = self._pin(current)
        if current.arguments_digest != digest:
            return self._record(request, current, False, SYSTEM_APPROVER, (
                f"approval request {rid} was made for other arguments ({current.arguments_digest}), this call is "
                f"{digest}: an approval covers exactly the action a human saw, so changing the arguments after "
                f"approval is refused"), extra={"call_digest": digest})
        if self._needs_passkey(request) and current.challenge is None:
            return self._record(request, current, False, SYSTEM_APPROVER, (
                f"passkey refused: approval request {rid} was made without a passkey challenge, and this "
                f"IRREVERSIBLE step needs the approver's enrolled key to sign one"), extra={"passkey": {
                    "refused": "missing"}})
        return await self._wait(request, current)

    async def _wait(self, request: StepRequest, current: ApprovalRequest) -> ApprovalOutcome:
        rid = current.id
        mine = action_digest(request.tool, request.policy_args, self.policy.version)
        # The tool and the rendering of THIS call's arguments (not what the store says):
        # what a signed approval must cover. Rendered once per request.
        rendered = render_action(request.tool, _canonical(request.policy_args)).digest
        while True:
            forged = None
            if current.arguments_digest != mine or current.tool != request.tool:
                # Checked on every read, against this call (not what the store says): a
                # request rewritten while it waits is another action, whoever approves it.
                return self._record(request, current, False, SYSTEM_APPROVER, (
                    f"approval request {rid} in {self.store.describe()} now names another action "
                    f"({current.tool[:64]!r}, {current.arguments_digest[:19]}) than this call ({request.tool!r}, "
                    f"{mine[:19]}): it was rewritten after it was made, so no approval of it counts"),
                    extra={"call_digest": mine})
            if current.state == "Approved":
                forged, proof = await self._verify(current, request.tool, rendered)
                if forged is None:
                    refused = self._check_passkey(current, proof)
                    if refused is not None:
                        return self._record(request, current, False, SYSTEM_APPROVER, refused[0],
                                            extra={"passkey": refused[1]})
                    return await self._consume(request, current, proof)
                self._ignore(current, forged)
            if current.state == "Denied":
                return self._record(request, current, False, current.approver or SYSTEM_APPROVER,
                                    current.note or "denied")
            if current.state == "Expired":
                # Another process (the operator's expiry, a peer agent) saw the deadline
                # first: the same answer and record as when this process expires it.
                return self._record(request, current, False, SYSTEM_APPROVER,
                                    f"the request expired at {format_instant(current.deadline)} unanswered: "
                                    f"expiry denies", decision="Expired")
            now = self._clock.time()
            if now >= current.deadline and forged is not None:
                # the store holds the unproven decision (written once), so the expiry is ours alone
                return self._record(request, current, False, SYSTEM_APPROVER,
                                    f"no proven answer by the deadline {format_instant(current.deadline)}: expiry "
                                    f"denies (the decision in the store was ignored: {forged})",
                                    decision="Expired", extra={"forged": forged})
            if now >= current.deadline:
                return await self._expire(request, current, now)
            failure = await self._escalate(request, current, now)
            if failure is not None:
                return failure
            next_due = min([current.deadline] + [current.requested_at + a for i, (_, a) in enumerate(current.levels)
                                                  if not current.escalated_to(i)])
            wait = min(self._poll, next_due - now)
            await self._clock.sleep(wait if wait > 0 else self._poll / 10)
            latest = await asyncio.to_thread(self.store.get, rid)
            if latest is None:
                latest = await self._remake(request, current)
            current = self._pin(latest)

    async def _remake(self, request: StepRequest, current: ApprovalRequest) -> ApprovalRequest:
        """The request vanished from the store before its deadline (the policy plane lost
        its data, or was restored from an older snapshot): store it again as this agent
        made it, with no decision (none is assumed from before the loss), and keep
        waiting. The operator mirrors it into the ``Approval`` that already exists."""
        again = replace(current.with_decision(None), consumed_at=None, consumed_by=None)
        stored, created = await asyncio.to_thread(self.store.create, again)
        if created:
            log.warning("approval request %s disappeared from %s before its deadline (the policy plane lost its "
                        "data?): stored again as it was asked, without any decision; still waiting until %s",
                        again.id, self.store.describe(), format_instant(again.deadline))
            seq = self.wal.append(RESUMED, request.saga_id, request.step_id, {
                **self._about(again), "state": "Pending",
                "note": "the request disappeared from the store: stored again as it was asked, no decision kept",
            })
            await self.wal.barrier(seq)
        return stored

    async def _escalate(self, request: StepRequest, current: ApprovalRequest, now: float) -> ApprovalOutcome | None:
        for level, (targets, after_s) in enumerate(current.levels):
            if current.escalated_to(level) or now < current.requested_at + after_s:
                continue

            made: list[ApprovalRequest] = []

            def mark(r: ApprovalRequest, level: int = level, targets: tuple[str, ...] = targets,
                     made: list[ApprovalRequest] = made) -> ApprovalRequest | None:
                if r.decided or r.escalated_to(level):
                    return None
                made.append(replace(r, escalations=(*r.escalations, (level, targets, now))))
                return made[-1]

            after = await asyncio.to_thread(self.store.update, current.id, mark)
            if after is None or not made or after != made[-1]:
                if after is not None:
                    current = after
                continue  # decided meanwhile, or another waiter took this level (and notifies)
            current = after
            if level > 0:
                self.wal.append(ESCALATED, request.saga_id, request.step_id, {
                    "request_id": current.id, "level": level, "targets": list(targets),
                    "after_seconds": after_s, "at": format_instant(now),
                })
            if self.notifier is None:
                continue
            notice = ApprovalNotice("escalated" if level else "requested", level, targets, current)
            try:
                await self.notifier.notify(notice)
            except Exception as exc:  # noqa: BLE001 - a broken integration denies
                why = (f"the notifier failed ({type(exc).__name__}: {exc}), so no human was asked at level "
                       f"{level} ({', '.join(targets)}); a failed integration never authorises")
                return await self._deny_in_store(request, current, why)
        return None

    async def _verify(self, current: ApprovalRequest, tool: str, rendered: str) -> tuple[str | None, dict[str, Any]]:
        """Is the stored approval proven? (why not, or ``None``; and what the WAL records)"""
        decision = current.decision
        assert decision is not None
        named = name_problem(decision.approver)
        if named is not None:
            return f"the approver name {decision.approver[:64]!r} is refused: {named}", {}
        seal = decision.seal
        if self._trust is None or seal is None or seal.key_id not in self._trust.key_ids:
            await self._learn_keys()
        trust = self._trust
        if trust is None and self._keys_seen:
            return ("no trusted approver key is known now, but this agent saw trusted keys before (the policy plane "
                    "may have lost its data): an approval needs a valid signature"), {}
        if trust is None:
            return None, {"signature": "not checked: no trusted approver keys are configured"}
        why = trust.problem(seal, request_id=current.id, arguments_digest=current.arguments_digest,
                            deadline=current.deadline, tool=tool, action_digest=rendered,
                            approver=decision.approver)
        if why is not None:
            return why, {}
        assert seal is not None
        proof: dict[str, Any] = {"signature": {"alg": "Ed25519", "keyId": seal.key_id, "verified": True,
                                               "keyOwner": trust.owner(seal.key_id)}}
        if decision.signed and decision.signed.get("authenticatedUser"):
            proof["authenticated_user"] = str(decision.signed["authenticatedUser"])
        return None, proof

    def _needs_passkey(self, request: StepRequest) -> bool:
        return self.passkeys is not None and str(getattr(request.semantics, "value", request.semantics)) \
            == "IRREVERSIBLE"

    def _check_passkey(self, current: ApprovalRequest,
                       proof: dict[str, Any]) -> tuple[str, dict[str, Any]] | None:
        """Why the approval's passkey does not approve this action (and what the WAL
        records), or ``None`` (then ``proof`` holds the passkey's proof)."""
        if current.challenge is None:
            return None
        decision = current.decision
        assert decision is not None
        if self.passkeys is None:
            return (f"passkey refused: approval request {current.id} asks for a passkey, and this process has no "
                    f"approver keyring to check it (ApprovalGateway(passkeys=...) or $AGENT_SAGA_APPROVER_KEYRING)",
                    {"refused": "no-keyring"})
        try:
            challenge = ActionChallenge.from_doc(current.challenge)
            if (challenge.request_id, challenge.arguments_digest, challenge.saga_id, challenge.step_id,
                    challenge.tool) != (current.id, current.arguments_digest, current.saga_id, current.step_id,
                                        current.tool) or abs(challenge.expires_at - current.deadline) >= 1.0:
                raise PasskeyRefused("other-action", f"the challenge stored with request {current.id} names "
                                     f"another action (request {challenge.request_id[:12]}, step "
                                     f"{challenge.step_id})")
            proof["passkey"] = self.passkeys.verify(decision.passkey, challenge, approver=decision.approver,
                                                    now=self._clock.time())
        except ValueError as exc:
            return (f"passkey refused: the challenge of request {current.id} cannot be read ({exc})",
                    {"refused": "challenge"})
        except PasskeyRefused as exc:
            kid = (decision.passkey or {}).get("keyId")
            return f"passkey refused: {exc.message}", {"refused": exc.code, "keyId": kid}
        return None

    async def _learn_keys(self) -> None:
        """Read the keys trusted now: the configured file or directory again (a mounted
        ConfigMap the operator fills or rotates) and those the policy plane publishes.
        Once any key was seen this process requires signatures for good."""
        configured = self._configured
        if configured is not None and configured.changed():
            assert configured.path is not None
            try:
                fresh = await asyncio.to_thread(TrustedKeys.from_path, configured.path)
            except ConfigurationError as exc:  # keep what was read before; say why once
                configured.stamp = path_stamp(configured.path)
                log.warning("trusted approver keys %s cannot be read again (%s); the keys read before stay trusted",
                            configured.path, exc)
            else:
                configured.update(fresh)
                configured.stamp = fresh.stamp
                if self._trust is not None:
                    self._trust.update(fresh)
        published = getattr(self.store, "published_keys", None)
        texts = await asyncio.to_thread(published) if published is not None else {}
        if texts:
            self._trust = self._merged(texts)
        if self._trust is not None:
            self._keys_seen = True

    async def _recall(self, current: ApprovalRequest) -> None:
        """Remember the deadline this agent set on ``current`` (a request it made before
        a restart): from its own WAL's APPROVAL_REQUESTED, never from the document. With
        no such record the deadline is the document's, capped at one timeout from now."""
        if current.id in self._own:
            return
        mine: dict[str, Any] | None = None
        async for rec in self.wal.read_all():
            payload = rec.payload
            if rec.type == REQUESTED and isinstance(payload, dict) and payload.get("request_id") == current.id:
                mine = payload  # the last one: a later request under the same id replaces it
        deadline: float | None = None
        if mine is not None:
            try:
                deadline = parse_instant(mine.get("deadline"))
            except ValueError:
                deadline = None
            if mine.get("signatures_required"):
                self._keys_seen = True
        if deadline is None:
            deadline = min(current.deadline, self._clock.time() + self.policy.timeout)
        self._own[current.id] = deadline

    def _pin(self, current: ApprovalRequest) -> ApprovalRequest:
        """``current`` with the deadline this agent set (a document whose deadline was
        moved is logged once; the move changes nothing)."""
        own = self._own.get(current.id)
        if own is None or abs(own - current.deadline) < 1e-3:
            return current
        if current.id not in self._moved:
            self._moved.add(current.id)
            log.warning("approval request %s: the deadline in %s (%s) is not the one this agent set (%s); the "
                        "agent keeps its own", current.id, self.store.describe(), format_instant(current.deadline),
                        format_instant(own))
        return replace(current, deadline=own)

    def _merged(self, published: Mapping[str, str]) -> TrustedKeys:
        """The configured keys, those the policy plane publishes, and every key trusted so
        far (once keys were seen, signatures stay required in this process)."""
        keys = TrustedKeys(source=f"{self.store.describe()} published keys")
        for earlier in (self._configured, self._trust):
            if earlier is not None:
                keys.update(earlier)
        for kid, pem in published.items():
            keys.add_pem(pem, where=f"the approver key {kid} published in {self.store.describe()}")
        return keys

    def _ignore(self, current: ApprovalRequest, why: str) -> None:
        if current.id in self._forged:
            return
        self._forged.add(current.id)
        assert current.decision is not None
        log.warning("approval request %s: the approved decision in %s (approver %r, source %r) is ignored as "
                    "forged: %s; the request stays pending until %s (expiry denies)", current.id,
                    self.store.describe(), current.decision.approver[:64], current.decision.source[:64], why,
                    format_instant(current.deadline))

    async def _consume(self, request: StepRequest, current: ApprovalRequest,
                       proof: dict[str, Any] | None = None) -> ApprovalOutcome:
        decision = current.decision
        assert decision is not None
        if decision.arguments_digest and decision.arguments_digest != current.arguments_digest:
            return self._record(request, current, False, SYSTEM_APPROVER, (
                f"the approval by {decision.approver} was given for other arguments ({decision.arguments_digest}); "
                f"an approval covers exactly the action a human saw"))
        if decision.decided_at > current.deadline:
            return self._record(request, current, False, SYSTEM_APPROVER,
                                f"the approval by {decision.approver} came after the deadline "
                                f"{format_instant(current.deadline)}; expiry denies")
        if current.consumed_at is not None:
            return self._record(request, current, False, SYSTEM_APPROVER, (
                f"the approval of request {current.id} by {decision.approver} was already used "
                f"({current.consumed_by}, {format_instant(current.consumed_at)}): an approval authorises one call, "
                f"so a re-run of this step needs a new saga and a new approval"))
        now = self._clock.time()
        prior = await asyncio.to_thread(self.store.mark_consumed, current, f"{_HOST} {request.step_id}", now)
        if prior is not None:
            return self._record(request, current, False, SYSTEM_APPROVER, (
                f"the approval of request {current.id} by {decision.approver} was already used ({prior[:200]}): an "
                f"approval authorises one call, whatever its request document says now, so a re-run of this step "
                f"needs a new saga and a new approval"), extra={"replayed": True})
        made: list[ApprovalRequest] = []

        def consume(r: ApprovalRequest) -> ApprovalRequest | None:
            if r.state != "Approved" or r.consumed_at is not None:
                return None
            made.append(replace(r, consumed_at=now, consumed_by=f"{_HOST} {request.step_id}"))
            return made[-1]

        after = await asyncio.to_thread(self.store.update, current.id, consume)
        if after is None:
            return self._deny_locally(request, current.id, current.arguments_digest,
                                      f"approval request {current.id} disappeared from {self.store.describe()}")
        after = self._pin(after)
        if not made or self._pin(made[-1]) != after:
            return self._record(request, after, False, SYSTEM_APPROVER,
                                f"the approval of request {current.id} was used by another call; an approval "
                                f"authorises one call")
        return self._record(request, after, True, after.approver or "", after.note or "", extra=proof)

    async def _expire(self, request: StepRequest, current: ApprovalRequest, now: float) -> ApprovalOutcome:
        expired = Decision("Expired", SYSTEM_APPROVER, now, current.arguments_digest,
                           f"no answer within {self.policy.timeout:g}s", _source())
        after = await asyncio.to_thread(self.store.decide, current.id, expired)
        if after is not None and after.decision is not None and not expired.same_as(after.decision):
            return await self._wait(request, self._pin(after))  # decided just in time
        return self._record(request, after or current, False, SYSTEM_APPROVER,
                            f"no answer within {self.policy.timeout:g}s (deadline "
                            f"{format_instant(current.deadline)}): expiry denies", decision="Expired")

    async def _deny_in_store(self, request: StepRequest, current: ApprovalRequest, why: str) -> ApprovalOutcome:
        await self._mark_denied(current.id, why, current.arguments_digest)
        return self._record(request, current, False, SYSTEM_APPROVER, why)

    # ------------------------------------------------------------------ records
    def _about(self, r: ApprovalRequest) -> dict[str, Any]:
        return {
            "request_id": r.id, "tool": r.tool, "rule": r.rule, "reason": r.reason, "digest": r.arguments_digest,
            "policy_version": r.policy_version, "namespace": r.namespace, "requested_at": format_instant(r.requested_at),
            "deadline": format_instant(r.deadline), "store": self.store.describe(),
        }

    def _record(
        self, request: StepRequest, r: ApprovalRequest, approved: bool, approver: str, note: str,
        *, decision: str | None = None, extra: dict[str, Any] | None = None,
    ) -> ApprovalOutcome:
        glass = approved and r.break_glass
        payload: dict[str, Any] = {
            **self._about(r),
            "decision": decision or ("Approved" if approved else "Denied"),
            "approver": approver, "note": note, "policy_args": dict(request.policy_args),
            "decided_at": format_instant(r.decided_at if r.decided_at is not None else self._clock.time()),
            "escalations": [{"level": lv, "targets": list(t), "at": format_instant(at)} for lv, t, at in r.escalations],
        }
        if extra:
            payload.update(extra)
        if glass:
            payload["requires_review"] = True
            payload["break_glass"] = True
        try:
            self.wal.append(BREAK_GLASS if glass else DECIDED, request.saga_id, request.step_id, payload)
        except WALError as exc:
            if approved:  # an approval nobody can prove is not an approval
                return ApprovalOutcome(False, SYSTEM_APPROVER, f"the approval by {approver} could not be recorded "
                                       f"in the WAL ({exc}); refused", r.id)
            log.error("could not record the denial of approval request %s in the WAL (%s)", r.id, exc)
        return ApprovalOutcome(approved, approver or None, note, r.id, glass)

    def _deny_locally(self, request: StepRequest, rid: str, digest: str, why: str) -> ApprovalOutcome:
        payload = {"request_id": rid, "tool": request.tool, "digest": digest, "decision": "Denied",
                   "approver": SYSTEM_APPROVER, "note": why, "store": self.store.describe(),
                   "policy_args": dict(request.policy_args), "decided_at": format_instant(self._clock.time())}
        try:
            self.wal.append(DECIDED, request.saga_id, request.step_id, payload)
        except Exception as exc:  # noqa: BLE001 - denied either way
            log.error("could not record the denial of approval request %s in the WAL (%s)", rid, exc)
        return ApprovalOutcome(False, SYSTEM_APPROVER, why, rid)

    # ------------------------------------------------------------------ answering
    async def decide(
        self, request_id: str, *, approved: bool, approver: str, note: str | None = None, break_glass: bool = False,
        signer: DecisionSigner | None = None, show_all: bool = False,
    ) -> ApprovalRequest:
        """Record a human's decision from this process (what ``agent-saga approvals
        approve/deny`` does from another), under the same rules: ``show_all`` says the
        human saw every field of an action the default view cuts short, and with approver
        keys trusted here (configured or published) an approval the agents would ignore
        (unsigned, or signed by a key they do not trust) is refused rather than recorded.
        Raises ``ApprovalRefused`` (no approver, already decided, expired, not shown whole,
        unproven) or ``ApprovalStoreUnavailable``."""
        await self._learn_keys()
        return await asyncio.to_thread(
            decide_request, self.store, request_id, approved=approved, approver=approver,
            now=self._clock.time(), note=note, break_glass=break_glass, signer=signer, show_all=show_all,
            trusted=self._trust,
        )

    async def pending(self) -> Sequence[ApprovalRequest]:
        """The requests still waiting for a human."""
        return [r for r in await asyncio.to_thread(self.store.list) if r.state == "Pending"]


def _source() -> str:
    return f"agent:{_HOST}"


def _display(args: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for k in sorted(args)[:_DISPLAY_MAX]:
        v = args[k]
        out[str(k)] = (v if isinstance(v, str) else _json(v))[:1024]
    return out


def _canonical(args: Any) -> dict[str, Any]:
    """The policy arguments as the request carries them (``arguments``): their canonical
    JSON read back, so every reader renders and hashes the same values."""
    import json

    return dict(json.loads(canonical_json(dict(args))))


def _json(v: Any) -> str:
    import json

    try:
        return json.dumps(v, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError):
        return str(v)
