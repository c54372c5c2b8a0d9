"""The integrations are optional. ``import agent_saga`` loads none of FastAPI, Starlette,
OpenTelemetry or prometheus-client: tests/unit/test_public_api.py checks that in a fresh
interpreter (no third-party module at all). Here: asking for one that is not installed
names the extra to install."""

from __future__ import annotations

import sys

import pytest
from agent_saga import ConfigurationError, observe, setup_metrics, setup_telemetry


@pytest.mark.parametrize(("module", "setup", "extra"), [
    ("opentelemetry", setup_telemetry, "opentelemetry"),
    ("prometheus_client", setup_metrics, "metrics"),
])
def test_a_missing_library_names_the_extra(monkeypatch, module, setup, extra):
    monkeypatch.setitem(sys.modules, module, None)  # as if not installed
    with pytest.raises(ConfigurationError, match=rf"pip install 'agent-saga\[{extra}\]'"):
        setup()
    assert observe.current is None
