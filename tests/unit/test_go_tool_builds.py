"""`make stripe-mock` and `make promtool` (hack/build-control-plane.sh): a cached or
user-supplied binary is used without building, and a failed build fails loudly with how
to fix it, leaving no binary - never a silent skip."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from fixtures.binaries import read_versions

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "hack" / "build-control-plane.sh"
#: (component, its version in hack/versions.env)
TOOLS = [("stripe-mock", "STRIPE_MOCK_VERSION"), ("promtool", "PROMETHEUS_VERSION")]


def asset_env(tool: str) -> str:
    return "TEST_ASSET_" + tool.upper().replace("-", "_")


def run(tmp_path: Path, tool: str, **env: str) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "AGENT_SAGA_CACHE": str(tmp_path / "cache")}
    e.pop(asset_env(tool), None)
    e.update(env)
    return subprocess.run(["bash", str(SCRIPT), tool, "--print-paths"], env=e, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize(("tool", "version"), TOOLS)
def test_a_build_that_cannot_reach_the_module_proxy_fails_saying_how_to_fix_it(
        tmp_path: Path, tool: str, version: str) -> None:
    p = run(tmp_path, tool, GOPROXY="off", GOMODCACHE=str(tmp_path / "mod"), GOCACHE=str(tmp_path / "gocache"))
    assert p.returncode != 0
    assert f"building {tool}" in p.stderr and "failed" in p.stderr
    assert "the Go module proxy must be reachable" in p.stderr and asset_env(tool) in p.stderr
    assert not (tmp_path / "cache" / "bin" / f"{tool}-{read_versions()[version]}" / tool).exists()


@pytest.mark.parametrize("tool", [t for t, _ in TOOLS])
def test_a_cached_or_user_supplied_binary_is_used_without_building(tmp_path: Path, tool: str) -> None:
    fake = tmp_path / tool
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    p = run(tmp_path, tool, GOPROXY="off", **{asset_env(tool): str(fake)})
    assert p.returncode == 0, p.stderr
    assert f"{tool}={fake}" in p.stdout and "user-supplied" in p.stderr
    bad = run(tmp_path, tool, **{asset_env(tool): str(tmp_path / "missing")})
    assert bad.returncode != 0 and "is not an executable file" in bad.stderr
