"""The manual is navigable: every relative link in README.md, MANUAL.md, docs/*.md and docs/runbooks/*.md
resolves to a file in the repository (and its #anchor to a heading there), every page
under docs/ is linked from MANUAL.md, and the files the README names exist."""

from __future__ import annotations

import hashlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "MANUAL.md", *sorted((ROOT / "docs").glob("*.md")),
         *sorted((ROOT / "docs" / "runbooks").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]|<[^>]+>", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*$", line)
        if m:
            s = slug(m.group(1))
            n = seen.get(s, 0)
            seen[s] = n + 1
            out.add(s if n == 0 else f"{s}-{n}")
    return out


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [a or b for a, b in LINK.findall(text)]


def test_the_slug_rule() -> None:
    assert slug('Failure modes (deliberately not "fail closed")') == "failure-modes-deliberately-not-fail-closed"
    assert slug("The fleet process: agent-saga-recoveryd") == "the-fleet-process-agent-saga-recoveryd"
    assert slug("`kubectl saga`: the levers") == "kubectl-saga-the-levers"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or ROOT not in dest.parents and dest != ROOT:
            broken.append(f"{target}: no file {dest}")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_manual_links_every_page_under_docs() -> None:
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in links(ROOT / "MANUAL.md") if not t.startswith("#")}
    missing = [p.name for p in sorted((ROOT / "docs").glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"MANUAL.md does not link {missing}: add each to its table of contents"


def test_the_files_the_readme_points_to_exist() -> None:
    for name in ("LICENSE", "NOTICE", "SECURITY.md", "MANUAL.md", "docs/AGENT_RUNTIME.md"):
        assert (ROOT / name).is_file(), name
    # The canonical text of https://www.apache.org/licenses/LICENSE-2.0.txt, byte for byte.
    assert hashlib.sha256((ROOT / "LICENSE").read_bytes()).hexdigest() == \
        "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_package_carries_the_license_and_notice() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert sorted(project["license-files"]) == ["LICENSE", "NOTICE"]


def test_saga_recoveryd_is_the_recovery_daemon_under_its_short_name() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["saga-recoveryd"] == scripts["agent-saga-recoveryd"] == "agent_saga_recoveryd.app:main"
