"""Unit tests: no servers. The folders mirror the packages under test:

    engine/    the saga engine (steps, rollback, retry, timeouts, executor, credentials, speculation)
    kit/       AgentKit
    controls/  one folder per control: approvals/ breaker/ gate/ killswitch/ limits/
    wal/       the WAL interface and FileWAL          chain/   the hash chain
    audit/     verify, export, certify, redact, Merkle, encryption, checkpoints
    recovery/  the recovery daemon, ledger, leases, plans, fault points
    cli/       the ``agent-saga`` commands             k8s/     operator models, CRDs, chart
    routing/   the Router over protocol-level chat-completions servers
    contextbroker/  the ContextBroker (receipts, drift, serving records)
    mesh/      offline mesh sagas: the G-Set merge (hypothesis), device logs, ``agent-saga mesh``
    isolation/  tentative resources, semantic locks, snapshots (a SIGKILLed owner included)
    integrations/  saga_lifespan in process, OpenTelemetry (real SDK), Prometheus (real registry)
    (here)     the whole runtime: public API, error tree, layers, backends, examples

``engine_support.py`` and ``recovery_support.py`` (handlers and log builders shared by
several folders) live here; this directory is on ``sys.path`` for every unit test.
Waiting for a condition goes through ``fixtures.polling.until`` (never a sleep).
"""
