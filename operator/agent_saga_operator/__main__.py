"""``agent-saga-operator`` / ``python -m agent_saga_operator``: run the operator.

    agent-saga-operator --redis-url redis://redis:6379/0                 # in a cluster
    agent-saga-operator --kubeconfig ~/.kube/config --redis-url ... \\
        --namespace payments --standalone                                # on a laptop

Every flag has an environment variable (``AGENT_SAGA_REDIS_URL``, ``KUBECONFIG``,
``AGENT_SAGA_OPERATOR_NAMESPACES`` comma-separated, ...). Exit status: 0 after a clean
stop (SIGTERM / SIGINT), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["build_parser", "main", "parse_args"]

EPILOG = """examples:
  # in a cluster (the chart runs this): the service account's token, every namespace
  agent-saga-operator --redis-url redis://:PASSWORD@redis:6379/0

  # outside the cluster (a laptop, CI): your kubeconfig, one namespace, no peering
  agent-saga-operator --kubeconfig ~/.kube/config --redis-url redis://127.0.0.1:6379/0 \\
      --namespace payments --standalone

docs/install.md ("Running the operator outside the cluster") and docs/env.md."""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """Each flag's default after its help (never a URL's: it may carry a password from the
    environment); the examples kept as written."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        hidden = action.default is None or isinstance(action.default, bool) or action.dest == "redis_url"
        if hidden or action.default is argparse.SUPPRESS or "%(default)" in text:
            return text
        return f"{text} (default: %(default)s)"


def _env(name: str, default: str | None = None) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or default


def build_parser() -> argparse.ArgumentParser:
    """The operator's command line (``agent-saga-operator --help`` shows every default)."""
    p = argparse.ArgumentParser(
        prog="agent-saga-operator",
        description="Reconcile agent-saga custom resources (KillSwitch, BudgetLimit, SagaPolicy,\n"
        "Approval, ModelRoute) into the Redis policy plane. A flag's default comes from the\n"
        "environment variable named in its help, else it is the value shown.",
        epilog=EPILOG,
        formatter_class=_Formatter,
    )
    p.add_argument("--redis-url", default=_env("AGENT_SAGA_REDIS_URL"),
                   help="the policy plane: redis://host:6379/0 (env AGENT_SAGA_REDIS_URL)")
    p.add_argument("--kubeconfig", type=Path, default=_env("KUBECONFIG"),
                   help="kubeconfig file (default: in-cluster service account, else $KUBECONFIG)")
    ns_env = _env("AGENT_SAGA_OPERATOR_NAMESPACES")
    p.add_argument("--namespace", action="append", dest="namespaces",
                   default=ns_env.split(",") if ns_env else None,
                   help="watch only this namespace (repeatable; default: all namespaces)")
    p.add_argument("--key-prefix", default=_env("AGENT_SAGA_KEY_PREFIX", "agentsaga"),
                   help="policy-plane key prefix (use {agentsaga} on a Redis Cluster)")
    p.add_argument("--limit-store-namespace", default=_env("AGENT_SAGA_LIMIT_NAMESPACE", "agent-saga"),
                   help="RedisLimitStore namespace the agents use (to read window use back)")
    p.add_argument("--resync-interval", type=float, default=float(_env("AGENT_SAGA_RESYNC_INTERVAL", "60") or 60),
                   help="seconds between re-projections of every object (heals a Redis that lost data)")
    p.add_argument("--usage-interval", type=float, default=float(_env("AGENT_SAGA_USAGE_INTERVAL", "10") or 10),
                   help="seconds between BudgetLimit use read-backs into status")
    p.add_argument("--retry-delay", type=float, default=2.0, help="seconds before retrying a failed projection")
    p.add_argument("--health-host", default="0.0.0.0", help="address of /healthz and /metrics")
    p.add_argument("--health-port", type=int, default=8080, help="port of the liveness endpoint /healthz")
    p.add_argument("--metrics-port", type=int, default=9090, help="port of /metrics (0: off)")
    p.add_argument("--peering", default=_env("AGENT_SAGA_PEERING", "agent-saga"),
                   help="kopf peering name: replicas with the same name stand by for each other")
    p.add_argument("--standalone", action="store_true", help="run without peering (a single replica)")
    p.add_argument("--priority", type=int, default=0, help="peering priority (higher wins)")
    p.add_argument("--watch-timeout", type=int, default=270,
                   help="server-side watch timeout; the client gives up 30 s later and reconnects")
    p.add_argument("--approval-poll-interval", type=float,
                   default=float(_env("AGENT_SAGA_APPROVAL_POLL_INTERVAL", "2") or 2),
                   help="seconds between reads of pending approval requests (notifications act at once)")
    p.add_argument("--ack-interval", type=float, default=float(_env("AGENT_SAGA_ACK_INTERVAL", "1") or 1),
                   help="seconds between reads of agent heartbeats into status (notifications act at once)")
    p.add_argument("--approval-ttl-after-finished", type=float, metavar="SECONDS",
                   default=float(_env("AGENT_SAGA_APPROVAL_TTL_AFTER_FINISHED", "0") or 0),
                   help="delete an Approval this many seconds after it was approved, denied or expired, like a "
                   "Job's ttlSecondsAfterFinished; 0 keeps them (env AGENT_SAGA_APPROVAL_TTL_AFTER_FINISHED)")
    p.add_argument("--approval-signing-key", type=Path, default=_env("AGENT_SAGA_APPROVAL_SIGNING_KEY"),
                   help="Ed25519 private key (PEM) to sign approval decisions with; its public key is published "
                        "for agents (env AGENT_SAGA_APPROVAL_SIGNING_KEY)")
    p.add_argument("--approval-keys", type=Path, default=_env("AGENT_SAGA_APPROVAL_KEYS"),
                   help="more trusted approver public keys to publish: a PEM file or a directory of them, e.g. "
                        "the keys approvers sign CLI decisions with (env AGENT_SAGA_APPROVAL_KEYS)")
    p.add_argument("--approval-keys-configmap", default=_env("AGENT_SAGA_APPROVAL_KEYS_CONFIGMAP"),
                   metavar="NAMESPACE/NAME",
                   help="also write the published approver keys into this ConfigMap (data key "
                        "operator-published.pem), which agents mount as AGENT_SAGA_APPROVAL_KEYS: they then require "
                        "signatures even if the policy plane loses its data (env AGENT_SAGA_APPROVAL_KEYS_CONFIGMAP)")
    p.add_argument("--approver-admission", default=_env("AGENT_SAGA_APPROVER_ADMISSION"),
                   help="name of the ValidatingAdmissionPolicy (and binding) that makes spec.approver the "
                        "requesting user; when it is in force, decisions record the approver as authenticated")
    p.add_argument("--log-level", default=_env("AGENT_SAGA_LOG_LEVEL", "INFO"),
                   help="DEBUG, INFO, WARNING (env AGENT_SAGA_LOG_LEVEL)")
    p.add_argument("--access-log", action="store_true",
                   default=(_env("AGENT_SAGA_ACCESS_LOG", "") or "").lower() in ("1", "true", "yes"),
                   help="log every request to /healthz (the kubelet's probes; off by default: one line every "
                        "few seconds says nothing) (env AGENT_SAGA_ACCESS_LOG=1)")
    return p


