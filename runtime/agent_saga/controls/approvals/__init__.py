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
    from ._default import APPROVAL_STORES as APPROVAL_STORES
    from ._default import get_approval_provider as get_approval_provider
    from ._default import open_approval_store as open_approval_store
    from ._default import set_approval_provider as set_approval_provider
    from ._gateway import ApprovalGateway as ApprovalGateway
    from ._gateway import ApprovalPolicy as ApprovalPolicy
    from ._gateway import EscalationLevel as EscalationLevel
    from ._keyring import ApproverKeyring as ApproverKeyring
    from ._keyring import EnrolledKey as EnrolledKey
    from ._local import FileApprovalStore as FileApprovalStore
    from ._model import ApprovalOutcome as ApprovalOutcome
    from ._model import ApprovalProvider as ApprovalProvider
    from ._model import ApprovalRequest as ApprovalRequest
    from ._model import ApprovalState as ApprovalState
    from ._model import Decision as Decision
    from ._model import action_digest as action_digest
    from ._model import request_id_for as request_id_for
    from ._notifiers import ApprovalNotice as ApprovalNotice
    from ._notifiers import Notifier as Notifier
    from ._notifiers import NotifierError as NotifierError
    from ._notifiers import WebhookNotifier as WebhookNotifier
    from ._passkey import ActionChallenge as ActionChallenge
    from ._passkey import PasskeyAssertion as PasskeyAssertion
    from ._passkey import PasskeyRefused as PasskeyRefused
    from ._passkey import PasskeyVerifier as PasskeyVerifier
    from ._passkey import sign_challenge as sign_challenge
    from ._redis import RedisApprovalStore as RedisApprovalStore
    from ._render import FIELDS_SHOWN as FIELDS_SHOWN
    from ._render import VALUE_SHOWN as VALUE_SHOWN
    from ._render import escape_text as escape_text
    from ._render import render_action as render_action
    from ._signing import ANY_APPROVER as ANY_APPROVER
    from ._signing import ENV_SIGNING_KEY as ENV_SIGNING_KEY
    from ._signing import DecisionSigner as DecisionSigner
    from ._signing import TrustedKeys as TrustedKeys
    from ._store import ApprovalRefused as ApprovalRefused
    from ._store import ApprovalStore as ApprovalStore
    from ._store import ApprovalStoreUnavailable as ApprovalStoreUnavailable
    from ._store import decide_request as decide_request
    from ._store import resolve_id as resolve_id

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
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
    "._render": ("FIELDS_SHOWN", "VALUE_SHOWN", "escape_text", "render_action"),
    "._signing": ("ANY_APPROVER", "DecisionSigner", "ENV_SIGNING_KEY", "TrustedKeys"),
    "._store": (
        "ApprovalRefused", "ApprovalStore", "ApprovalStoreUnavailable", "decide_request",
        "resolve_id",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
