"""The runtime's one Redis module: import, connect, run scripts, report failure.

Every part of the runtime that talks to Redis (``RedisWAL``, the kill switch, the limit
store and source, the approval store, the recovery claims and ledger) goes through here,
so the choices below are made once:

- ``redis`` is imported only when a client is made (the core imports only the standard
  library); without it, ``ConfigurationError`` says which extra to install.
- Clients are made from a URL with explicit socket and connect timeouts and **no
  client-side retries** (``Retry(NoBackoff(), 0)``): a command is never re-sent behind the
  caller's back, because only the caller knows whether a repeat is safe: the stores
  repeat through ``agent_saga._repeat`` what is (reads, idempotent writes, a debit
  flagged as a repeat); a WAL batch is never repeated.
- Lua scripts are class constants with a KEYS/ARGV header, wrapped once with redis-py's
  ``register_script`` (``script``); the wrapper calls EVALSHA and reloads the script
  itself when the server answers NOSCRIPT (a restart, ``SCRIPT FLUSH``). Nothing here or
  elsewhere hand-writes that fallback.
- A failure becomes one error, ``StoreUnavailable`` (or the caller's subclass of it),
  whose message names the store without its password and passes through ``Scrubber``
  (a client error may echo its connection string): ``Target.unavailable``.
- Three topologies, chosen by the URL's scheme (``topology``): one server
  (``redis://``, ``rediss://``, ``unix://``); a Sentinel-managed primary
  (``redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/SERVICE[?db=N]``, the
  client asks the Sentinels for the primary on every new connection and follows a
  failover); a Redis Cluster (``redis+cluster://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]``,
  the client follows MOVED/ASK, which the server sent instead of running the command,
  and never re-sends a command whose reply was lost). ``rediss+`` is TLS for both.
  Multi-key scripts name their keys with one hash tag (``{agent-saga}:...``) so they
  stay in one cluster slot.
- Two store bases, so a store is a declaration (its name, error type and scripts), not
  plumbing: ``RedisStore`` (synchronous: the policy-plane readers, the approval store,
  the heartbeat) owns the client (its own or the agent's shared one,
  ``agent_saga._shared``), the scripts, the repeats, the error mapping, the cluster
  guard and ``close``; ``AsyncRedisStore`` (the limit store, the recovery claims and
  ledger, the semantic locks) the same with a client per event loop. ``RedisWAL``
  stands on the helpers only: a WAL batch is never repeated, and it fails as a WAL.
- ``confirmed_subscription``: the policy-plane readers subscribe to change notifications
  and only then read, which needs the server's SUBSCRIBE confirmation, not just the
  command (see ``agent_saga.controls._policyplane``).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import threading
import time
import urllib.parse
import weakref
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ._repeat import OnRepeat, ReplyLost, check_retries, lost_text, repeating, repeating_sync
from .errors import ConfigurationError, StoreUnavailable
from .wal.urls import Scrubber, redact, secrets_in

__all__ = [
    "CLUSTER_SCHEMES",
    "AsyncRedisStore",
    "PLANE_FIX",
    "SENTINEL_SCHEMES",
    "LazyCluster",
    "RedisStore",
    "Target",
    "Topology",
    "aclose",
    "confirmed_subscription",
    "connect",
    "connect_async",
    "dedicated",
    "failures",
    "has_hash_tag",
    "import_redis",
    "is_cluster",
    "lost_connection",
    "is_timeout",
    "key_slot",
    "one_slot",
    "script",
    "tagged_on_cluster",
    "topology",
]

#: A Sentinel-managed primary: ``redis+sentinel://[USER:PW@]H:P[,H:P]/SERVICE[?db=N]``.
SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
#: A Redis Cluster: ``redis+cluster://[USER:PW@]H:P[,H:P]``.
CLUSTER_SCHEMES = ("redis+cluster", "rediss+cluster")
_SENTINEL_QUERY = ("db", "sentinel_username", "sentinel_password")

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


def failures(redis: Any) -> tuple[type[BaseException], ...]:
    """What a Redis call raises when the server cannot serve it: ``RedisError`` and, from
    a Redis Cluster client, ``RedisClusterException`` (no node reachable, a slot not
    served), which redis-py does not derive from ``RedisError``. Catch this tuple, never
    ``RedisError`` alone, so a cluster failure is reported like any other."""
    return (redis.exceptions.RedisError, redis.exceptions.RedisClusterException)


def lost_connection(redis: Any) -> tuple[type[BaseException], ...]:
    """What a call raises when its connection was lost, so that repeating it may succeed:
    ``ConnectionError``, ``TimeoutError``, and ``AttributeError``. The last is from
    redis-py's asyncio Cluster client: to re-read the topology (after ``MOVED`` replies, a
    ``CLUSTERDOWN``) it closes every connection it holds, including those other calls are
    using at that moment, which then find their socket gone (``'NoneType' object has no
    attribute 'writelines'`` or ``'readline'``)."""
    return (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, AttributeError)


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

    def refusal(self, cls: type[E], store: str, exc: BaseException, *, during: str, refused: str, lost: str,
                cause: bool = True) -> E:
        """A request's failure as ``cls``: after spent repeats (``ReplyLost``) the lost-reply
        text of ``during`` ending with ``lost`` (it may have run); otherwise ``refused``
        (with ``exc`` appended unless ``cause`` is False)."""
        if isinstance(exc, ReplyLost):
            return self.unavailable(cls, lost_text(store, during, exc, lost), store=store)
        return self.unavailable(cls, refused, exc if cause else None, store=store)


@dataclass(frozen=True, slots=True)
class Topology:
    """What a Redis URL names: ``kind`` (``single``, ``sentinel`` or ``cluster``), the
    seed ``nodes`` (Sentinels or cluster nodes), the Sentinel ``service``, and the
    connection settings of the data nodes (``username``, ``password``, ``db``, ``ssl``)
    and of the Sentinels (``sentinel_username``, ``sentinel_password``)."""

    kind: str
    nodes: tuple[tuple[str, int], ...] = ()
    service: str = ""
    username: str | None = None
    password: str | None = None
    db: int = 0
    ssl: bool = False
    sentinel_username: str | None = None
    sentinel_password: str | None = None

    def node_kwargs(self) -> dict[str, Any]:
        out: dict[str, Any] = {"username": self.username, "password": self.password}
        if self.ssl:
            out["ssl"] = True
        return out


def topology(url: str) -> Topology:
    """The topology ``url`` names; raises ``ConfigurationError`` (without the password)
    naming what to fix in a Sentinel or Cluster URL."""
    scheme = url.split("://", 1)[0].lower() if "://" in url else ""
    if scheme not in SENTINEL_SCHEMES + CLUSTER_SCHEMES:
        return Topology("single")
    sentinel = scheme in SENTINEL_SCHEMES
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    userinfo, _, hosts = netloc.rpartition("@")
    username = password = None
    if userinfo:
        user, _, pw = userinfo.partition(":")
        username, password = urllib.parse.unquote(user) or None, urllib.parse.unquote(pw) or None

    def bad(why: str) -> ConfigurationError:
        example = ("redis+sentinel://HOST:26379[,HOST:26379]/SERVICE?db=0" if sentinel
                   else "redis+cluster://HOST:6379[,HOST:6379]")
        return ConfigurationError(f"{redact(url)}: {why}; the form is {example}")

    nodes: list[tuple[str, int]] = []
    for item in filter(None, hosts.split(",")):
        host, sep, port = item.rpartition(":") if item.rpartition(":")[2].isdigit() else (item, "", "")
        host = host.strip("[]")
        if not host:
            raise bad(f"{item!r} is not HOST:PORT")
        nodes.append((host, int(port) if sep else (26379 if sentinel else 6379)))
    if not nodes:
        raise bad("no host given")
    query = dict(urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    allowed = _SENTINEL_QUERY if sentinel else ()
    unknown = sorted(set(query) - set(allowed))
    if unknown:
        raise bad(f"unknown parameter(s) {', '.join(unknown)} (takes {', '.join(allowed) or 'none'})")
    path = parts.path.strip("/")
    if sentinel:
        if not path or "/" in path:
            raise bad("the path must be the Sentinel service name (the primary's name)")
        try:
            db = int(query.get("db") or 0)
        except ValueError:
            raise bad(f"db must be a number, got {query['db']!r}") from None
        return Topology("sentinel", tuple(nodes), urllib.parse.unquote(path), username, password, db,
                        scheme.startswith("rediss"), query.get("sentinel_username") or None,
                        query.get("sentinel_password") or None)
    if path not in ("", "0"):
        raise bad(f"a Redis Cluster has only database 0, got /{path}")
    return Topology("cluster", tuple(nodes), "", username, password, 0, scheme.startswith("rediss"))


def is_cluster(client: Any) -> bool:
    """Is ``client`` a Redis Cluster client (sync or asyncio)?"""
    return isinstance(client, LazyCluster) or hasattr(client, "nodes_manager")


class LazyCluster:
    """A synchronous ``RedisCluster`` made on first use, which is what ``connect`` returns
    for a cluster URL. redis-py's sync cluster client reads the slot map from a node when
    it is constructed (and raises if none answers); a one-server client connects on its
    first command. Every store opens its client when it is made and reports an unreachable
    Redis on its first call (fail closed then, not a crash at start), so the cluster
    client is made then too, and made again on the next call if that failed."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._client: Any = None
        self._lock = threading.Lock()

    def _real(self) -> Any:
        client = self._client
        if client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._make()
                client = self._client
        return client

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real(), name)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> LazyCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def dedicated(client: Any) -> Any:
    """A client that sends everything on one connection of ``client``'s pool (what
    ``WAIT`` needs: it covers the writes of its own connection). A Cluster client is
    returned as is: its commands go to the node owning each key's slot."""
    if is_cluster(client):
        return client
    return type(client)(connection_pool=client.connection_pool, single_connection_client=True)


