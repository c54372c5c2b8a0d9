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

if TYPE_CHECKING:
    from ..credentials import resolve_credential as resolve_credential
    from ..credentials import set_credential_resolver as set_credential_resolver
    from ._common import Indeterminate as Indeterminate

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._common": ("Indeterminate",),
    "..credentials": ("resolve_credential", "set_credential_resolver"),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
