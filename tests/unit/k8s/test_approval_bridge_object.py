"""The Approval a pending request becomes: a passkey request says so, so kubectl can only deny it."""

from __future__ import annotations

from typing import Any

from agent_saga_operator.bridge import approval_object
from agent_saga_operator.models import ApprovalSpec

REQUEST: dict[str, Any] = {
    "requestId": "af83c011", "tool": "wire.send", "sagaId": "saga-1", "stepId": "saga-1/3",
    "rule": "irreversible", "argumentsDigest": "sha256:" + "ab" * 32, "requestedAt": "2026-07-01T12:00:00Z",
    "deadline": "2026-07-01T12:15:00Z", "namespace": "payments", "agent": "payments-agent",
}


def test_a_request_with_a_passkey_challenge_is_mirrored_as_passkey_required() -> None:
    challenge = {"format": "agent-saga.passkey-challenge/v1", "requestId": "af83c011", "nonce": "00" * 16}
    body = approval_object({**REQUEST, "challenge": challenge})
    assert body["spec"]["passkeyRequired"] is True
    assert "challenge" not in body["spec"]  # the nonce stays in the policy plane
    assert ApprovalSpec.model_validate(body["spec"]).passkey_required is True


def test_a_request_without_a_challenge_can_be_approved_with_kubectl() -> None:
    body = approval_object(REQUEST)
    assert "passkeyRequired" not in body["spec"]
    assert ApprovalSpec.model_validate(body["spec"]).passkey_required is None
