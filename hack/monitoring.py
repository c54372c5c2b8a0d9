"""Copy the chart's alert rules to deploy/prometheus/ (``make monitoring``).

One source: charts/agent-saga/files/monitoring/agent-saga.rules.yaml, which the chart
renders as a PrometheusRule. deploy/prometheus/agent-saga.rules.yaml is that file for a
Prometheus without the Prometheus Operator, written here and never edited by hand.
``--check`` writes nothing and exits 1 when the copy differs (a unit test runs it).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = ROOT / "charts" / "agent-saga" / "files" / "monitoring" / "agent-saga.rules.yaml"
COPY = ROOT / "deploy" / "prometheus" / "agent-saga.rules.yaml"
NOTICE = ("# Generated from charts/agent-saga/files/monitoring/agent-saga.rules.yaml by `make monitoring`:\n"
          "# edit that file, not this one.\n")


def expected() -> str:
    """The copy's text: the notice, then the source as it is."""
    return NOTICE + SOURCE.read_text()


def main(argv: list[str]) -> int:
    text = expected()
    if "--check" in argv:
        if not COPY.is_file() or COPY.read_text() != text:
            print(f"{COPY.relative_to(ROOT)} differs from {SOURCE.relative_to(ROOT)}: run `make monitoring`",
                  file=sys.stderr)
            return 1
        return 0
    COPY.parent.mkdir(parents=True, exist_ok=True)
    COPY.write_text(text)
    print(f"wrote {COPY.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
