"""Approvals: a named human on the hook, durably, with escalation and expiry.

    gate = PreFlightGate(approval_provider=ApprovalGateway(
        store=RedisApprovalStore(url),          # FileApprovalStore() on one machine
        notifier=WebhookNotifier(os.environ["SLACK_WEBHOOK"]), wal=wal,
        policy=ApprovalPolicy(timeout=900, levels=(EscalationLevel(("@oncall",)),))))

The layout every control shares (``agent_saga.controls``):

    _model.py      ApprovalRequest and Decision (the two policy-plane documents), the
                   action digest, and the gate's seam: ApprovalProvider, ApprovalOutcome
    _store.py      the ApprovalStore protocol, its errors, decide_request
    _local.py      FileApprovalStore: a directory on one machine
    _redis.py      RedisApprovalStore: the policy plane, shared with the CLI and operator
    _default.py    open_approval_store(url or directory); the process-wide provider (set by the
                   policy-plane wiring)
    _gateway.py    ApprovalGateway: ask, escalate, wait, record (an ApprovalProvider)
    _notifiers.py  Notifier, WebhookNotifier: how a human hears about a request
    _signing.py    DecisionSigner, TrustedKeys: signed decisions, checked by the agent
    _keyring.py    ApproverKeyring: the approver keys enrolled for passkey approvals
    _passkey.py    ActionChallenge, PasskeyVerifier: the approver's own key signs the exact action

Only this module is public.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

if TYPE_CHECKING:
    from ._default import (
        APPROVAL_STORES,
        get_approval_provider,
        open_approval_store,
        set_approval_provider,
    )
    from ._gateway import ApprovalGateway, ApprovalPolicy, EscalationLevel
    from ._keyring import ApproverKeyring, EnrolledKey
    from ._local import FileApprovalStore
    from ._model import (
        ApprovalOutcome,
        ApprovalProvider,
        ApprovalRequest,
        ApprovalState,
        Decision,
        action_digest,
        request_id_for,
    )
    from ._notifiers import ApprovalNotice, Notifier, NotifierError, WebhookNotifier
    from ._passkey import (
        ActionChallenge,
        PasskeyAssertion,
        PasskeyRefused,
        PasskeyVerifier,
        sign_challenge,
    )
    from ._redis import RedisApprovalStore
    from ._signing import DecisionSigner, TrustedKeys
    from ._store import (
        ApprovalRefused,
        ApprovalStore,
        ApprovalStoreUnavailable,
        decide_request,
        resolve_id,
    )

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._default": (
        "APPROVAL_STORES", "get_approval_provider", "open_approval_store",
        "set_approval_provider",
    ),
    "._gateway": ("ApprovalGateway", "ApprovalPolicy", "EscalationLevel"),
    "._keyring": ("ApproverKeyring", "EnrolledKey"),
    "._local": ("FileApprovalStore",),
    "._model": (
        "ApprovalOutcome", "ApprovalProvider", "ApprovalRequest", "ApprovalState",
        "Decision", "action_digest", "request_id_for",
    ),
    "._notifiers": ("ApprovalNotice", "Notifier", "NotifierError", "WebhookNotifier"),
    "._passkey": (
        "ActionChallenge", "PasskeyAssertion", "PasskeyRefused", "PasskeyVerifier",
        "sign_challenge",
    ),
    "._redis": ("RedisApprovalStore",),
    "._signing": ("DecisionSigner", "TrustedKeys"),
    "._store": (
        "ApprovalRefused", "ApprovalStore", "ApprovalStoreUnavailable", "decide_request",
        "resolve_id",
    ),
}

__all__ = [
    "APPROVAL_STORES",
    "ActionChallenge",
    "ApprovalGateway",
    "ApprovalNotice",
    "ApprovalOutcome",
    "ApprovalPolicy",
    "ApprovalProvider",
    "ApprovalRefused",
    "ApprovalRequest",
    "ApprovalState",
    "ApprovalStore",
    "ApprovalStoreUnavailable",
    "ApproverKeyring",
    "Decision",
    "DecisionSigner",
    "EnrolledKey",
    "EscalationLevel",
    "FileApprovalStore",
    "Notifier",
    "NotifierError",
    "PasskeyAssertion",
    "PasskeyRefused",
    "PasskeyVerifier",
    "RedisApprovalStore",
    "TrustedKeys",
    "WebhookNotifier",
    "action_digest",
    "decide_request",
    "get_approval_provider",
    "open_approval_store",
    "request_id_for",
    "resolve_id",
    "set_approval_provider",
    "sign_challenge",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
