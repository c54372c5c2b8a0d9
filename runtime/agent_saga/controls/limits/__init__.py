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
    from ._default import ENV_LIMIT_STORE as ENV_LIMIT_STORE
    from ._default import LIMIT_STORES as LIMIT_STORES
    from ._default import get_limit_source as get_limit_source
    from ._default import get_limit_store as get_limit_store
    from ._default import open_limit_store as open_limit_store
    from ._default import peek_limit_store as peek_limit_store
    from ._default import set_limit_source as set_limit_source
    from ._default import set_limit_store as set_limit_store
    from ._fleet import fleet_signs as fleet_signs
    from ._fleet import warn_if_fleet as warn_if_fleet
    from ._local import InProcessLimitStore as InProcessLimitStore
    from ._model import BudgetLimit as BudgetLimit
    from ._model import Charge as Charge
    from ._model import DebitResult as DebitResult
    from ._model import Limit as Limit
    from ._model import LimitKind as LimitKind
    from ._model import LimitSpec as LimitSpec
    from ._model import LimitUnreadable as LimitUnreadable
    from ._model import LimitUsage as LimitUsage
    from ._model import RateLimit as RateLimit
    from ._model import display_amount as display_amount
    from ._model import format_amount as format_amount
    from ._redis import RedisLimitStore as RedisLimitStore
    from ._scopes import Scope as Scope
    from ._scopes import ScopeUnreadable as ScopeUnreadable
    from ._scopes import by_arg as by_arg
    from ._scopes import by_tool as by_tool
    from ._scopes import combine as combine
    from ._scopes import global_scope as global_scope
    from ._source import LimitSnapshot as LimitSnapshot
    from ._source import LimitSource as LimitSource
    from ._source import RedisLimitSource as RedisLimitSource
    from ._source import limits_from_documents as limits_from_documents
    from ._source import scope_from_name as scope_from_name
    from ._store import LimitStore as LimitStore
    from ._store import LimitStoreUnavailable as LimitStoreUnavailable

#: The public names, by module: the one list (``agent_saga._lazy``); __all__ derives from it.
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

__getattr__, __dir__, __all__ = lazy_exports(__name__, _SOURCES)