def key_slot(key: str) -> int:
    """The Redis Cluster slot of ``key`` (CRC16 of its hash tag or whole name, mod 16384)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1:end]
    crc = 0
    for byte in key.encode():
        crc ^= byte << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x1021) if crc & 0x8000 else crc << 1
            crc &= 0xFFFF
    return crc % 16384


def _no_retry(redis: Any, asynchronous: bool = False) -> Any:
    retry = redis.asyncio.retry.Retry if asynchronous else redis.retry.Retry
    return retry(redis.backoff.NoBackoff(), 0)


def connect(url: str, *, feature: str, socket_timeout: float, connect_timeout: float | None = None,
            max_connections: int | None = None, **kw: Any) -> Any:
    """A ``redis.Redis`` for ``url`` with the project's timeouts and no client retries.

    ``feature`` names the caller in the error raised when ``redis`` is missing or the URL
    cannot be used (``ConfigurationError``, without the password). With ``max_connections``
    the pool of one server is bounded and a command waits at most ``3 × socket_timeout``
    for a connection (its holders give it back within ``socket_timeout`` unless their
    process is starved of CPU), then fails as an unreachable server does
    (``agent_saga._shared``; Sentinel and Cluster pools are left as they are). Extra keyword arguments go to
    ``redis.Redis.from_url`` (``single_connection_client=True``...)."""
    redis = import_redis(feature)
    connect_timeout = socket_timeout if connect_timeout is None else connect_timeout
    topo = topology(url)
    try:
        if topo.kind == "sentinel":
            import redis.sentinel

            single = kw.pop("single_connection_client", False)
            sentinels = redis.sentinel.Sentinel(
                list(topo.nodes), sentinel_kwargs=_sentinel_kwargs(topo, socket_timeout, connect_timeout),
                socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                retry=_no_retry(redis), db=topo.db, **topo.node_kwargs(), **kw)
            client = sentinels.master_for(topo.service)
            return dedicated(client) if single else client
        if topo.kind == "cluster":
            import redis.cluster

            kw.pop("single_connection_client", None)
            return LazyCluster(lambda: redis.cluster.RedisCluster(
                startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in topo.nodes],
                socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                retry=_no_retry(redis), require_full_coverage=True, **topo.node_kwargs(), **kw))
        if max_connections is not None:
            pool = redis.BlockingConnectionPool.from_url(
                url, max_connections=max_connections, timeout=3 * socket_timeout, socket_timeout=socket_timeout,
                socket_connect_timeout=connect_timeout, retry=_no_retry(redis), **kw)
            return redis.Redis(connection_pool=pool)
        return redis.Redis.from_url(
            url,
            socket_timeout=socket_timeout,
            socket_connect_timeout=connect_timeout,
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
    of one server is bounded and a burst queues for at most ``pool_timeout`` seconds
    instead of failing with "Too many connections" (Sentinel and Cluster pools do not
    queue, so theirs are left unbounded)."""
    redis = import_redis(feature)
    connect_timeout = socket_timeout if connect_timeout is None else connect_timeout
    topo = topology(url)
    try:
        if topo.kind == "sentinel":
            import redis.asyncio.sentinel

            # The Sentinel pool is not a blocking pool: a burst beyond max_connections
            # fails instead of queueing, so it is left unbounded.
            sentinels = redis.asyncio.sentinel.Sentinel(
                list(topo.nodes), sentinel_kwargs=_sentinel_kwargs(topo, socket_timeout, connect_timeout),
                socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                retry=_no_retry(redis, True), db=topo.db, **topo.node_kwargs(), **kw)
            return sentinels.master_for(topo.service)
        if topo.kind == "cluster":
            import redis.asyncio.cluster

            # Nor is the cluster's (per node, 100 by default): beyond its max_connections a
            # call fails at once (MaxConnectionsError) instead of queueing, so it is
            # left unbounded too.
            return redis.asyncio.cluster.RedisCluster(max_connections=2**31,
                startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in topo.nodes],
                socket_timeout=socket_timeout, socket_connect_timeout=connect_timeout,
                retry=_no_retry(redis, True), require_full_coverage=True, **topo.node_kwargs(), **kw)
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


