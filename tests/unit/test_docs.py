"""The README and the documentation site: every link lands, every `make` target named exists, the site builds."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.readme import readme_first_command, readme_submit

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
PAGES = sorted(DOCS.glob("*.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# `make x` in code: inline, or a command line of a code block (not the verb in prose).
MAKE_TARGET = re.compile(r"(?:`|^\s*|[;&|]\s*)make ([a-z][a-z0-9-]*)", re.MULTILINE)


def heading_slugs(markdown: str) -> set[str]:
    """The anchors Python-Markdown's toc extension gives the page's headings (outside code blocks)."""
    slugs, fence = set(), False
    for line in markdown.splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (match := re.match(r"^#{1,6} (.+)$", line)):
            text = re.sub(r"[^\w\s-]", "", match.group(1).replace("`", "")).strip().lower()
            slugs.add(re.sub(r"[-\s]+", "-", text))
    return slugs


def links(path: Path) -> list[str]:
    return [target for target in LINK.findall(path.read_text()) if not re.match(r"^(https?:|mailto:)", target)]


@pytest.mark.parametrize("path", [REPO / "README.md", *PAGES], ids=lambda path: str(path.relative_to(REPO)))
def test_every_relative_link_lands_on_a_file_and_heading(path: Path) -> None:
    for target in links(path):
        file_part, _, anchor = target.partition("#")
        landed = (path.parent / file_part).resolve() if file_part else path
        if path.parent == DOCS and file_part.startswith("api/"):
            continue  # generated into the site by docs/_hooks/openapi.py; test_the_site_builds checks them
        assert landed.exists(), f"{path.name}: {target} does not exist"
        if anchor:
            assert anchor in heading_slugs(landed.read_text()), f"{path.name}: {target}: no heading #{anchor}"


def make_targets() -> set[str]:
    targets = set()
    for makefile in (REPO / "Makefile", REPO / "deploy" / "cluster.mk"):
        targets |= set(re.findall(r"^([a-z][a-z0-9-]*):(?!=)", makefile.read_text(), re.MULTILINE))
    return targets


def test_every_make_target_the_docs_name_exists() -> None:
    named = {
        (path.name, target)
        for path in [REPO / "README.md", *PAGES]
        for target in MAKE_TARGET.findall(path.read_text())
    }
    assert named, "the docs name no make target at all"
    missing = sorted((name, target) for name, target in named if target not in make_targets())
    assert not missing, missing


def test_every_page_is_in_the_site_navigation() -> None:
    nav = (REPO / "mkdocs.yml").read_text()
    assert [path.name for path in PAGES if f": {path.name}" not in nav] == []


def test_the_site_builds_with_warnings_as_errors_and_carries_the_api_reference(tmp_path: Path) -> None:
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False, env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )
    assert built.returncode == 0, built.stdout + built.stderr
    assert (site / "troubleshooting" / "index.html").exists()
    reference = (site / "api" / "index.html").read_text()
    assert 'data-spec="openapi.json"' in reference
    for loaded in re.findall(r'(?:src|href)="\./([^"]+)"', reference):
        assert (site / "api" / loaded).exists(), loaded
    assert '"/submit"' in (site / "api" / "openapi.json").read_text()


def test_the_quick_start_gives_make_run_and_the_submit_the_fresh_host_test_runs() -> None:
    """The fresh-host tier runs these two lines on a new Debian 12; a README edit that loses either fails here first."""
    assert readme_first_command() == "make run"
    submit = readme_submit()
    assert submit.startswith("curl -s -X POST http://127.0.0.1:5000/submit ")
    body = re.search(r"-d '(\{.*\})'", submit, re.DOTALL)
    assert body, submit
    assert json.loads(body.group(1))["template"] == "hello"
