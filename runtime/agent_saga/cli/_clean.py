"""Names and free text a command stores in the policy plane, without credentials.

A decision's ``--note``, a lever's ``--reason``: free text that every agent, operator and
approver reads, kept for days. A credential pasted into one (``--note "token sk_live_..."``)
is replaced by ``[REDACTED]`` with the project's scrubber (``agent_saga.scrubber``) before
it is stored, and the command says so. A name (``--approver``, ``--by``) holding one is
refused: a name is never a secret, so it is a mistake to fix, not text to keep.
"""

from __future__ import annotations

import sys

from ..errors import ConfigurationError
from ..scrubber import redact_text

__all__ = ["clean_name", "clean_text"]


def clean_text(flag: str, text: str | None) -> str | None:
    """Free text for the policy plane with any credential in it replaced by
    ``[REDACTED]`` (said on stderr: the value never reaches a store or a log)."""
    if text is None:
        return None
    out = redact_text(text)
    if out != text:
        print(f"agent-saga: a credential in {flag} was replaced by [REDACTED] before it was stored (decisions "
              f"and levers are read by every agent, operator and approver)", file=sys.stderr)
    return out


def clean_name(flag: str, name: str | None) -> str | None:
    """A name for the policy plane; ``ConfigurationError`` when it holds a credential."""
    if name is not None and redact_text(name) != name:
        raise ConfigurationError(f"{flag} holds what looks like a credential: give the person's or team's name "
                                 f"(risk@corp), never a token")
    return name
