"""The examples under examples/k8s, as a test applies them in its own namespace.

Each example names the namespace the example agents run in, next to the chart
(``agent-saga``); a test runs in a namespace of its own, so it applies the same objects
with only ``metadata.namespace`` changed (``kubectl apply -n`` refuses a file whose namespace differs).
"""

from __future__ import annotations

from pathlib import Path

import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "k8s"
#: The namespace every example sets (tests/unit/test_user_facing_text.py checks it).
EXAMPLE_NAMESPACE = "agent-saga"


def in_namespace(path: Path, namespace: str) -> str:
    """The YAML of ``path`` with every object moved to ``namespace``."""
    objs = [d for d in yaml.safe_load_all(path.read_text()) if d]
    for obj in objs:
        assert obj["metadata"].get("namespace") == EXAMPLE_NAMESPACE, (path, obj["metadata"])
        obj["metadata"]["namespace"] = namespace
    return yaml.safe_dump_all(objs, sort_keys=False)