async def aclose(client: Any) -> None:
    """Close an asyncio client made by ``connect_async`` and every connection it holds.

    A one-server or Sentinel client closes its pool. A Cluster client has a pool per node,
    and redis-py's ``RedisCluster.aclose()`` closes them only while the client counts as
    initialized: a connection or timeout error marks it for re-initialization (the slot
    map is read again on the next command), and from then until a command succeeds its
    ``aclose()`` does nothing, leaving open every connection it made before the failure
    (to the seed node asked for the slot map, to the other masters). So after it every
    node the client knows, the seeds included, is disconnected here."""
    if not is_cluster(client):
        await client.aclose(close_connection_pool=True)
        return
    await client.aclose()
    manager = client.nodes_manager
    nodes = {id(n): n for n in (*manager.nodes_cache.values(), *manager.startup_nodes.values())}
    for node in nodes.values():
        with contextlib.suppress(Exception):  # a connection that fails to close is gone
            await node.disconnect()


def _sentinel_kwargs(topo: Topology, socket_timeout: float, connect_timeout: float) -> dict[str, Any]:
    out: dict[str, Any] = {"socket_timeout": socket_timeout, "socket_connect_timeout": connect_timeout,
                           "username": topo.sentinel_username, "password": topo.sentinel_password}
    if topo.ssl:
        out["ssl"] = True
    return out


