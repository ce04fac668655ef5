"""The readable text of an HTML page: what a person would read, not markup or scripts."""

from __future__ import annotations

import re
from html.parser import HTMLParser

# Content of these is never text a reader sees (or is page chrome around the article).
_SKIPPED = frozenset(
    {
        "script",
        "style",
        "noscript",
        "template",
        "svg",
        "math",
        "canvas",
        "iframe",
        "object",
        "embed",
        "head",
        "nav",
        "footer",
        "aside",
        "form",
        "button",
        "select",
    }
)
_BLOCKS = frozenset(
    {
        "p",
        "div",
        "section",
        "article",
        "main",
        "header",
        "br",
        "hr",
        "li",
        "ul",
        "ol",
        "table",
        "tr",
        "h1",
        "h2",
        "h3",
        "h4",
        "h5",
        "h6",
        "pre",
        "blockquote",
        "dd",
        "dt",
        "figcaption",
        "summary",
        "details",
    }
)
_VOID = frozenset({"br", "hr", "img", "input", "meta", "link", "source", "wbr", "area", "col"})
_SPACES = re.compile(r"[ \t\r\f\v\u00a0]+")


class _TextExtractor(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.title_parts: list[str] = []
        self._skip_depth = 0
        self._in_title = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        elif tag in _SKIPPED and tag not in _VOID:
            self._skip_depth += 1
        elif tag in _BLOCKS:
            self.parts.append("\n")
            if tag == "li":
                self.parts.append("- ")
        elif tag in {"td", "th"}:
            self.parts.append(" | ")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        elif tag in _SKIPPED and self._skip_depth:
            self._skip_depth -= 1
        elif tag in _BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title_parts.append(data)
        elif not self._skip_depth:
            self.parts.append(data)


def html_to_text(html: str) -> tuple[str, str]:
    """(title, text) of a page: scripts, styles and navigation dropped, whitespace collapsed."""
    extractor = _TextExtractor()
    extractor.feed(html)
    extractor.close()
    lines = (_SPACES.sub(" ", line).strip() for line in "".join(extractor.parts).split("\n"))
    text = "\n".join(line for line in lines if line)
    title = _SPACES.sub(" ", "".join(extractor.title_parts)).strip()
    return title, text
