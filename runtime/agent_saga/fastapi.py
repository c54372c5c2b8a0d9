"""FastAPI (any ASGI app): ``saga_lifespan`` and ``@saga``.

    from fastapi import FastAPI
    from agent_saga import saga_lifespan, saga

    app = FastAPI(lifespan=saga_lifespan("path/to/wal.jsonl", imports=["myapp.handlers"]))

    @app.post("/checkout")
    async def checkout():
        @saga
        async def process_payment(saga):
            return await saga.execute("stripe.charge", "COMPENSABLE", ...)
        return await process_payment()

Startup opens the log (a path, ``file://``, ``redis://`` or ``postgresql://``: see
``agent_saga.wal.open_wal``), makes it the process-wide default WAL (so ``saga_scope()``
and ``@saga`` in routes use it) and starts a ``RecoveryDaemon`` on it as a background task:
sagas a previous run of the app left open are rolled back once their lease expires.

Shutdown, in order: the daemon is drained (the saga it is resolving is finished, no new one
is taken) and closed, releasing its claims; the lifespan waits (``drain_timeout``) for every
saga still open on the log to leave its scope, including a rollback in progress; a ``@saga``
still running then is cancelled, so it rolls back (shielded), and its rollback is waited for
(``rollback_timeout``); the WAL is flushed and closed (its file lock released) and the
previous default WAL restored. A saga's lease ends with its scope, so none is held after.

SIGTERM mid-saga (uvicorn's graceful shutdown). uvicorn stops accepting connections and
waits for the requests in flight before it runs the lifespan shutdown:
- by default it waits for them: the request finishes, its saga completes (or rolls back on
  its own error) and the response is sent;
- with ``--timeout-graceful-shutdown N`` it cancels the requests still running after N
  seconds: the cancellation leaves the saga's scope, so the saga rolls back LIFO, shielded
  from the cancellation; the lifespan waits for that rollback before closing the log. The
  log ends with SAGA_ROLLED_BACK (the interrupted step is STEP_UNKNOWN and compensated
  from ``compensate(None)``, or escalated); the client gets no response;
- if the process dies first (SIGKILL, a second Ctrl-C, a drain longer than the pod's
  grace period), the saga stays open in the log and the recovery daemon (this app's next
  start, or ``agent-saga-recoveryd``) rolls it back once its lease expires.

Invariants:
- Standard library only: the lifespan is the ASGI lifespan protocol (an async context
  manager factory); importing this module never imports FastAPI.
- A daemon that crashes does not take the app down and is never hidden: it is logged at
  CRITICAL with its traceback, ``SagaRuntime.recovery_error`` holds it and ``healthy()`` is
  False (a health route can return ``request.state.agent_saga.status()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextvars import ContextVar
from typing import Any, TypeVar

from .engine import Saga
from .errors import ConfigurationError
from .gates import Gate
from .leases import open_sagas
from .recovery import RecoveryDaemon
from .scope import saga_scope
from .wal import BaseWAL, open_wal, set_default_wal
from .wal.urls import redact

__all__ = ["SagaRuntime", "current_saga", "saga", "saga_lifespan"]

log = logging.getLogger("agent_saga.fastapi")

T = TypeVar("T")

_POLL = 0.01  # seconds between looks at the sagas still open during shutdown
_current: ContextVar[Saga | None] = ContextVar("agent_saga_current_saga", default=None)
_runtime: SagaRuntime | None = None


def current_saga() -> Saga | None:
    """The saga of the innermost ``@saga`` call running in this context, or ``None``."""
    return _current.get()


class SagaRuntime:
    """What ``saga_lifespan`` runs: the WAL, the daemon and the sagas in flight.

    Available to routes as ``request.state.agent_saga``.
    """

    def __init__(
        self, wal: BaseWAL, daemon: RecoveryDaemon | None, drain_timeout: float, rollback_timeout: float
    ) -> None:
        self.wal = wal
        self.daemon = daemon
        self.drain_timeout = drain_timeout
        self.rollback_timeout = rollback_timeout
        self.recovery_error: BaseException | None = None
        self.closing = False
        self._task: asyncio.Task[None] | None = None
        self._calls: set[asyncio.Task[Any]] = set()

    def healthy(self) -> bool:
        """False once the recovery daemon crashed or halted (fail-closed), or while closing."""
        if self.closing or self.recovery_error is not None:
            return False
        return self.daemon is None or self.daemon.halted is None

    def status(self) -> dict[str, Any]:
        """JSON for a health route: healthy, the open sagas, the daemon's state."""
        daemon: dict[str, Any] | None = None
        if self.daemon is not None:
            daemon = {
                "running": self._task is not None and not self._task.done(),
                "halted": self.daemon.halted.message if self.daemon.halted is not None else None,
                "crashed": f"{type(self.recovery_error).__name__}: {self.recovery_error}"
                if self.recovery_error is not None else None,
            }
        return {"healthy": self.healthy(), "open_sagas": open_sagas(self.wal), "recovery": daemon}

    # ---------------------------------------------------------------- lifecycle

    def _start(self, interval: float) -> None:
        if self.daemon is not None:
            self._task = asyncio.ensure_future(self.daemon.run(interval=interval))
            self._task.add_done_callback(self._daemon_done)

    def _daemon_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:
            self.recovery_error = exc
            log.critical("the recovery daemon of %s crashed; sagas left open by a crash are NOT being "
                         "recovered until the app restarts: %s: %s", self.wal, type(exc).__name__, exc,
                         exc_info=exc)

    async def _stop(self) -> None:
        self.closing = True
        await self._stop_daemon()
        left = await self._wait_open(self.drain_timeout)
        if left:
            calls = [t for t in self._calls if not t.done()]
            if calls:
                log.warning("shutdown: cancelling %d @saga call(s) still running after %ss; their sagas "
                            "roll back: %s", len(calls), self.drain_timeout, ", ".join(left))
                for t in calls:
                    t.cancel()
                left = await self._wait_open(self.rollback_timeout)
        if left:
            log.error("shutdown: %d saga(s) still open are left to the recovery daemon, which rolls them back "
                      "once their lease expires: %s", len(left), ", ".join(left))
        await asyncio.to_thread(self.wal.close)

    async def _stop_daemon(self) -> None:
        if self.daemon is None:
            return
        self.daemon.drain()
        if self._task is not None and not self._task.done():
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.drain_timeout)
            except TimeoutError:
                log.warning("shutdown: the recovery daemon did not drain within %ss: cancelled",
                            self.drain_timeout)
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await self._task
            except Exception:  # noqa: BLE001 - already logged by _daemon_done
                pass
        try:
            await self.daemon.close()
        except Exception as exc:  # noqa: BLE001 - shutdown goes on; the claims expire by themselves
            log.warning("shutdown: the recovery daemon did not close cleanly: %s: %s", type(exc).__name__, exc)

    async def _wait_open(self, timeout: float) -> list[str]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = open_sagas(self.wal)
            if not left or loop.time() >= deadline:
                return left
            await asyncio.sleep(_POLL)