def script(client: Any, lua: str) -> Any:
    """``client.register_script(lua)``: call it as ``s(keys=[...], args=[...], client=c)``
    (awaited for an asyncio client). It runs EVALSHA and, on NOSCRIPT, loads the script
    and runs it again; the script did not run the first time, so that repeat is safe.
    On a Redis Cluster client the call first checks that its keys share one slot
    (``one_slot``): a cross-slot script is a configuration error, not a server error."""
    if not is_cluster(client):
        return client.register_script(lua)
    owner, registered = client, list[Any]()  # registered at the first call: a LazyCluster is made then

    def call(keys: Any = None, args: Any = None, client: Any = None) -> Any:
        one_slot(list(keys or ()), "a Lua script")
        if not registered:
            registered.append(owner.register_script(lua))
        return registered[0](keys=keys, args=args, client=client)

    call.sha = hashlib.sha1(lua.encode()).hexdigest()  # type: ignore[attr-defined]  # noqa: S324 - Redis's name
    return call


def one_slot(keys: list[str], what: str) -> None:
    """Raise ``ConfigurationError`` unless ``keys`` share one Redis Cluster slot, naming
    the fix (one hash tag in the prefix)."""
    slots = {key_slot(k) for k in keys}
    if len(slots) > 1:
        raise ConfigurationError(
            f"{what} touches keys in {len(slots)} Redis Cluster slots ({', '.join(keys[:4])}): on a cluster give "
            f"the key prefix one hash tag, e.g. {{agentsaga}} for the policy plane or {{agent-saga}}:wal for a WAL")


