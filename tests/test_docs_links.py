"""Relative links in README.md, envs/README.md and docs/**/*.md point at files that exist, and at
headings that exist.

The docs build (``mkdocs build --strict`` in .ci/run) checks the pages under docs/; this test also
covers README.md, whose links go into docs/ and the repository, and runs without mkdocs. A link
is ``[text](target)`` or ``![alt](target)`` outside code; ``http(s)://`` and ``mailto:`` targets
are not checked. ``target#anchor`` into a Markdown file must name one of its headings, slugged as
Python-Markdown's ``toc`` extension (mkdocs) or GitHub does it.
"""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
CODE_SPAN = re.compile(r"(`+).+?\1", re.S)
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t#]*$", re.M)
EXTERNAL = ("http://", "https://", "mailto:")


def _markdown_files() -> list[Path]:
    return [REPO / "README.md", REPO / "envs" / "README.md", *sorted(DOCS.rglob("*.md"))]


def _prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (links there are not links)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def _slugs(heading: str) -> set[str]:
    """The anchors a heading gets: Python-Markdown's ``toc`` slug (mkdocs) and GitHub's."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    toc = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", ascii_text).strip().lower())
    github = re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")
    return {toc, github}


def anchors(path: Path) -> set[str]:
    """Every anchor of a Markdown file's headings (headings inside code blocks do not count)."""
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return {slug for heading in HEADING.findall(text) for slug in _slugs(heading)}


def broken_links(path: Path) -> list[str]:
    """``"<file>: <target> (<why>)"`` for each relative link of ``path`` that leads nowhere."""
    problems = []
    for target in LINK.findall(_prose(path.read_text(encoding="utf-8"))):
        if target.startswith(EXTERNAL):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists():
            problems.append(f"{path.name}: {target} (no file {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            problems.append(f"{path.name}: {target} (no heading with anchor #{anchor} in {dest.name})")
    return problems


@pytest.mark.parametrize("path", _markdown_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_relative_links_lead_somewhere(path: Path):
    assert broken_links(path) == []


def test_the_checker_finds_a_missing_file_and_a_missing_anchor(tmp_path: Path):
    (tmp_path / "other.md").write_text("# Other\n\n## The `rllib` command: train\n", encoding="utf-8")
    page = tmp_path / "page.md"
    page.write_text(
        "[ok](other.md#the-rllib-command-train) [ok2](#a-title) [gone](missing.md) "
        "[bad anchor](other.md#nope) [ext](https://example.com/x.md) `[code](missing2.md)`\n\n"
        "# A title\n\n```\n[in a fence](missing3.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page) == [
        f"page.md: missing.md (no file {tmp_path / 'missing.md'})",
        "page.md: other.md#nope (no heading with anchor #nope in other.md)",
    ]


def test_every_docs_page_is_in_the_mkdocs_nav_and_every_nav_page_exists():
    nav = set(re.findall(r"^\s*-\s*(?:[^:\n]+:\s*)?([\w./-]+\.md)\s*$", (REPO / "mkdocs.yml").read_text(), re.M))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert nav == pages, f"only in mkdocs.yml's nav: {sorted(nav - pages)}; only in docs/: {sorted(pages - nav)}"



#: Words of how the project is run, not of what it does: the README and the user guide state
#: contracts, commands and results. ("Ray session", Ray's own term, is allowed.)
WORKSHOP = re.compile(r"\b(leases?|sessions?|waves?|helpers?)\b|\bissues? #\d+|(?<![\w&])#\d+\b|\bitems? \d+\b", re.I)


def workshop_words(text: str) -> list[str]:
    """``"<line>: <match>"`` for each workshop word in a page (prose and code alike)."""
    return [f"{number}: {match.group(0)}"
            for number, line in enumerate(text.splitlines(), start=1)
            for match in WORKSHOP.finditer(line.replace("Ray session", "Ray"))]


@pytest.mark.parametrize("path", [REPO / "README.md", *sorted(DOCS.rglob("*.md"))],
                         ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_page_speaks_of_the_workshop(path: Path):
    assert workshop_words(path.read_text(encoding="utf-8")) == []


def test_the_workshop_check_finds_its_words():
    text = "Measured in the third lease (issue #24, item 7; see #28).\nThe Ray session's logs; &#8212;.\n"
    assert workshop_words(text) == ["1: lease", "1: issue #24", "1: item 7", "1: #28"]


# ---------------------------------------------------------------------- the code's own words
#: Where code lives: the package, its examples, benchmarks, research scripts, tools and tests.
CODE_FOLDERS = ("rllib_dph", "envs", "tuned_examples", "bench", "research", "tools", "tests", ".ci")
#: What a docstring or comment may not say: tracker references ("issue #24", "#30 item 6"), the
#: workplace's words and paths of the machines the package was developed on.
CODE_WORKSHOP = re.compile(
    r"\bleases?\b|\bissues? #?\d+|#\d+,? items? \d+|\(#\d+\)|\bwave \d+\b|\bsessions? \d+\b|/work/|/root/", re.I)
#: A reference from code into the user guide: ``docs/<page>.md`` and, when quoted after it, a heading.
DOCS_REFERENCE = re.compile(r"(docs/[\w/.-]+\.md)(?:[,:]?\s*\"([^\"]+)\")?")


def _code_files() -> list[Path]:
    files = [p for folder in CODE_FOLDERS for p in (REPO / folder).rglob("*")
             if p.is_file() and p.suffix in (".py", ".md", "") and "__pycache__" not in p.parts]
    return [p for p in files if p != Path(__file__).resolve()]


def code_workshop_words(text: str) -> list[str]:
    return [f"{number}: {match.group(0)}" for number, line in enumerate(text.splitlines(), start=1)
            for match in CODE_WORKSHOP.finditer(line)]


def test_no_code_speaks_of_the_workshop():
    found = {p.relative_to(REPO).as_posix(): words for p in _code_files()
             if (words := code_workshop_words(p.read_text(encoding="utf-8", errors="replace")))}
    assert not found, "\n".join(f"{path}:{word}" for path, words in found.items() for word in words)


def test_the_code_workshop_check_finds_its_words():
    text = "(issue #24, item 7) composes (#30 item 6); see (#28); the third lease; /work/main/x.py\nhelper(x) # 1\n"
    assert code_workshop_words(text) == ["1: issue #24", "1: #30 item 6", "1: (#28)", "1: lease", "1: /work/"]


def _headings(page: Path) -> set[str]:
    return {" ".join(h.replace("`", "").split()) for h in HEADING.findall(page.read_text(encoding="utf-8"))}


def test_every_docs_reference_in_the_code_names_a_page_and_heading_that_exist():
    missing = []
    for path in _code_files():
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1):
            for match in DOCS_REFERENCE.finditer(line):
                page, heading = REPO / match.group(1), match.group(2)
                where = f"{path.relative_to(REPO).as_posix()}:{number}"
                if not page.is_file():
                    missing.append(f"{where}: no page {match.group(1)}")
                elif heading and " ".join(heading.replace("`", "").split()) not in _headings(page):
                    missing.append(f"{where}: no heading {heading!r} in {match.group(1)}")
    assert not missing, "\n".join(missing)
