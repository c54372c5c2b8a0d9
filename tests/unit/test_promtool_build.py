"""`make promtool` (hack/build-control-plane.sh promtool): a user-supplied binary is used
without building, and a failed build fails loudly with how to fix it, leaving no binary."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from fixtures.binaries import read_versions

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "build-control-plane.sh"


def run(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    e = {**os.environ, "AGENT_SAGA_CACHE": str(tmp_path / "cache")}
    e.pop("TEST_ASSET_PROMTOOL", None)
    e.update(env)
    return subprocess.run(["bash", str(SCRIPT), "promtool", "--print-paths"], env=e, capture_output=True, text=True,
                          timeout=120)


def test_a_build_that_cannot_reach_the_module_proxy_fails_saying_how_to_fix_it(tmp_path: Path) -> None:
    p = run(tmp_path, GOPROXY="off", GOMODCACHE=str(tmp_path / "mod"), GOCACHE=str(tmp_path / "gocache"))
    assert p.returncode != 0
    assert "building promtool" in p.stderr and "failed" in p.stderr
    assert "the Go module proxy must be reachable" in p.stderr and "TEST_ASSET_PROMTOOL" in p.stderr
    version = read_versions()["PROMETHEUS_VERSION"]
    assert not (tmp_path / "cache" / "bin" / f"promtool-{version}" / "promtool").exists()


def test_a_user_supplied_binary_is_used_without_building(tmp_path: Path) -> None:
    fake = tmp_path / "promtool"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    p = run(tmp_path, TEST_ASSET_PROMTOOL=str(fake), GOPROXY="off")
    assert p.returncode == 0, p.stderr
    assert f"promtool={fake}" in p.stdout and "user-supplied" in p.stderr
    bad = run(tmp_path, TEST_ASSET_PROMTOOL=str(tmp_path / "missing"))
    assert bad.returncode != 0 and "is not an executable file" in bad.stderr