def has_hash_tag(prefix: str) -> bool:
    """Does ``prefix`` carry a hash tag (``{...}``, not empty), so that every key built on
    it lands in one Redis Cluster slot?"""
    start = prefix.find("{")
    return start >= 0 and prefix.find("}", start + 1) > start + 1


#: How to give the policy plane's key prefix a hash tag (said when a cluster needs one).
PLANE_FIX = ("pass prefix='{agentsaga}:v1', or set the key prefix to {agentsaga} in AGENT_SAGA_KEY_PREFIX, "
             "the operator's --key-prefix and the chart's policyPlane.keyPrefix (one value for every "
             "reader and writer of the plane)")


def tagged_on_cluster(url: str, prefix: str, what: str, fix: str) -> None:
    """Raise ``ConfigurationError`` if ``url`` names a Redis Cluster and ``prefix`` has no
    hash tag: every script of ``what`` touches several keys of the prefix, which a cluster
    runs only if they share one slot. The message ends with ``fix`` (the setting to change)."""
    if not has_hash_tag(prefix) and topology(url).kind == "cluster":
        raise ConfigurationError(
            f"{what}: on a Redis Cluster the key prefix {prefix!r} needs a hash tag, so that each "
            f"script's keys share one slot: {fix}")


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


T = TypeVar("T")


