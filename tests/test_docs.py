"""The README and the docs site say what the repository does: the README stays short, its test
command is CI's, every page it links exists, and every docs page is in the site's navigation."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
CI = (ROOT / ".ci" / "run").read_text(encoding="utf-8")


def _extras(text: str) -> set[str]:
    (found,) = set(re.findall(r"pip install -q -e '\.\[([a-z,]+)\]'", text))
    return set(found.split(","))


def test_the_readme_is_read_in_five_minutes() -> None:
    assert len(README.splitlines()) <= 200


def test_the_readme_test_command_is_cis() -> None:
    ci_pytest = [ln.strip() for ln in CI.splitlines() if re.match(r"\s*python -m pytest", ln)]
    assert ci_pytest == ["python -m pytest"], ci_pytest
    (readme_cmd,) = [ln for ln in README.splitlines() if "-m pytest" in ln]
    assert readme_cmd.endswith(".venv/bin/python -m pytest")  # the same line, nothing added
    # the README installs what the tests need; CI adds only the docs build's extra
    assert _extras(CI) - _extras(readme_cmd) == {"docs"}
    assert "torch==2.13.0" in readme_cmd and "'torch==2.13.0'" in CI


def test_every_local_link_of_the_readme_exists() -> None:
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert local
    missing = [link for link in local if not (ROOT / link).exists()]
    assert not missing, missing
    for path in re.findall(r"`(examples/[\w./-]+)`", README):
        assert (ROOT / path).exists(), path


def test_every_docs_page_is_in_the_site_navigation() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    pages = {str(p.relative_to(ROOT / "docs")) for p in (ROOT / "docs").rglob("*.md")}
    listed = set(re.findall(r":\s+([\w/.-]+\.md)\s*$", nav, re.M))
    assert pages == listed, (pages - listed, listed - pages)
