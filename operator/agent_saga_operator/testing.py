"""Helpers for testing against a real API server: install the CRDs, run the operator.

Shipped as public API (as temporalio ships ``testing``) so the e2e suite, ``make
dev-cluster`` users and downstream projects drive the operator the same way:

    install_crds(kubectl)                       # apply crds/, wait until Established + served
    with OperatorProcess(kubeconfig, redis_url, namespaces=[ns]) as op:
        op.wait_ready()                         # liveness endpoint answers
        ...
    # the process group is gone here, whatever happened

Invariants: ``OperatorProcess`` runs the operator in its own process group, dies with
the parent (PR_SET_PDEATHSIG), and ``stop()`` reaps it; waits poll with a deadline.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from .crdgen import CRD_DIR
from .models import GROUP, KINDS, VERSION

__all__ = ["OperatorProcess", "free_port", "install_crds", "poll"]

T = TypeVar("T")
PACKAGE_ROOT = Path(__file__).resolve().parents[1]


def poll(fn: Callable[[], T | None], *, timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``fn`` until it returns something truthy, and return that; raise after ``timeout``.

    The AssertionError names ``what`` and the last value or exception seen.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = fn()
        except Exception as exc:  # noqa: BLE001 - remembered for the failure message
            value, last = None, exc
        else:
            last = value
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"{what}: not within {timeout:.1f}s (last: {last!r})")
        time.sleep(interval)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def install_crds(
    kubectl: Callable[..., subprocess.CompletedProcess[str]],
    api_client: Any,
    *,
    crd_dir: Path = CRD_DIR,
    timeout: float = 60,
) -> None:
    """``kubectl apply`` every CRD in ``crd_dir``; wait until each kind is Established and
    its REST endpoint answers (discovery can lag a moment behind Established)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(crd_dir))
    names = [m.info.crd_name for m in KINDS]
    kubectl("wait", "--for=condition=Established", *(f"crd/{n}" for n in names), f"--timeout={int(timeout)}s")
    api = client.CustomObjectsApi(api_client)
    for m in KINDS:
        def served(plural: str = m.info.plural) -> bool:
            try:
                api.list_cluster_custom_object(GROUP, VERSION, plural, limit=1)
                return True
            except ApiException as e:
                if e.status != 404:
                    raise
                return False

        poll(served, timeout=timeout, what=f"{m.info.plural}.{GROUP} served")

    # kopf finds its resources through API discovery at start, and scans again only when a
    # CRD changes: an operator started while discovery still lags behind a CRD applied a
    # moment ago does not watch that kind until the CRD changes again.
    def discovered() -> bool:
        raw = kubectl("get", "--raw", f"/apis/{GROUP}/{VERSION}").stdout
        listed = {r.get("name") for r in json.loads(raw).get("resources", [])}
        return all(m.info.plural in listed for m in KINDS)

    poll(discovered, timeout=timeout, what=f"{GROUP}/{VERSION} in API discovery")


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG


class OperatorProcess:
    """``python -m agent_saga_operator`` as a child process, logging to ``log_path``.

    ``namespaces`` restricts it to those namespaces (default: cluster-wide);
    ``extra_args`` are passed through (``--resync-interval 2``).
    """

    def __init__(
        self,
        kubeconfig: Path | str,
        redis_url: str,
        log_path: Path,
        *,
        namespaces: Sequence[str] = (),
        extra_args: Sequence[str] = (),
        env: dict[str, str] | None = None,
    ) -> None:
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.log_path = log_path
        self.argv = [
            sys.executable, "-m", "agent_saga_operator",
            "--kubeconfig", str(kubeconfig),
            "--redis-url", redis_url,
            "--health-port", str(self.health_port),
            "--metrics-port", str(self.metrics_port),
            *(a for ns in namespaces for a in ("--namespace", ns)),
            *extra_args,
        ]
        base = dict(os.environ if env is None else env)
        base["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), base.get("PYTHONPATH", "")) if p)
        self.env = base
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> OperatorProcess:
        """Start the operator process; returns ``self`` once it runs."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env, start_new_session=True,
                preexec_fn=_die_with_parent if threading.current_thread() is threading.main_thread() else None,
            )
        return self

    @property
    def pid(self) -> int:
        """The operator process's id."""
        assert self.proc is not None, "not started"
        return self.proc.pid

    def log(self, lines: int = 60) -> str:
        """The last ``lines`` lines of the operator's log (for a failing test's message)."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def _get(self, port: int, path: str) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
                return str(r.read().decode())
        except (urllib.error.URLError, OSError):
            return None

    def wait_ready(self, timeout: float = 30) -> None:
        """Wait until the liveness endpoint answers (the operator is watching)."""
        def ready() -> bool:
            if self.proc is not None and self.proc.poll() is not None:
                raise AssertionError(f"operator exited with {self.proc.returncode}:\n{self.log()}")
            return self._get(self.health_port, "/healthz") is not None

        try:
            poll(ready, timeout=timeout, what="operator liveness endpoint", interval=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}\n--- operator log ---\n{self.log()}") from None

    def metrics(self) -> str:
        """The /metrics text (empty if it does not answer)."""
        return self._get(self.metrics_port, "/metrics") or ""

    @contextlib.contextmanager
    def running(self) -> Iterator[OperatorProcess]:
        """Start it, wait until it watches, and stop it on leaving (a fixture's body)."""
        self.start()
        try:
            self.wait_ready()
            yield self
        finally:
            self.stop()

    def stop(self, timeout: float = 10, sig: int = signal.SIGTERM) -> int | None:
        """Signal the process group, SIGKILL it after ``timeout``, reap it; the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        self.stop(timeout=0, sig=signal.SIGKILL)

    def __enter__(self) -> OperatorProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
