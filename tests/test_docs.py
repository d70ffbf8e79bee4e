"""The documentation holds together: every relative link in README.md, docs/**/*.md and the scripts' index reaches a
file that exists, every ``#anchor`` into a markdown file names a heading there (GitHub's slugs), and the pages keep
their size (README <= 150 lines, each docs/*.md page <= 400; docs/notes/, the history, has no limit)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README_LINES = 150
PAGE_LINES = 400

LINK = re.compile(r"(?<!!)\[(?:[^\]\\]|\\.)*\]\(([^()\s]+)\)")  # [text](target); images and bare URLs aside
FENCE = re.compile(r"^(```|~~~)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def pages() -> list[Path]:
    """Every markdown page a user reads: the README, docs/ (notes included) and the scripts' index."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "scripts").rglob("*.md"))]
    return [p for p in found if p.is_file()]


def prose(text: str) -> list[str]:
    """The page's lines outside fenced code blocks (a ``#`` or a ``[x](y)`` inside code is not markdown)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(line)
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline code and link markup dropped to their text, lower case, every character
    that is not a letter, digit, underscore, hyphen or space removed, each space a hyphen."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
    text = re.sub(r"<[^>]+>", "", text).lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, repeated ones numbered as GitHub numbers them (``x``, ``x-1``, ...)."""
    seen: dict[str, int] = {}
    out = set()
    for line in prose(page.read_text()):
        match = HEADING.match(line)
        if not match:
            continue
        base = slug(match.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def dead_links(page: Path, root: Path = ROOT) -> list[str]:
    """``page: target: why`` (paths from ``root``) for every relative link of the page that reaches nothing."""
    dead = []
    for line in prose(page.read_text()):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link
        for target in LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto: ...: not checked here
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            where = f"{page.relative_to(root)}: {target}"
            if not dest.exists():
                dead.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                dead.append(f"{where}: no heading with that anchor in {dest.relative_to(root)}")
    return dead


def test_github_slugs_by_hand():
    assert slug("Queue policies under overload (the bundled tritonserver 2.51)") == \
        "queue-policies-under-overload-the-bundled-tritonserver-251"
    assert slug("`serving-bench serve`") == "serving-bench-serve"
    assert slug("The host's speed drifts: a request's phases move together") == \
        "the-hosts-speed-drifts-a-requests-phases-move-together"
    assert slug("Tools — and diagnostics") == "tools--and-diagnostics"


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_reaches_a_file_and_a_heading(page):
    dead = dead_links(page)
    assert not dead, "dead links:\n" + "\n".join(dead)


def test_a_planted_dead_link_and_anchor_are_caught(tmp_path):
    """The check can fail: a page linking a missing file and a missing heading of an existing page is reported twice;
    a link to a heading that exists, numbered as GitHub numbers a repeated heading, is not."""
    (tmp_path / "other.md").write_text("# Title\n\n## Part\n\n## Part\n\n```\n# not a heading\n```\n")
    page = tmp_path / "page.md"
    page.write_text("[a](missing.md) [b](other.md#no-such-part) [c](other.md#part-1) [d](other.md#title)\n"
                    "`[e](inside-code.md)` [f](https://example.org/x)\n```\n[g](in-a-fence.md)\n```\n")
    assert dead_links(page, tmp_path) == ["page.md: missing.md: no such file",
                                "page.md: other.md#no-such-part: no heading with that anchor in other.md"]
    assert "not-a-heading" not in anchors(tmp_path / "other.md")


def test_the_readme_and_each_reference_page_keep_their_size():
    readme = len((ROOT / "README.md").read_text().splitlines())
    assert readme <= README_LINES, f"README.md has {readme} lines (at most {README_LINES})"
    long = {p.name: n for p in sorted((ROOT / "docs").glob("*.md"))
            if (n := len(p.read_text().splitlines())) > PAGE_LINES}
    assert not long, f"docs pages over {PAGE_LINES} lines (history belongs in docs/notes/): {long}"


# -- the code's references to the docs -------------------------------------------------------------------------------

CODE_DIRS = ("serving_bench", "benchmarks", "scripts")
CODE_SUFFIXES = {".py", ".pxd", ".pyx", ".sh", ".cc", ".h"}
# docs/PAGE.md, an optional #anchor, and an optional quoted section name right after it ("Host stalls set ...")
DOC_REF = re.compile(r"\bdocs/([\w./-]+?\.md)(#[\w-]+)?(?:(?:[,;:]\s*|\s+)\"([^\"]+)\")?")


def _flat(text: str) -> str:
    """``text`` with its line breaks, the indentation and comment marks after them, and runs of spaces made one
    space, so that a reference wrapped over two lines reads as one."""
    return re.sub(r"\s*\n\s*(?:#\s*)?", " ", text)


def code_doc_references(root: Path = ROOT) -> list[str]:
    """``file: reference: why`` for every ``docs/...md`` reference in the code (:data:`CODE_DIRS`) that reaches
    nothing: a page that does not exist, an ``#anchor`` that names no heading there (GitHub's slugs), or a quoted
    section name that does not occur in the page (a heading or a paragraph's bold lead)."""
    dead = []
    for folder in CODE_DIRS:
        for path in sorted((root / folder).rglob("*")):
            if path.suffix not in CODE_SUFFIXES or "__pycache__" in path.parts or not path.is_file():
                continue
            for page, anchor, name in DOC_REF.findall(_flat(path.read_text(errors="replace"))):
                target = root / "docs" / page
                where = f"{path.relative_to(root)}: docs/{page}{anchor}"
                if not target.is_file():
                    dead.append(f"{where}: no such page")
                elif anchor and anchor[1:] not in anchors(target):
                    dead.append(f"{where}: no heading with that anchor")
                elif name and _flat(name) not in _flat(target.read_text()).replace("**", "").replace("`", ""):
                    dead.append(f'{where} "{name}": no such section name on the page')
    return dead


def test_the_codes_references_to_the_docs_reach_a_page_and_a_section():
    dead = code_doc_references()
    assert not dead, "references to the docs that reach nothing (pages moved: docs/notes/ holds the history):\n" + \
        "\n".join(dead)


def test_a_planted_dead_code_reference_is_caught(tmp_path):
    """A missing page, a missing anchor and a section name the page lacks are each reported; a reference wrapped over
    two comment lines is read whole; existing ones are not reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# Page\n\n## A part\n\n**A bold lead** and text.\n")
    (tmp_path / "scripts").mkdir()
    (tmp_path / "scripts" / "x.py").write_text(
        '"""See docs/gone.md, docs/page.md#no-part and docs/page.md, "Not there".\n'
        'Fine: docs/page.md#a-part, docs/page.md, "A bold\n    lead".\n"""\n# and docs/page.md#page, "A\n# part"\n')
    assert code_doc_references(tmp_path) == ["scripts/x.py: docs/gone.md: no such page",
                                             "scripts/x.py: docs/page.md#no-part: no heading with that anchor",
                                             'scripts/x.py: docs/page.md "Not there": no such section name on the page']
