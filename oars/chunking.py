"""A file's text, and the chunks a vector store indexes it as: pure, no I/O.

`extract` turns bytes into text (plain text, Markdown, JSON, code and HTML; UTF-8, or UTF-16
with its BOM); anything else is `Unsupported` (binary, PDF for now). `chunks` cuts the text into
windows of tokens, `max_tokens` long, each overlapping the one before by `overlap` tokens, as
OpenAI's `static` chunking strategy (`auto` is 800 / 400). Tokens come from a `Tokenizer`: a
function from text to the spans of its tokens; the one built in (`word_tokens`) needs no
download, and its name is kept with each file indexed, so that a later tokenizer can tell.
"""

from __future__ import annotations

import codecs
import io
import re
from collections.abc import Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Protocol

from oars.office import NotOffice, is_zip, office_text

AUTO_MAX, AUTO_OVERLAP = 800, 400
MIN_MAX, MAX_MAX = 100, 4096


class Tokenizer(Protocol):
    """Text → the (start, end) character spans of its tokens, in order."""

    name: str

    def __call__(self, text: str) -> Sequence[tuple[int, int]]: ...


_WORD = re.compile(r"\w+|[^\w\s]")


class WordTokens:
    """Words and single punctuation marks: deterministic, local, about as many tokens as a
    BPE tokenizer gives English prose."""

    name = "oars-words-1"

    def __call__(self, text: str) -> Sequence[tuple[int, int]]:
        return [m.span() for m in _WORD.finditer(text)]


word_tokens = WordTokens()


@dataclass(frozen=True)
class Chunk:
    position: int
    text: str
    tokens: int


def chunks(text: str, tokenizer: Tokenizer, max_tokens: int, overlap: int) -> list[Chunk]:
    """Windows of `max_tokens` tokens, each starting `max_tokens - overlap` after the last;
    a window's text runs from its first token's start to its last token's end."""
    spans = tokenizer(text)
    step, found, start = max_tokens - overlap, list[Chunk](), 0
    while start < len(spans):
        window = spans[start : start + max_tokens]
        found.append(Chunk(len(found), text[window[0][0] : window[-1][1]], len(window)))
        if start + max_tokens >= len(spans):
            break
        start += step
    return found


class Unsupported(Exception):
    """A file whose text cannot be read (its `last_error.code`: `unsupported_file`, or
    `invalid_file` for a file of a known kind that is broken)."""

    def __init__(self, message: str, code: str = "unsupported_file") -> None:
        super().__init__(message)
        self.code = code


MAX_PDF_PAGES = 2_000


_HTML_SUFFIXES = (".html", ".htm", ".xhtml")


def extract(data: bytes, filename: str) -> str:
    """The text of a file, or `Unsupported`."""
    if data.startswith(b"%PDF-"):
        return _clean(pdf_text(data))
    if is_zip(data):
        try:
            return _clean(office_text(data))
        except NotOffice as exc:
            raise Unsupported(f"The file is a zip archive: {exc}.") from exc
    utf16 = data.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE))
    try:
        text = data.decode("utf-16" if utf16 else "utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise Unsupported("The file is not text (neither UTF-8 nor UTF-16).") from exc
    if "\x00" in text:
        raise Unsupported("The file is binary (it holds NUL characters).")
    head = text[:200].lstrip().lower()
    if filename.lower().endswith(_HTML_SUFFIXES) or head.startswith(("<!doctype html", "<html")):
        return html_text(text)
    return text


def _clean(text: str) -> str:
    """Text a document reader gave, as a database keeps it: no NUL, no lone surrogate (a
    PDF's own mapping of its glyphs may give either), a surrogate pair made one character."""
    text = text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text.replace("\x00", "")


def pdf_text(data: bytes) -> str:
    """A PDF's text, page after page (pypdf's layout-free extraction): an encrypted PDF is
    read if its user password is empty, as viewers open it."""
    from pypdf import PdfReader

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise Unsupported("The PDF is encrypted with a password.")
        if len(reader.pages) > MAX_PDF_PAGES:
            raise Unsupported(f"The PDF has more than {MAX_PDF_PAGES} pages.")
        return "\n\n".join(page.extract_text() for page in reader.pages)
    except Unsupported:
        raise
    except Exception as exc:  # (pypdf raises more than its own errors on a broken file)
        raise Unsupported(f"The PDF cannot be read: {exc}", "invalid_file") from exc


class _Text(HTMLParser):
    _SKIP = frozenset({"script", "style", "head", "template", "noscript"})
    _BREAK = frozenset({"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self.skipping += 1
        elif tag in self._BREAK:
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP:
            self.skipping = max(0, self.skipping - 1)

    def handle_data(self, data: str) -> None:
        if not self.skipping:
            self.parts.append(data)


def html_text(html: str) -> str:
    """An HTML page's text, without its tags, scripts and styles."""
    parser = _Text()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).splitlines())
    return "\n".join(line for line in lines if line)
