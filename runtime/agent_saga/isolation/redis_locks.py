"""``RedisSemanticLocks``: semantic locks shared by every process of a fleet, in Redis.

``pip install 'agent-saga[redis]'``; the client is imported when the store is made.

Keys (``namespace`` defaults to ``agent-saga``)::

    {namespace}:lock:<resource_id>    STRING  the holder's saga id, PX = the lease

Invariants:
- Acquire is ``SET NX PX`` inside a script that, when the key is taken, answers who holds
  it (and extends it if that is the caller): one round trip, no window between the
  refusal and the name of the holder.
- Renewal (compare-and-extend) and release (compare-and-delete) compare the stored saga
  id before acting, in Lua, so no saga can extend or free another's claim, and a saga
  whose lease lapsed cannot free its successor's.
- Every script touches one key (no cross-slot risk on a Redis Cluster). Scripts are
  class constants run through ``agent_saga._redis.script`` (EVALSHA, reloaded by
  redis-py on NOSCRIPT).
- A request whose reply was lost (``agent_saga._repeat``) is sent again, at most
  ``retries`` times (default 1; 3 on a Redis Cluster): each is safe to repeat. An acquire
  carries the saga id, so a repeat finds the claim its earlier attempt took (and extends
  it); a renewal extends again; a repeated release that finds the resource free reports
  it released (its earlier attempt may have freed it; the claim is gone either way).
- A failure to reach the server raises ``LockStoreUnavailable`` naming the server
  without its password; nothing was claimed or freed (after lost replies: a claim an
  earlier attempt may have taken is released by its lease, a release stands).
"""

from __future__ import annotations

from typing import Any

from .._redis import AsyncRedisStore
from .._repeat import repeat_after
from ..errors import ConfigurationError
from ..recovery.redis import RedisClaimLock
from .errors import LockStoreUnavailable
from .locks import SemanticLocks

__all__ = ["RedisSemanticLocks"]

_FEATURE = "RedisSemanticLocks"


def _text(value: Any) -> str | None:
    if value is None or value is False or value == b"" or value == "":
        return None
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisSemanticLocks(AsyncRedisStore, SemanticLocks):
    """Semantic locks in Redis (see the module doc); the same calls as
    ``SemanticLockManager``. ``target`` is a ``redis://`` URL (its password never appears
    in a message) or a ``redis.asyncio.Redis`` client. ``retries``: how many times a
    request whose reply was lost is sent again (default 1; 3 on a Redis Cluster). Its
    client, scripts, repeats and ``close`` are ``agent_saga._redis.AsyncRedisStore``'s."""

    FEATURE = _FEATURE

    # KEYS[1] the lock key. ARGV[1] the saga id, ARGV[2] the lease in ms.
    # Returns {1, saga} if claimed (or already ours: extended), {0, holder} if not.
    ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return {1, ARGV[1]}
end
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return {1, holder}
end
return {0, holder or ''}
"""

    # KEYS[1] the lock key. ARGV[1] the saga id, ARGV[2] the lease in ms.
    # Extends the claim only if it is still ours; 1 if extended, 0 if not ours.
    RENEW = RedisClaimLock.RENEW  # the same compare-and-extend as a recovery claim

    # KEYS[1] the lock key. ARGV[1] the saga id, ARGV[2] "1" when this call repeats one
    # whose reply was lost.
    # Deletes the claim only if it is ours: {1, ''}; else {0, holder or ''} untouched. A
    # repeat that finds the resource free answers {1, ''}: its earlier attempt may have
    # freed it, and the claim is gone either way.
    RELEASE = """
local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return {1, ''}
end
if not holder and ARGV[2] == '1' then return {1, ''} end
return {0, holder or ''}
"""

    SCRIPTS = {"ACQUIRE": ACQUIRE, "RENEW": RENEW, "RELEASE": RELEASE}

    def __init__(self, target: str | Any, *, namespace: str = "agent-saga", socket_timeout: float = 5.0,
                 retries: int | None = None) -> None:
        self._open(target, socket_timeout=socket_timeout, retries=retries)
        if not isinstance(namespace, str) or not namespace or any(c in namespace for c in " \n\r{}"):
            raise ConfigurationError(
                f"namespace {namespace!r} must be a non-empty string without spaces or braces "
                f"(it prefixes every lock key: {{namespace}}:lock:<resource_id>)")
        if isinstance(socket_timeout, bool) or not isinstance(socket_timeout, int | float) or socket_timeout <= 0:
            raise ConfigurationError(f"socket_timeout must be a positive number of seconds, got {socket_timeout!r}")
        self._prefix = f"{{{namespace}}}:lock:"
        self._timeout = float(socket_timeout)
        self.description = f"semantic locks in {self.where} ({self._prefix}*)"

    def key(self, resource_id: str) -> str:
        """The Redis key of ``resource_id``'s claim."""
        return self._prefix + resource_id

    async def _eval(self, name: str, resource_id: str, args: list[Any], doing: str,
                    repeat_args: list[Any] | None = None) -> Any:
        """Run the script ``name``, repeated (with ``repeat_args`` if given) while its reply is lost."""
        client, run = self._bound(name)
        keys = [self.key(resource_id)]
        try:
            try:  # the first attempt, inline (an acquire and a release per claim): repeats are rare
                return await run(keys=keys, args=args, client=client)
            except Exception as exc:
                return await repeat_after(exc, lambda _repeat: run(keys=keys, args=repeat_args or args, client=client),
                                          retries=self._retries, client=client)
        except self._failures as exc:
            raise self._error(f"{doing} {resource_id!r}", exc) from exc

    def _error(self, doing: str, exc: BaseException) -> LockStoreUnavailable:
        store = f"Redis at {self.where}"
        return self._target.refusal(
            LockStoreUnavailable, store, exc, during=doing, refused=f"{store} failed while {doing}; nothing was "
            f"claimed or freed", lost="nothing was claimed or freed (a claim an earlier attempt may have taken "
            "lapses with its lease, a release it may have made stands)")

    async def _do_acquire(self, resource_id: str, saga_id: str, lease: float) -> tuple[bool, str | None]:
        ok, holder = await self._eval("ACQUIRE", resource_id, [saga_id, max(1, int(lease * 1000))], "claiming")
        return bool(int(ok)), _text(holder)

    async def _do_renew(self, resource_id: str, saga_id: str, lease: float) -> bool:
        return bool(int(await self._eval("RENEW", resource_id, [saga_id, max(1, int(lease * 1000))], "renewing")))

    async def _do_release(self, resource_id: str, saga_id: str) -> tuple[bool, str | None]:
        ok, holder = await self._eval("RELEASE", resource_id, [saga_id, "0"], "releasing", [saga_id, "1"])
        return bool(int(ok)), _text(holder)

    async def _do_holder(self, resource_id: str) -> str | None:
        client = self._client()
        try:
            return _text(await self._repeating(client, lambda _repeat: client.get(self.key(resource_id))))
        except self._failures as exc:
            raise self._error(f"reading the holder of {resource_id!r}", exc) from exc

    def __repr__(self) -> str:
        return f"<RedisSemanticLocks {self.where}>"