class RedisStore:
    """Base of a synchronous Redis-backed store: the store declares, the base connects.

    A store declares itself in class attributes and opens the base in its ``__init__``::

        class RedisThingStore(RedisStore):
            NAME = "RedisThingStore"              # names it in messages and as the redis feature
            UNAVAILABLE = ThingStoreUnavailable   # the StoreUnavailable subclass it raises
            LUA_PUT = "..."                        # its scripts, each with a KEYS/ARGV header

            def __init__(self, url, *, prefix, retries=None, ...):
                self._open(url, socket_timeout=..., connect_timeout=..., retries=retries,
                           prefix=prefix)

    The base then owns, once for every store:

    - the client (``_main_client``): made on first use by ``connect`` (no client-side
      retries), or the agent's shared one once ``share_connections`` was called
      (``agent_saga._shared``); ``_new_client`` makes another (a subscriber's own);
    - the scripts (``_script(client, lua)``): wrapped once per client by ``script``
      (EVALSHA; redis-py reloads a script on NOSCRIPT; one slot checked on a cluster);
    - the repeats (``_repeating``): a request whose reply was lost is sent again at most
      ``retries`` times (default 1; 3 on a Redis Cluster: ``agent_saga._repeat``), and
      only the requests the store passes there (those safe to repeat);
    - the error mapping (``_unavailable``): one ``UNAVAILABLE`` naming the store without
      its password, scrubbed; after spent repeats, the lost-reply text (``lost_text``);
    - the cluster guard: with ``prefix``, a Redis Cluster URL needs a hash tag in it
      (``tagged_on_cluster``), or ``ConfigurationError`` names ``PREFIX_FIX``;
    - ``close``: forgets the scripts and closes its own client (a shared one is closed by
      its owner, ``SharedConnections.close``).

    No per-call work is added: a call looks up the client and its script in a dict, as
    each store did by hand.
    """

    NAME: ClassVar[str] = "RedisStore"
    #: What a missing ``redis`` package or a cluster guard names (default ``NAME``).
    FEATURE: ClassVar[str | None] = None
    UNAVAILABLE: ClassVar[type[StoreUnavailable]] = StoreUnavailable
    PREFIX_FIX: ClassVar[str] = PLANE_FIX

    url: str

    def _open(self, url: str, *, socket_timeout: float, connect_timeout: float, retries: int | None = None,
              prefix: str | None = None) -> None:
        """Check ``url`` and ``retries`` (and, with ``prefix``, the cluster guard) and set
        up the plumbing; no connection is made until the first call."""
        if not isinstance(url, str) or not url:
            raise ConfigurationError(f"{self.NAME} needs a redis:// URL")
        self._retries = check_retries(retries)
        self._feature = self.FEATURE or self.NAME
        if prefix is not None:
            tagged_on_cluster(url, prefix, self._feature, self.PREFIX_FIX)
        self.url = url
        self._target = Target.of(url)
        self._scrub = self._target.scrub
        self._described = f"{self.NAME}({self._target.where})"
        self._socket_timeout = socket_timeout
        self._connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._client: Any = None
        self._shared: Any = None  # agent_saga._shared.SharedConnections
        self._scripts: dict[tuple[int, str], Any] = {}

    def describe(self) -> str:
        """``<NAME>(<address without password>)``: how messages and status name the store."""
        return self._described

    def share_connections(self, shared: Any) -> None:
        """Use ``shared`` (``agent_saga._shared.SharedConnections``: the agent's one client
        per URL and timeouts, and one pub/sub connection) instead of connections of its
        own. Call before the first call; ``close`` then leaves them to ``shared.close()``."""
        self._shared = shared

    def _new_client(self) -> Any:
        if self._shared is not None:
            return self._shared.client(self.url, feature=self._feature, socket_timeout=self._socket_timeout,
                                       connect_timeout=self._connect_timeout)
        return connect(self.url, feature=self._feature, socket_timeout=self._socket_timeout,
                       connect_timeout=self._connect_timeout)

    def _main_client(self) -> Any:
        """The store's client (made on first use)."""
        if self._client is None:
            with self._lock:
                if self._client is None:
                    self._client = self._new_client()
        return self._client

    def _script(self, client: Any, lua: str) -> Any:
        """``lua`` wrapped once per client (``script``)."""
        k = (id(client), lua)
        s = self._scripts.get(k)
        if s is None:
            s = self._scripts[k] = script(client, lua)
        return s

    def _repeating(self, client: Any, send: Callable[[bool], T], *, retries: int | None = None,
                   deadline: float | None = None, on_repeat: OnRepeat | None = None) -> T:
        """``send(repeat)``, sent again while its reply is lost (only for a request safe to
        repeat), at most ``retries`` times (default the store's) and not after ``deadline``;
        then ``ReplyLost``."""
        return repeating_sync(send, retries=self._retries if retries is None else retries, client=client,
                              deadline=deadline, on_repeat=on_repeat)

    def _unavailable(self, message: str, exc: BaseException | None = None, *, during: str = "a read",
                     after: str | None = None) -> StoreUnavailable:
        """The store's ``UNAVAILABLE`` saying ``message`` (and ``exc``, scrubbed); after
        spent repeats (``ReplyLost``) the lost-reply text of ``during``, ending ``after``
        (default ``message``). The caller raises it ``from exc``."""
        if exc is None:
            return self._target.unavailable(self.UNAVAILABLE, message, store=self._described)
        return self._target.refusal(self.UNAVAILABLE, self._described, exc, during=during, refused=message,
                                    lost=message if after is None else after)

    def close(self) -> None:
        """Forget the scripts and close the store's own client (never a shared one)."""
        client, self._client = self._client, None
        self._scripts.clear()
        if client is not None and self._shared is None:
            with contextlib.suppress(Exception):
                client.close()


