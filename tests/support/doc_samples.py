"""The code blocks of the README and the documentation pages, with the HTML comment
that marks each (``<!-- run -->``, ``<!-- settings -->``...): what the tests of the
pages read. docs/development.md says what each marker asks of the tests."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from tests.conftest import ROOT

README = ROOT / "README.md"
DOCS = ROOT / "docs"

# A fence, and the comment on the line before it if there is one. Fences do not nest
# in these pages; a directive's fence (```{eval-rst}) has a language in braces.
FENCE = re.compile(
    r"(?:^<!--[ \t]*(?P<marker>.*?)[ \t]*-->\n)?"
    r"^```(?P<language>[^\s`]*)[^\n]*\n(?P<code>.*?)^```[ \t]*$",
    re.M | re.S,
)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the block's first line of code, in the page
    language: str
    marker: str  # "" when the block has none
    code: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def compiled(self, source: str | None = None) -> object:
        """The code (or ``source`` in its place), compiled so that a traceback names the
        page and the page's line."""
        padded = "\n" * (self.line - 1) + (self.code if source is None else source)
        return compile(padded, str(self.page), "exec")


def pages() -> list[Path]:
    """The README and every page of the documentation."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "_build" not in p.parts)]


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start("code")) + 1
        found.append(Block(page, line, match["language"], match["marker"] or "", match["code"]))
    return found


def headings(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub (and the site, with MyST's
    heading anchors) make them."""
    text = FENCE.sub("", page.read_text())
    return {slug(title) for title in re.findall(r"^#{1,6} +(.+?) *$", text, re.M)}


def slug(title: str) -> str:
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")
