"""Reference connectors: Stripe, PostgreSQL and Salesforce.

Each module registers its compensators and reconcilers when it is imported, so the agent,
the recovery daemon and ``agent-saga reconcile`` get the same handlers by importing the
same module::

    import agent_saga.connectors.stripe
    import agent_saga.connectors.postgres       # needs psycopg 3 (extra: postgres)
    import agent_saga.connectors.salesforce

Nothing here is imported by ``import agent_saga``, and this package imports none of the
connector modules: a process pays for (and needs the client libraries of) only the
connectors it uses.

Credentials never enter the log: connectors take ``credential_ref="stripe_prod"`` and
resolve it at use time through the process's resolver::

    from agent_saga.connectors import set_credential_resolver
    set_credential_resolver(lambda ref: vault.read(f"agents/{ref}"))
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from ..credentials import resolve_credential, set_credential_resolver

if TYPE_CHECKING:
    from ._common import Indeterminate

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._common": ("Indeterminate",),
}

__all__ = ["Indeterminate", "resolve_credential", "set_credential_resolver"]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
