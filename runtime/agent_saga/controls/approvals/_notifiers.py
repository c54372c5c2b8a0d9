"""How a human hears that an agent is waiting: ``Notifier`` and ``WebhookNotifier``.

The gateway tells a notifier about a request (level 0) and about each escalation. A
notifier only tells: the answer comes back through the approval store (CLI, operator,
a web process writing the decision), never through the notifier.

Invariants:
- A notifier that raises, or a webhook that does not answer 2xx within ``timeout``,
  makes the gateway DENY the request: a broken integration must never leave a saga
  waiting for an answer nobody was asked for, and never authorises anything.
- A webhook URL is a secret (a Slack incoming-webhook URL is a credential): only its
  scheme and host appear in messages and logs.
- Standard library only (``urllib.request``), run in a worker thread.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol, runtime_checkable

from ...clocks import format_instant
from ...errors import ConfigurationError, SagaError
from ._model import ApprovalRequest
from ._render import escape_text

__all__ = ["ApprovalNotice", "Notifier", "NotifierError", "WebhookNotifier"]


class NotifierError(SagaError):
    """A notification could not be delivered; the request it was about is denied."""


@dataclass(frozen=True, slots=True)
class ApprovalNotice:
    """What a notifier is told: the request, which escalation level, whom to ask."""

    kind: Literal["requested", "escalated"]
    level: int
    targets: tuple[str, ...]
    request: ApprovalRequest

    def text(self) -> str:
        """One human message (Slack-ready)."""
        r = self.request
        who = " ".join(self.targets)
        head = "Escalated approval" if self.kind == "escalated" else "Approval needed"
        try:  # rendered from the canonical arguments, escaped, and saying what it leaves out
            args = ", ".join(r.action_view().lines(request_id=r.id))
        except ValueError as exc:
            args = f"NOT APPROVABLE: {exc}"
        return (
            f"{who} {head}: {escape_text(r.tool)} ({args}) -- {escape_text(r.reason)} [rule {escape_text(r.rule)}, "
            f"saga {escape_text(r.saga_id)}]. "
            f"Deadline {format_instant(r.deadline)} (no answer denies). "
            f"Answer: agent-saga approvals approve {r.id} --approver NAME [--note ...] | "
            f"agent-saga approvals deny {r.id} --approver NAME"
        )

    def to_doc(self) -> dict[str, Any]:
        """The notice as JSON (what a webhook receives)."""
        return {"kind": self.kind, "level": self.level, "targets": list(self.targets),
                "request": self.request.to_doc()}


@runtime_checkable
class Notifier(Protocol):
    """Tells humans about a request. Raising (anything) denies the request."""

    async def notify(self, notice: ApprovalNotice) -> None:
        """Tell the targets of ``notice`` about a request; raise ``NotifierError`` if not delivered."""


class WebhookNotifier:
    """POSTs each notice as JSON to ``url`` (a Slack incoming webhook works as is:
    ``{"text": ..., "agent_saga": {...}}``). ``timeout`` bounds the call; anything but a
    2xx answer raises ``NotifierError`` (and the request is denied). ``headers`` are
    added to the request (e.g. an authorization header for your own endpoint)."""

    def __init__(self, url: str, *, timeout: float = 5.0, headers: Mapping[str, str] | None = None) -> None:
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigurationError("WebhookNotifier needs an http(s):// URL (for example a Slack incoming webhook)")
        if not 0 < timeout < 300:
            raise ConfigurationError(f"timeout must be between 0 and 300 seconds, got {timeout!r}")
        self._url = url
        self._timeout = timeout
        self._headers = dict(headers or {})
        parts = urllib.parse.urlsplit(url)
        self._name = f"WebhookNotifier({parts.scheme}://{parts.hostname}{':' + str(parts.port) if parts.port else ''}/...)"

    def describe(self) -> str:
        """``WebhookNotifier(<scheme>://<host>/...)`` (the path may carry a token: never shown)."""
        return self._name

    def __repr__(self) -> str:
        return self._name

    async def notify(self, notice: ApprovalNotice) -> None:
        """POST the notice as JSON; raise ``NotifierError`` unless the hook answered 2xx."""
        body = json.dumps({"text": notice.text(), "agent_saga": notice.to_doc()}).encode()
        await asyncio.to_thread(self._post, body)

    def _post(self, body: bytes) -> None:
        req = urllib.request.Request(
            self._url, data=body, method="POST",
            headers={"Content-Type": "application/json", "User-Agent": "agent-saga", **self._headers},
        )
        try:
            with urllib.request.urlopen(req, timeout=self._timeout) as resp:  # noqa: S310 - http(s) only, checked
                status = resp.status
                resp.read(65536)
        except urllib.error.HTTPError as exc:
            exc.close()
            raise NotifierError(f"{self._name} answered HTTP {exc.code}: the notification was not delivered") from None
        except (urllib.error.URLError, OSError, TimeoutError) as exc:
            reason = getattr(exc, "reason", exc)
            raise NotifierError(f"{self._name} could not be reached ({type(exc).__name__}: {reason})") from None
        if not 200 <= status < 300:
            raise NotifierError(f"{self._name} answered HTTP {status}: the notification was not delivered")
