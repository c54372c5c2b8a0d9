"""The ContextBroker: HOT / WARM / COLD context where every summary carries SHA-256
receipts into its sources, a drifted source is evicted and never served, and every
serving is recorded (docs/agent-runtime.md, "Context").

    broker = ContextBroker()
    broker.add_file("docs/refund-policy.md")                         # HOT
    broker.summarize("refunds", "Refunds within 30 days.", ["docs/refund-policy.md"])
    served = broker.serve()          # re-verified; CONTEXT_SERVED recorded
    router.complete(ModelRequest(served.messages + (Message("user", q),)), context=served)

Public: ContextBroker, Tier, Receipt, ContextItem, ServedContext, Eviction,
DriftedSource, and the record types SERVED (``CONTEXT_SERVED``) and EVICTED
(``CONTEXT_EVICTED``).
"""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports

if TYPE_CHECKING:
    from ._broker import (
               EVICTED,
               SERVED,
               ContextBroker,
               ContextItem,
               DriftedSource,
               Eviction,
               Receipt,
               ServedContext,
               Tier,
    )

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._broker": (
        "EVICTED", "SERVED", "ContextBroker", "ContextItem", "DriftedSource", "Eviction",
        "Receipt", "ServedContext", "Tier",
    ),
}

__all__ = [
    "ContextBroker",
    "ContextItem",
    "DriftedSource",
    "EVICTED",
    "Eviction",
    "Receipt",
    "SERVED",
    "ServedContext",
    "Tier",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
