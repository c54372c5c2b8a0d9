"""What the connectors share: the indeterminate outcome and the credential lookup."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..credentials import resolve_credential
from ..errors import ConfigurationError

__all__ = ["Indeterminate", "credential_fields"]


class Indeterminate(RuntimeError):
    """The connector cannot safely decide: it did nothing, and a human must look.

    Raised by a compensation that finds the system in a state it did not leave it in (a
    concurrent writer touched the row, the record was modified since the step): the
    rollback escalates the step with this message instead of overwriting someone's work.
    """


def credential_fields(ref: str, connector: str, required: tuple[str, ...], *, plain: str | None = None) -> dict[str, Any]:
    """Resolve ``ref`` to a mapping holding ``required`` keys.

    A resolver may return the mapping, or (when ``plain`` names the key) a bare string for
    that key. Raises ``ConfigurationError`` naming what is missing, never the values.
    """
    secret = resolve_credential(ref)
    if isinstance(secret, str) and plain is not None:
        secret = {plain: secret}
    if not isinstance(secret, Mapping):
        raise ConfigurationError(
            f"the credential resolver returned a {type(secret).__name__} for credential_ref={ref!r}; "
            f"the {connector} connector needs a mapping with {', '.join(required)}"
            + (f" (or a string: the {plain})" if plain else "")
        )
    missing = [k for k in required if not secret.get(k)]
    if missing:
        raise ConfigurationError(
            f"the credential credential_ref={ref!r} has no {', '.join(missing)}: the {connector} "
            f"connector needs {', '.join(required)}"
        )
    return dict(secret)
