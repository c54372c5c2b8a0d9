"""Command-line configuration of agent-saga-recoveryd (every flag also reads an env var).

    --wal-path P          (repeatable)  FileWAL files to recover (a shared volume)
    --wal-url URL         (repeatable)  fleet logs: redis://...?key=K, postgresql://...?table=T
    --imports MOD[,MOD]   (repeatable)  modules declaring @compensator / @reconciler
    --redis-url URL       claims + ledger shared by every replica (required for N > 1)
    --claims DIR          without --redis-url: where file logs' claims live (default: beside each log)
    --ledger FILE         without --redis-url: the recovery journal (default: beside each log)
    --wal-key-file FILE   the key of encrypted logs (else AGENT_SAGA_WAL_KEY_FILE, AGENT_SAGA_WAL_KEY)
    --allow RULE          (repeatable)  'WRITERS HANDLERS [CREDENTIAL_REFS]': which compensations
                          recovery may run for which writer (else AGENT_SAGA_RECOVERYD_ALLOW,
                          rules separated by ';'); none: no credential_ref is ever used
    --metrics-port N      /metrics, /livez, /readyz (0: any free port; -1: none)
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from dataclasses import dataclass

from agent_saga.errors import ConfigurationError
from agent_saga.recovery import Grants


@dataclass(frozen=True, slots=True)
class Config:
    """What one recoveryd process does (see the module doc)."""

    wal_paths: tuple[str, ...]
    wal_urls: tuple[str, ...]
    imports: tuple[str, ...]
    redis_url: str | None
    claims: str | None
    ledger: str | None
    wal_key_file: str | None
    namespace: str
    metrics_port: int
    bind: str
    port_file: str | None
    interval: float
    claim_ttl: float
    lease_grace: float
    concurrency: int
    in_hand: int
    compensation_timeout: float | None
    daemon_id: str | None
    once: bool
    log_level: str
    log_json: bool
    allow: tuple[str, ...] | None = None


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"AGENT_SAGA_RECOVERYD_{name}", default)


def _split(values: Sequence[str]) -> tuple[str, ...]:
    out: list[str] = []
    for v in values:
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return tuple(out)


def build_parser() -> argparse.ArgumentParser:
    """The command line of ``agent-saga-recoveryd``."""
    p = argparse.ArgumentParser(
        prog="agent-saga-recoveryd",
        description="The agent-saga recovery fleet: resolve sagas whose owner died, exactly once.",
    )
    p.add_argument("--wal-path", action="append", default=[], help="a FileWAL log to recover (repeatable)")
    p.add_argument(
        "--wal-url", action="append", default=[],
        help="a fleet log, redis://[:PW@]HOST:PORT/DB?key=KEY or postgresql://...?table=T (repeatable)",
    )
    p.add_argument(
        "--imports", "--import", action="append", default=[], metavar="MODULE[,MODULE]",
        help="modules declaring the agents' @compensator handlers and @reconciler functions",
    )
    p.add_argument("--redis-url", default=_env("REDIS_URL"), help="Redis for claims and the ledger (a fleet)")
    p.add_argument("--namespace", default=_env("NAMESPACE", "agent-saga"), help="Redis key namespace")
    p.add_argument(
        "--claims", default=_env("CLAIMS"), metavar="DIR",
        help="without --redis-url: the directory for the claims of every --wal-path log "
        "(default: <wal-path>.recovery-claims beside each log; must be writable)",
    )
    p.add_argument(
        "--ledger", default=_env("LEDGER"), metavar="FILE",
        help="without --redis-url: the recovery journal and escalation queue of every --wal-path "
        "log (default: <wal-path>.recovery.jsonl beside each log; must be writable)",
    )
    p.add_argument(
        "--wal-key-file", metavar="FILE",
        help="a file holding the logs' encryption key(s) (default: $AGENT_SAGA_WAL_KEY_FILE, "
        "else the key itself in $AGENT_SAGA_WAL_KEY)",
    )
    p.add_argument("--metrics-port", type=int, default=int(_env("METRICS_PORT", "9102") or 9102),
                   help="port of /metrics, /livez, /readyz (0: any free port, -1: none; default 9102)")
    p.add_argument("--bind", default=_env("BIND", "0.0.0.0"), help="address to serve on (default 0.0.0.0)")
    p.add_argument("--port-file", help="write the port actually served on to this file")
    p.add_argument("--interval", type=float, default=float(_env("INTERVAL", "5") or 5),
                   help="seconds between sweeps (default 5)")
    p.add_argument("--claim-ttl", type=float, default=30.0, help="seconds a claim lives unrenewed (default 30)")
    p.add_argument("--lease-grace", type=float, default=5.0,
                   help="seconds added to every saga lease for clock skew (default 5)")
    p.add_argument("--concurrency", type=int, default=8,
                   help="compensations run at once per log (default 8)")
    p.add_argument("--in-hand", type=int, default=None,
                   help="sagas held at once per log, of which --concurrency compensate at a time "
                        "(default: --concurrency). More than --concurrency shares each request to the "
                        "log, the claims and the ledger among more sagas; a drain finishes every saga in hand")
    p.add_argument("--compensation-timeout", type=float, default=300.0,
                   help="seconds a handler may take before the step is escalated (0: no bound)")
    p.add_argument(
        "--allow", action="append", default=None, metavar="'WRITERS HANDLERS [REFS]'",
        help="which compensations recovery may run for which writer: writer globs (an agent identity "
        "namespace/pod), handler globs, credential_ref globs, each comma-separated (repeatable; else "
        "$AGENT_SAGA_RECOVERYD_ALLOW, rules separated by ';'). Without any: every registered handler, "
        "never with a credential_ref (docs/recovery.md)",
    )
    p.add_argument("--daemon-id", default=_env("DAEMON_ID"), help="this replica's name in the records it writes")
    p.add_argument("--once", action="store_true", help="one sweep of every log, then exit (1 if a human is needed)")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"), help="INFO (default), DEBUG, WARNING ...")
    p.add_argument("--log-json", action="store_true", help="JSON log lines")
    return p


def parse_args(argv: Sequence[str] | None = None) -> Config:
    """Parse ``argv``; exits with a usage message (code 2) when it cannot work."""
    parser = build_parser()
    a = parser.parse_args(argv)
    wal_paths = tuple(a.wal_path) or _split([_env("WAL_PATH") or ""])
    wal_urls = tuple(a.wal_url) or _split([_env("WAL_URL") or ""])
    imports = _split(a.imports) or _split([_env("IMPORTS") or ""])
    if not wal_paths and not wal_urls:
        parser.error("name at least one log: --wal-path P or --wal-url URL")
    if wal_urls and not a.redis_url:
        parser.error("a fleet log (--wal-url) needs --redis-url: replicas must share claims and the ledger")
    if a.redis_url and (a.claims or a.ledger):
        parser.error("--claims and --ledger are for file claims and journal; with --redis-url both live in Redis")
    if a.concurrency < 1 or a.interval <= 0 or a.claim_ttl <= 0:
        parser.error("--concurrency >= 1, --interval > 0 and --claim-ttl > 0 are required")
    if a.in_hand is not None and a.in_hand < a.concurrency:
        parser.error(f"--in-hand must be >= --concurrency ({a.concurrency}), got {a.in_hand}")
    allow = allow_rules(a.allow, _env("ALLOW"))
    try:
        Grants.parse(allow)
    except ConfigurationError as exc:
        parser.error(str(exc))
    return Config(
        wal_paths=wal_paths, wal_urls=wal_urls, imports=imports, redis_url=a.redis_url,
        claims=a.claims, ledger=a.ledger, wal_key_file=a.wal_key_file,
        namespace=a.namespace, metrics_port=a.metrics_port, bind=a.bind, port_file=a.port_file,
        interval=a.interval, claim_ttl=a.claim_ttl, lease_grace=a.lease_grace,
        concurrency=a.concurrency, in_hand=a.in_hand if a.in_hand is not None else a.concurrency,
        compensation_timeout=a.compensation_timeout if a.compensation_timeout > 0 else None,
        daemon_id=a.daemon_id, once=a.once, log_level=a.log_level, log_json=a.log_json, allow=allow,
    )


def allow_rules(flags: Sequence[str] | None, env: str | None) -> tuple[str, ...] | None:
    """The allow-list's rules: the ``--allow`` flags, else the variable's rules separated
    by ';' or newlines, else None (no allow-list: the default rule)."""
    if flags:
        return tuple(flags)
    if env and env.strip():
        return tuple(r.strip() for r in env.replace("\n", ";").split(";") if r.strip())
    return None
