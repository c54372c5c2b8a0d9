"""The runtime's one Redis module: import, connect, run scripts, report failure.

Every part of the runtime that talks to Redis (``RedisWAL``, the kill switch, the limit
store and source, the approval store, the recovery claims and ledger) goes through here,
so the choices below are made once:

- ``redis`` is imported only when a client is made (the core imports only the standard
  library); without it, ``ConfigurationError`` says which extra to install.
- Clients are made from a URL with explicit socket and connect timeouts and **no
  client-side retries** (``Retry(NoBackoff(), 0)``): a command is never re-sent behind the
  caller's back, because only the caller knows whether a repeat is safe (the limit store
  repeats a debit flagged as a repeat; a WAL batch is never repeated).
- Lua scripts are class constants with a KEYS/ARGV header, wrapped once with redis-py's
  ``register_script`` (``script``); the wrapper calls EVALSHA and reloads the script
  itself when the server answers NOSCRIPT (a restart, ``SCRIPT FLUSH``). Nothing here or
  elsewhere hand-writes that fallback.
- A failure becomes one error, ``StoreUnavailable`` (or the caller's subclass of it),
  whose message names the store without its password and passes through ``Scrubber``
  (a client error may echo its connection string): ``Target.unavailable``.
- ``confirmed_subscription``: the policy-plane readers subscribe to change notifications
  and only then read, which needs the server's SUBSCRIBE confirmation, not just the
  command (see ``agent_saga.controls._policyplane``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from .errors import ConfigurationError, StoreUnavailable
from .wal.urls import Scrubber, redact, secrets_in

__all__ = [
    "Target",
    "confirmed_subscription",
    "connect",
    "connect_async",
    "import_redis",
    "is_timeout",
    "script",
]

E = TypeVar("E", bound=StoreUnavailable)


def import_redis(feature: str) -> Any:
    """The ``redis`` package (``redis.asyncio``, ``redis.exceptions`` loaded too), or
    ``ConfigurationError`` naming ``feature`` and the extra to install."""
    try:
        import redis
        import redis.asyncio
        import redis.backoff
        import redis.exceptions
        import redis.retry
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigurationError(f"{feature} needs the redis package: pip install 'agent-saga[redis]'") from exc
    return redis


@dataclass(frozen=True, slots=True)
class Target:
    """Where a store talks to, said safely: ``url`` (``None`` for an injected client),
    ``where`` (the address without a password) and ``scrub`` (removes every form of the
    password from a text)."""

    url: str | None
    where: str
    scrub: Scrubber

    @classmethod
    def of(cls, target: str | Any) -> Target:
        """The target of a URL, or of a ready ``redis.Redis`` / ``redis.asyncio.Redis``."""
        if isinstance(target, str):
            return cls(target, redact(target), Scrubber(secrets_in(target)))
        try:
            kw = target.connection_pool.connection_kwargs
        except AttributeError:
            return cls(None, "redis://(injected client)", Scrubber())
        where = (f"redis unix://{kw['path']}" if "path" in kw
                 else f"redis://{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}")
        return cls(None, where, Scrubber([str(kw["password"])] if kw.get("password") else []))

    def error_text(self, exc: BaseException) -> str:
        """``Type: message`` of ``exc`` with any password removed."""
        return self.scrub(f"{type(exc).__name__}: {exc}")

    def unavailable(self, cls: type[E], message: str, exc: BaseException | None = None,
                    *, store: str, **kw: Any) -> E:
        """``cls(message (+ the scrubbed error), store=store)``: the one way a Redis failure
        is reported. The caller raises it ``from exc``."""
        text = message if exc is None else f"{message} ({self.error_text(exc)})"
        return cls(self.scrub(text), store=store, **kw)


def _no_retry(redis: Any, asynchronous: bool = False) -> Any:
    retry = redis.asyncio.retry.Retry if asynchronous else redis.retry.Retry
    return retry(redis.backoff.NoBackoff(), 0)


def connect(url: str, *, feature: str, socket_timeout: float, connect_timeout: float | None = None,
            **kw: Any) -> Any:
    """A ``redis.Redis`` for ``url`` with the project's timeouts and no client retries.

    ``feature`` names the caller in the error raised when ``redis`` is missing or the URL
    cannot be used (``ConfigurationError``, without the password). Extra keyword arguments
    go to ``redis.Redis.from_url`` (``single_connection_client=True``...)."""
    redis = import_redis(feature)
    try:
        return redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout if connect_timeout is None else connect_timeout,
            retry=_no_retry(redis),
            **kw,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"{feature}: {redact(url)} is not a usable Redis URL: {Scrubber(secrets_in(url))(str(exc))}"
        ) from None


def connect_async(url: str, *, feature: str, socket_timeout: float, connect_timeout: float | None = None,
                  max_connections: int | None = None, pool_timeout: float | None = None, **kw: Any) -> Any:
    """A ``redis.asyncio.Redis`` for ``url`` (bound to the running event loop once used),
    with the project's timeouts and no client retries. With ``max_connections`` the pool
    is bounded and a burst queues for at most ``pool_timeout`` seconds instead of failing
    with "Too many connections"."""
    redis = import_redis(feature)
    connect_timeout = socket_timeout if connect_timeout is None else connect_timeout
    try:
        if max_connections is not None:
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=pool_timeout,
                socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                retry=_no_retry(redis, True), **kw,
            )
            return redis.asyncio.Redis(connection_pool=pool)
        return redis.asyncio.Redis.from_url(
            url, socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
            retry=_no_retry(redis, True), **kw,
        )
    except (ValueError, TypeError) as exc:
        raise ConfigurationError(
            f"{feature}: {redact(url)} is not a usable Redis URL: {Scrubber(secrets_in(url))(str(exc))}"
        ) from None


def script(client: Any, lua: str) -> Any:
    """``client.register_script(lua)``: call it as ``s(keys=[...], args=[...], client=c)``
    (awaited for an asyncio client). It runs EVALSHA and, on NOSCRIPT, loads the script
    and runs it again; the script did not run the first time, so that repeat is safe."""
    return client.register_script(lua)


def is_timeout(exc: BaseException) -> bool:
    """Did ``exc`` end a request whose reply never came (it may have been executed)?"""
    try:
        import redis.exceptions as rex
    except ImportError:  # pragma: no cover
        return isinstance(exc, TimeoutError | asyncio.TimeoutError)
    return isinstance(exc, rex.TimeoutError | asyncio.TimeoutError | TimeoutError)


@contextlib.contextmanager
def confirmed_subscription(
    new_client: Callable[[], Any], channel: str, stop: threading.Event, timeout: float
) -> Iterator[tuple[Any, Any]]:
    """Yield ``(client, pubsub)`` once Redis confirmed the SUBSCRIBE to ``channel``.

    Raises ``TimeoutError`` if no confirmation arrives within ``timeout`` seconds; both the
    client and the pubsub are closed when the block exits, however it exits.
    """
    client = pubsub = None
    try:
        client = new_client()
        pubsub = client.pubsub()
        pubsub.subscribe(channel)
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            msg = pubsub.get_message(timeout=0.1)
            if msg is not None and msg.get("type") == "subscribe":
                break
            if time.monotonic() > deadline:
                raise TimeoutError("no SUBSCRIBE confirmation")
        yield client, pubsub
    finally:
        for closable in (pubsub, client):
            if closable is not None:
                with contextlib.suppress(Exception):
                    closable.close()
