"""The docs site builds with no warning, lists every page, and the README's links lead somewhere."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"


def nav_pages() -> list[str]:
    """The pages mkdocs.yml's nav names, in order (`- Title: page.md` or `- page.md`)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:") :]
    return re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*$", nav, re.M)


def prose(markdown: str) -> str:
    """The markdown without fenced code blocks and inline code, where a bracket is no link."""
    markdown = re.sub(r"^```.*?^```", "", markdown, flags=re.S | re.M)
    return re.sub(r"(`+).*?\1", "", markdown)


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_docs_build_with_strict_checks(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="mkdocs is not installed (pip install mkdocs, or the test extra)")
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    for page in nav_pages():
        built = "index.html" if page == "index.md" else f"{page.removesuffix('.md')}/index.html"
        assert (tmp_path / "site" / built).is_file(), f"{page} was not built"


def test_every_docs_page_is_in_the_nav() -> None:
    pages = sorted(path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md"))
    nav = nav_pages()
    assert sorted(nav) == pages, (
        f"only in docs/: {set(pages) - set(nav)}, only in the nav: {set(nav) - set(pages)}"
    )
    assert len(nav) == len(set(nav)), "a page is in the nav twice"


def test_every_relative_link_in_the_readme_points_to_an_existing_file() -> None:
    text = README.read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", prose(text))
    relative = [link for link in links if not re.match(r"[a-z]+:", link)]
    assert relative, "the README links to its docs pages"
    headings = {github_anchor(h) for h in re.findall(r"^#+ (.*)", prose(text), re.M)}
    for link in relative:
        path, _, anchor = link.partition("#")
        if path:
            assert (ROOT / path).exists(), f"README links to {link}: there is no {path}"
        else:
            assert anchor in headings, f"README links to {link}: no heading has that anchor"