#: Every line names the object it is about: kopf's ``[ns/name]`` prefix.
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def configure_logging(level: str, *, access_log: bool = False) -> None:
    """The operator's logging: kopf's per-object prefix (``[ns/name]``) on every line
    about an object, ``level`` for the rest, and no probe access log unless asked."""
    import kopf

    kopf.configure(log_format=LOG_FORMAT, log_prefix=True)  # type: ignore[arg-type]
    logging.getLogger().setLevel(level.upper())
    logging.getLogger("aiohttp.access").setLevel(logging.INFO if access_log else logging.WARNING)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The operator's command line, parsed and checked."""
    p = build_parser()
    args = p.parse_args(argv)
    if not args.redis_url:
        p.error("--redis-url (or AGENT_SAGA_REDIS_URL) is required: the policy plane is a Redis server")
    if min(args.resync_interval, args.usage_interval, args.approval_poll_interval, args.ack_interval) <= 0:
        p.error("--resync-interval, --usage-interval, --approval-poll-interval and --ack-interval must be positive")
    if args.approval_keys_configmap and args.approval_keys_configmap.count("/") != 1:
        p.error("--approval-keys-configmap must be NAMESPACE/NAME (the ConfigMap agents mount as "
                "AGENT_SAGA_APPROVAL_KEYS)")
    if args.approval_ttl_after_finished < 0:
        p.error("--approval-ttl-after-finished must be 0 (keep finished Approvals) or a positive number of seconds")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the operator until it is stopped; the exit status."""
    args = parse_args(argv)
    configure_logging(args.log_level, access_log=args.access_log)

    import kopf

    from . import metrics
    from .config import OperatorConfig
    from .handlers import build_registry

    config = OperatorConfig(
        redis_url=args.redis_url,
        kubeconfig=args.kubeconfig,
        namespaces=tuple(n.strip() for n in args.namespaces or () if n.strip()),
        key_prefix=args.key_prefix,
        limit_store_namespace=args.limit_store_namespace,
        resync_interval=args.resync_interval,
        usage_interval=args.usage_interval,
        retry_delay=args.retry_delay,
        health_host=args.health_host,
        health_port=args.health_port,
        metrics_port=args.metrics_port,
        peering_name=args.peering,
        standalone=args.standalone,
        priority=args.priority,
        watch_server_timeout=args.watch_timeout,
        watch_client_timeout=args.watch_timeout + 30,
        approval_poll_interval=args.approval_poll_interval,
        ack_interval=args.ack_interval,
        approval_ttl_after_finished=args.approval_ttl_after_finished,
        approval_signing_key=args.approval_signing_key,
        approval_keys=args.approval_keys,
        approver_admission=args.approver_admission or None,
        approval_keys_configmap=args.approval_keys_configmap or None,
    )
    metrics.serve(config.metrics_port, config.health_host)
    kopf.run(
        registry=build_registry(config),
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        standalone=config.standalone or None,
        priority=config.priority,
        liveness_endpoint=f"http://{config.health_host}:{config.health_port}/healthz",
        memo=kopf.Memo(),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
