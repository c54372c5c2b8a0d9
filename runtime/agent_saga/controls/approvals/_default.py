"""An approval store from a URL or a directory, and the process-wide approval provider.

A gate is normally handed its ``approval_provider`` (an ``ApprovalGateway`` over a store)
explicitly. The policy-plane wiring (``AGENT_SAGA_REDIS_URL``) sets a process-wide one,
used by gates built without ``approval_provider=``: it says only *where* requests go
(the policy plane, where the operator mirrors each as an ``Approval`` resource); *who*
may approve is still a named human with the right to patch that resource (or the
Redis credential of ``agent-saga approvals approve``), never the environment.
"""

from __future__ import annotations

import threading
from typing import Any

from ..._backends import REDIS_SCHEMES, Address, Backends
from ...errors import ConfigurationError
from ._local import FileApprovalStore
from ._store import ApprovalStore

__all__ = ["APPROVAL_STORES", "get_approval_provider", "open_approval_store", "set_approval_provider"]

_lock = threading.Lock()
_provider: Any = None


def set_approval_provider(provider: Any) -> Any:
    """Make ``provider`` (an ``ApprovalGateway``) the one every ``PreFlightGate`` built
    without ``approval_provider=`` asks; return the previous one (``None``: no provider,
    calls that need a human are refused)."""
    global _provider
    if provider is not None and not callable(getattr(provider, "request_approval", None)):
        raise ConfigurationError(f"set_approval_provider() takes an approval provider (ApprovalGateway), "
                                 f"got {provider!r}")
    with _lock:
        prev, _provider = _provider, provider
    return prev


def get_approval_provider() -> Any:
    """The process-wide approval provider, or ``None``."""
    return _provider


#: The approval stores, by scheme (``agent_saga._backends``).
APPROVAL_STORES: Backends[ApprovalStore] = Backends("approval store")


@APPROVAL_STORES.register("file")
def _directory(address: Address) -> ApprovalStore:
    return FileApprovalStore(address.path)


@APPROVAL_STORES.register(*REDIS_SCHEMES)
def _redis(address: Address) -> ApprovalStore:
    from .._policyplane import env_prefix
    from ._redis import RedisApprovalStore

    return RedisApprovalStore(address.url, prefix=env_prefix())


def open_approval_store(target: str) -> ApprovalStore:
    """A store from a ``redis://`` URL (``RedisApprovalStore``) or a directory path or
    ``file://`` (``FileApprovalStore``). Raises ``ConfigurationError`` for another scheme."""
    return APPROVAL_STORES.open(target)