def saga_lifespan(
    wal_path_or_url: str | os.PathLike[str] | BaseWAL,
    recovery: bool | Callable[[BaseWAL], RecoveryDaemon] = True,
    *,
    imports: Iterable[str] = (),
    interval: float = 5.0,
    drain_timeout: float = 30.0,
    rollback_timeout: float = 60.0,
) -> Callable[[Any], contextlib.AbstractAsyncContextManager[dict[str, Any]]]:
    """An ASGI lifespan (``FastAPI(lifespan=...)``) running sagas on one WAL (module doc).

    Args:
        wal_path_or_url: a FileWAL path, a ``file://``, ``redis://`` or ``postgresql://``
            URL, or an open ``BaseWAL``; it becomes the process-wide default WAL, and the
            lifespan closes it at shutdown (an open one you pass in too).
        recovery: run a ``RecoveryDaemon(wal, imports=imports)`` on the log in the
            background (``True``), none (``False``), or the one a function of the opened WAL
            returns (``lambda wal: RecoveryDaemon(wal, ledger=..., lock=...)``: a shared
            ``redis://`` or ``postgresql://`` log needs a shared ledger and claim lock).
        imports: modules declaring the ``@compensator`` handlers the daemon may need.
        interval: seconds between the daemon's sweeps.
        drain_timeout: seconds shutdown waits for the daemon to drain, then for the open
            sagas to leave their scopes, before it cancels the ``@saga`` calls still running.
        rollback_timeout: seconds shutdown then waits for the rollbacks of those calls
            (a compensation cut off by closing the log would be left to recovery).

    Raises ``ConfigurationError`` now for bad arguments, and at startup for a log that
    cannot be opened (named, without its password) or an ``imports`` module that fails.
    """
    if not isinstance(wal_path_or_url, str | os.PathLike | BaseWAL) or wal_path_or_url == "":
        raise ConfigurationError(
            f"saga_lifespan(wal_path_or_url=...) must be a FileWAL path, a file://, redis:// or "
            f"postgresql:// URL, or a BaseWAL; got {wal_path_or_url!r}"
        )
    if not isinstance(recovery, bool) and not callable(recovery):
        raise ConfigurationError(
            f"saga_lifespan(recovery=...) must be True, False or a function of the WAL returning a "
            f"RecoveryDaemon, got {recovery!r}"
        )
    for name, value in (("interval", interval), ("drain_timeout", drain_timeout),
                        ("rollback_timeout", rollback_timeout)):
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ConfigurationError(f"saga_lifespan({name}=...) must be a positive number of seconds, got {value!r}")
    if isinstance(imports, str):
        raise ConfigurationError(f"saga_lifespan(imports=...) must be a list of module names, not the string {imports!r}")
    modules = tuple(imports)

    @contextlib.asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[dict[str, Any]]:
        global _runtime
        wal = _open(wal_path_or_url)
        try:
            daemon = _daemon(wal, recovery, modules)
        except BaseException:
            wal.close()
            raise
        runtime = SagaRuntime(wal, daemon, float(drain_timeout), float(rollback_timeout))
        previous = set_default_wal(wal)
        outer, _runtime = _runtime, runtime
        runtime._start(float(interval))
        log.info("agent-saga: sagas write to %s; recovery daemon %s", wal, "on" if daemon else "off")
        try:
            yield {"agent_saga": runtime}
        finally:
            try:
                await runtime._stop()
            finally:
                set_default_wal(previous)
                _runtime = outer
                log.info("agent-saga: shut down; %s flushed and closed", wal)

    return lifespan


