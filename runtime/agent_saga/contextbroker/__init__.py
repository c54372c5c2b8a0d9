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
    from ._broker import EVICTED as EVICTED
    from ._broker import SERVED as SERVED
    from ._broker import ContextBroker as ContextBroker
    from ._broker import ContextItem as ContextItem
    from ._broker import DriftedSource as DriftedSource
    from ._broker import Eviction as Eviction
    from ._broker import Receipt as Receipt
    from ._broker import ServedContext as ServedContext
    from ._broker import Tier as Tier

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
_SOURCES: dict[str, tuple[str, ...]] = {
    "._broker": (
        "EVICTED", "SERVED", "ContextBroker", "ContextItem", "DriftedSource", "Eviction",
        "Receipt", "ServedContext", "Tier",
    ),
}

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
