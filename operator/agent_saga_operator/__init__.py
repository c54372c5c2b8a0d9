"""agent-saga-operator: the five CRDs reconciled into the policy plane (Redis).

    python -m agent_saga_operator --redis-url redis://... [--kubeconfig FILE]

Modules: ``models`` (the kinds, source of the CRDs), ``crdgen`` (CRD YAML), ``documents``
(policy-plane documents built from a spec), ``projection`` (writing them to Redis),
``conditions`` (status conditions), ``handlers`` (kopf), ``metrics``, ``testing``.
The import name is ``agent_saga_operator`` (a top-level ``operator`` would shadow the
standard library).
"""

__version__ = "0.1.0"