def _daemon(
    wal: BaseWAL, recovery: bool | Callable[[BaseWAL], RecoveryDaemon], modules: tuple[str, ...]
) -> RecoveryDaemon | None:
    if recovery is False:
        return None
    if recovery is True:
        return RecoveryDaemon(wal, imports=modules)
    daemon = recovery(wal)
    if not isinstance(daemon, RecoveryDaemon):
        raise ConfigurationError(f"saga_lifespan(recovery=...) returned {daemon!r}, not a RecoveryDaemon")
    return daemon


def _open(target: str | os.PathLike[str] | BaseWAL) -> BaseWAL:
    if isinstance(target, BaseWAL):
        return target
    text = os.fspath(target)
    try:
        return open_wal(text)
    except ConfigurationError as exc:
        raise ConfigurationError(f"saga_lifespan: wal_path_or_url {redact(text)!r} cannot be used: {exc.message}") from None
    except OSError as exc:
        parent = os.path.dirname(text)
        if isinstance(exc, FileNotFoundError) and parent and not os.path.isdir(parent):
            raise ConfigurationError(
                f"saga_lifespan: the WAL {redact(text)!r} cannot be opened: its directory {parent!r} does not exist. "
                f"Create it (mkdir -p {parent}), or give a path on a writable volume or a reachable "
                f"redis:// / postgresql:// URL"
            ) from None
        raise ConfigurationError(
            f"saga_lifespan: the WAL {redact(text)!r} cannot be opened ({exc.strerror or exc}): give a path on "
            f"a writable volume or a reachable redis:// / postgresql:// URL"
        ) from None


def saga(
    fn: Callable[..., Awaitable[T]] | None = None,
    *,
    name: str | None = None,
    gate: Gate | None = None,
    tags: Iterable[str] = (),
    lease_seconds: float | None = None,
) -> Any:
    """Run an async function as one saga: ``@saga`` or ``@saga(name=..., gate=...)``.

    Each call opens a ``saga_scope`` on the default WAL (the one ``saga_lifespan``
    opened); the function gets the ``Saga`` as ``saga=`` if it has a parameter of that name
    (hidden from FastAPI's signature), and ``current_saga()`` returns it either way. Leaving
    the function with an exception rolls back every step it ran (``saga_scope``).
    """

    def wrap(f: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
        if not inspect.iscoroutinefunction(f):
            raise ConfigurationError(
                f"@saga needs an async def function, got {f!r} (options are keywords: @saga(name=...))"
            )
        sig = inspect.signature(f)
        inject = "saga" in sig.parameters
        label = name or f.__name__.strip("_") or "saga"

        @functools.wraps(f)
        async def run(*args: Any, **kwargs: Any) -> T:
            runtime = _runtime
            if runtime is not None and runtime.closing:
                raise ConfigurationError(
                    f"@saga {label}: the app is shutting down and starts no new saga (retry on another replica)"
                )
            task = asyncio.current_task()
            if runtime is not None and task is not None:
                runtime._calls.add(task)
            try:
                async with saga_scope(None, gate, label, tags=tags, lease_seconds=lease_seconds) as s:
                    token = _current.set(s)
                    try:
                        if inject:
                            kwargs["saga"] = s
                        result = await f(*args, **kwargs)
                    finally:
                        _current.reset(token)
                return result
            finally:
                if runtime is not None and task is not None:
                    runtime._calls.discard(task)

        if inject:  # FastAPI reads the signature: `saga` is ours, not a query parameter
            run.__signature__ = sig.replace(  # type: ignore[attr-defined]
                parameters=[p for p in sig.parameters.values() if p.name != "saga"])
        return run

    if fn is not None:
        return wrap(fn)
    return wrap