class AsyncRedisStore:
    """Base of an asyncio Redis-backed store (the limit store, the recovery claims and
    ledger, the semantic locks): the store declares its ``FEATURE`` (named when ``redis``
    is missing or the URL is unusable) and its ``SCRIPTS`` (name -> Lua), opens the base
    with ``_open``, and the base owns:

    - the client (``_held``/``_client``): an injected ``redis.asyncio.Redis`` used as is,
      or one per event loop made from the URL by ``connect_async`` (an asyncio client
      belongs to the loop that first used it; a loop's client is forgotten with the
      loop), with the store's connection settings; ``_made`` hears of each new one;
    - the scripts (``_bound(name)``): wrapped once per client by ``script``;
    - the repeats (``_repeating``): a request safe to repeat is sent again while its reply
      is lost, at most ``retries`` times (``agent_saga._repeat``); ``_failures`` is what a
      failed request raises (``failures`` and ``ReplyLost``);
    - the error mapping: ``self._target.refusal`` (refused, or every reply lost);
    - ``close``: forgets every client and closes the running loop's.

    A hot path may send its first attempt itself and repeat through ``repeat_after``
    with ``self._retries``: the base adds nothing per call but the lookups a store made
    by hand (the running loop's client, the script's wrapper).
    """

    FEATURE: ClassVar[str] = "Redis"
    SCRIPTS: ClassVar[dict[str, str]] = {}
    #: Import ``redis`` when the store is made (False: on its first call, with the client).
    IMPORT_EARLY: ClassVar[bool] = True

    def _open(self, target: str | Any, *, socket_timeout: float, retries: int | None = None, client: Any = None,
              **connect_kw: Any) -> None:
        """Check ``retries`` (and import ``redis``, or ``ConfigurationError`` naming
        ``FEATURE``); ``target`` is a URL or a ready client, ``client`` an injected client
        used instead of the URL's; ``connect_kw`` go to ``connect_async``. No connection
        is made until the first call."""
        if self.IMPORT_EARLY:
            self._redis = import_redis(self.FEATURE)
            self._failures: tuple[type[BaseException], ...] = (*failures(self._redis), ReplyLost)
        self._retries = check_retries(retries)
        self._timeout = socket_timeout
        self._connect_kw = connect_kw
        self._target = Target.of(target)
        self.where = self._target.where
        self._url: str | None = target if isinstance(target, str) else None
        fixed = target if client is None and not isinstance(target, str) else client
        self._fixed: tuple[Any, dict[str, Any]] | None = None if fixed is None else (fixed, {})
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, tuple[Any, dict[str, Any]]] = (
            weakref.WeakKeyDictionary())

    def _held(self) -> tuple[Any, dict[str, Any]]:
        """``(client, its wrapped scripts)`` for the running event loop."""
        if self._fixed is not None:
            return self._fixed
        loop = asyncio.get_running_loop()
        held = self._clients.get(loop)
        if held is None:
            client = connect_async(self._url or "", feature=self.FEATURE, socket_timeout=self._timeout,
                                   **self._connect_kw)
            held = self._clients[loop] = (client, {})
            self._made(loop, client)
        return held

    def _made(self, loop: asyncio.AbstractEventLoop, client: Any) -> None:
        """A client was made for ``loop`` (a hook: nothing by default)."""

    def _client(self) -> Any:
        return self._held()[0]

    def _bound(self, name: str) -> tuple[Any, Any]:
        """``(client, the script SCRIPTS[name] wrapped for it)`` on the running loop."""
        client, scripts = self._held()
        run = scripts.get(name)
        if run is None:
            run = scripts[name] = script(client, self.SCRIPTS[name])
        return client, run

    async def _repeating(self, client: Any, send: Callable[[bool], Awaitable[T]]) -> T:
        """``await send(repeat)``, sent again while its reply is lost (safe requests only)."""
        return await repeating(send, retries=self._retries, client=client)

    async def close(self) -> None:
        """Close this store's connections made on the running loop (and forget the others)."""
        clients, self._clients = self._clients, weakref.WeakKeyDictionary()
        held = clients.get(asyncio.get_running_loop())
        if held is not None:
            await aclose(held[0])
