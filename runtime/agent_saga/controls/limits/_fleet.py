"""Does this process look like one of many? The in-process limit store's warning.

A local budget fails open across a fleet: ten pods with the in-process store each grant
the full allowance, so the effective cap is 10x, silently. There is no way for a process
to know for certain that it has siblings, so this module looks for the usual signs and
the gate logs one WARNING (logger ``agent_saga.controls``) at start-up when it sees any.

Signs (each named in the warning):
- ``KUBERNETES_SERVICE_HOST`` is set (a pod: Deployments and StatefulSets have replicas);
- a replica/pod/task identity in the environment: ``POD_NAME``, ``HOSTNAME`` shaped like a
  Deployment pod (``name-5d8c7b9f4-x2k8q``) or StatefulSet pod (``name-3``), ``DYNO``,
  ``ECS_CONTAINER_METADATA_URI(_V4)``, ``K_SERVICE`` (Cloud Run), ``FLY_ALLOC_ID``,
  ``NOMAD_ALLOC_ID``, ``REPLICA_ID``;
- more than one web worker: ``WEB_CONCURRENCY`` > 1, ``--workers N`` > 1 in
  ``GUNICORN_CMD_ARGS``, ``UVICORN_WORKERS`` > 1;
- this process was started by ``multiprocessing`` (it has a parent pool or server).

``AGENT_SAGA_SINGLE_PROCESS=1`` says "I know, there is only one": no warning. It is a
log record, not a ``warnings.warn``, so it never breaks a test suite that treats warnings
as errors, and it appears once per process.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import re
import threading
from collections.abc import Mapping

__all__ = ["fleet_signs", "warn_if_fleet"]

log = logging.getLogger("agent_saga.controls")

ENV_SINGLE_PROCESS = "AGENT_SAGA_SINGLE_PROCESS"

_DEPLOYMENT_POD = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?-[bcdfghjklmnpqrstvwxz2456789]{6,10}-[bcdfghjklmnpqrstvwxz2456789]{5}$")
_STATEFUL_POD = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?-\d+$")
_IDENTITY_VARS = (
    "POD_NAME",
    "DYNO",
    "ECS_CONTAINER_METADATA_URI",
    "ECS_CONTAINER_METADATA_URI_V4",
    "K_SERVICE",
    "FLY_ALLOC_ID",
    "NOMAD_ALLOC_ID",
    "REPLICA_ID",
)
_GUNICORN_WORKERS = re.compile(r"(?:^|\s)(?:-w|--workers)[=\s]+(\d+)")

_lock = threading.Lock()
_warned = False


def _int(value: str | None) -> int:
    try:
        return int(value or "")
    except ValueError:
        return 0


def fleet_signs(env: Mapping[str, str] | None = None, *, spawned: bool | None = None) -> list[str]:
    """The reasons to believe this process is one of many (empty: none found)."""
    env = os.environ if env is None else env
    signs: list[str] = []
    if env.get("KUBERNETES_SERVICE_HOST"):
        signs.append("KUBERNETES_SERVICE_HOST is set (running in a Kubernetes pod)")
    for var in _IDENTITY_VARS:
        if env.get(var):
            signs.append(f"{var} is set (a replica identity)")
    host = env.get("HOSTNAME", "")
    if host and (_DEPLOYMENT_POD.match(host) or (_STATEFUL_POD.match(host) and "KUBERNETES_SERVICE_HOST" in env)):
        signs.append(f"HOSTNAME {host!r} looks like a replicated pod")
    if _int(env.get("WEB_CONCURRENCY")) > 1:
        signs.append(f"WEB_CONCURRENCY={env['WEB_CONCURRENCY']} (several web workers)")
    if _int(env.get("UVICORN_WORKERS")) > 1:
        signs.append(f"UVICORN_WORKERS={env['UVICORN_WORKERS']} (several web workers)")
    m = _GUNICORN_WORKERS.search(env.get("GUNICORN_CMD_ARGS", ""))
    if m and int(m.group(1)) > 1:
        signs.append(f"GUNICORN_CMD_ARGS asks for {m.group(1)} workers")
    if spawned is None:
        spawned = multiprocessing.parent_process() is not None
    if spawned:
        signs.append("this process was started by multiprocessing (a worker among others)")
    return signs


def warn_if_fleet(store: str, env: Mapping[str, str] | None = None) -> bool:
    """Log the one-per-process WARNING if limits use ``store`` in a process that looks
    like one of many. Returns True if it logged now."""
    global _warned
    env = os.environ if env is None else env
    if env.get(ENV_SINGLE_PROCESS, "").strip().lower() in ("1", "true", "yes"):
        return False
    signs = fleet_signs(env)
    if not signs:
        return False
    with _lock:
        if _warned:
            return False
        _warned = True
    log.warning(
        "limits are kept by %s, which is local to this process, but this process looks like "
        "one of many (%s): each process grants the full allowance, so the effective cap is "
        "N times the configured one. Call set_limit_store(RedisLimitStore(url)) or set "
        "AGENT_SAGA_LIMIT_STORE=redis://... for a fleet-wide, crash-durable budget "
        "(set %s=1 if this really is the only process).",
        store,
        "; ".join(signs),
        ENV_SINGLE_PROCESS,
    )
    return True


def _reset_for_tests() -> None:
    global _warned
    with _lock:
        _warned = False
