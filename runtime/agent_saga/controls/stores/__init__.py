"""Limit stores behind one interface (``LimitStore``).

``InProcessLimitStore`` is the zero-dependency default; ``RedisLimitStore`` imports
``redis`` only when it is used (``pip install agent-saga[redis]``).
"""

from .base import Charge, DebitResult, LimitSpec, LimitStore, LimitStoreUnavailable, LimitUsage
from .default import ENV_LIMIT_STORE, get_limit_store, peek_limit_store, set_limit_store
from .inprocess import InProcessLimitStore
from .redis import RedisLimitStore

__all__ = [
    "ENV_LIMIT_STORE",
    "Charge",
    "DebitResult",
    "InProcessLimitStore",
    "LimitSpec",
    "LimitStore",
    "LimitStoreUnavailable",
    "LimitUsage",
    "RedisLimitStore",
    "get_limit_store",
    "peek_limit_store",
    "set_limit_store",
]
