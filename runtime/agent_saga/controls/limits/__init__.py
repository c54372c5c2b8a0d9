"""Spend and rate limits over sliding windows, and the stores that keep the windows.

    BudgetLimit("daily-spend", arg="amount", max_total=50_000, window=86_400, scope=by_arg("customer"))
    RateLimit("velocity", max_calls=20, window=60)
    set_limit_store(RedisLimitStore(url))      # fleet-wide; InProcessLimitStore() is the default
    PreFlightGate(limits=RedisLimitSource(url, namespaces=["payments"]))   # the operator's limits

The layout every control shares (``agent_saga.controls``):

    _model.py    BudgetLimit, RateLimit and the values a store sees (LimitSpec, Charge,
                 DebitResult, LimitUsage)
    _scopes.py   which window a call is counted in (global_scope, by_tool, by_arg, combine)
    _store.py    the LimitStore protocol (one atomic check-and-debit) and its error
    _local.py    InProcessLimitStore: exact, zero-dependency, one process
    _redis.py    RedisLimitStore: one Lua script per call, shared by a fleet
    _source.py   RedisLimitSource: limit definitions read from the policy plane
    _default.py  open_limit_store(url) and the process-wide store (set/get_limit_store)
    _fleet.py    the warning when an in-process store runs in what looks like a fleet

Only this module is public; the gate (``agent_saga.controls.gate``) uses these names.
"""

from typing import TYPE_CHECKING

from ..._lazy import lazy_exports

if TYPE_CHECKING:
    from ._default import (
        ENV_LIMIT_STORE,
        LIMIT_STORES,
        get_limit_source,
        get_limit_store,
        open_limit_store,
        peek_limit_store,
        set_limit_source,
        set_limit_store,
    )
    from ._fleet import fleet_signs, warn_if_fleet
    from ._local import InProcessLimitStore
    from ._model import (
        BudgetLimit,
        Charge,
        DebitResult,
        Limit,
        LimitKind,
        LimitSpec,
        LimitUnreadable,
        LimitUsage,
        RateLimit,
        display_amount,
        format_amount,
    )
    from ._redis import RedisLimitStore
    from ._scopes import Scope, ScopeUnreadable, by_arg, by_tool, combine, global_scope
    from ._source import (
        LimitSnapshot,
        LimitSource,
        RedisLimitSource,
        limits_from_documents,
        scope_from_name,
    )
    from ._store import LimitStore, LimitStoreUnavailable

#: Each public name -> its module, loaded on first use (``agent_saga._lazy``).
_SOURCES: dict[str, tuple[str, ...]] = {
    "._default": (
        "ENV_LIMIT_STORE", "LIMIT_STORES", "get_limit_source", "get_limit_store",
        "open_limit_store", "peek_limit_store", "set_limit_source", "set_limit_store",
    ),
    "._fleet": ("fleet_signs", "warn_if_fleet"),
    "._local": ("InProcessLimitStore",),
    "._model": (
        "BudgetLimit", "Charge", "DebitResult", "Limit", "LimitKind", "LimitSpec",
        "LimitUnreadable", "LimitUsage", "RateLimit", "display_amount", "format_amount",
    ),
    "._redis": ("RedisLimitStore",),
    "._scopes": ("Scope", "ScopeUnreadable", "by_arg", "by_tool", "combine", "global_scope"),
    "._source": (
        "LimitSnapshot", "LimitSource", "RedisLimitSource", "limits_from_documents",
        "scope_from_name",
    ),
    "._store": ("LimitStore", "LimitStoreUnavailable"),
}

__all__ = [
    "LIMIT_STORES",
    "ENV_LIMIT_STORE",
    "BudgetLimit",
    "Charge",
    "DebitResult",
    "InProcessLimitStore",
    "Limit",
    "LimitKind",
    "LimitSnapshot",
    "LimitSource",
    "LimitSpec",
    "LimitStore",
    "LimitStoreUnavailable",
    "LimitUnreadable",
    "LimitUsage",
    "RateLimit",
    "RedisLimitSource",
    "RedisLimitStore",
    "Scope",
    "ScopeUnreadable",
    "by_arg",
    "by_tool",
    "combine",
    "fleet_signs",
    "display_amount",
    "format_amount",
    "get_limit_store",
    "global_scope",
    "limits_from_documents",
    "get_limit_source",
    "open_limit_store",
    "set_limit_source",
    "peek_limit_store",
    "scope_from_name",
    "set_limit_store",
    "warn_if_fleet",
]

__getattr__, __dir__ = lazy_exports(__name__, _SOURCES, __all__)
