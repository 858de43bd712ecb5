"""The text of office documents, read with the standard library alone: each format is a zip of
XML parts, and its text is in known elements.

- Word (`.docx`): `word/document.xml`, a paragraph a line (`w:p`, its `w:t` runs).
- PowerPoint (`.pptx`): `ppt/slides/slideN.xml` in slide order, a paragraph a line (`a:p`).
- Excel (`.xlsx`): each sheet of `xl/worksheets/`, a row a line, cells apart by tabs (shared
  strings looked up, numbers as written).
- OpenDocument (`.odt`, `.odp`, `.ods`): `content.xml`, its headings and paragraphs.

A document's parts are read up to `MAX_UNPACKED_BYTES` uncompressed in all, so a small zip
cannot unpack into much more (a zip bomb). A part that declares a DTD is refused: these formats
have none, and a DTD's internal entities could expand a small part a hundredfold (expat expands
no external entity).
"""

from __future__ import annotations

import io
import re
import zipfile
import zlib
from collections.abc import Iterable, Iterator
from xml.etree import ElementTree

MAX_UNPACKED_BYTES = 64 * 2**20  # of one document's parts, in all

_W = "{http://schemas.openxmlformats.org/wordprocessingml/2006/main}"
_A = "{http://schemas.openxmlformats.org/drawingml/2006/main}"
_S = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
_TEXT = "{urn:oasis:names:tc:opendocument:xmlns:text:1.0}"


class NotOffice(ValueError):
    """A zip that is no office document this module reads, or a broken one."""


def is_zip(data: bytes) -> bool:
    return data.startswith(b"PK\x03\x04")


def office_text(data: bytes) -> str:
    """The document's text (`NotOffice` if it is none of the formats above)."""
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return _Document(archive).text()
    except NotOffice:
        raise
    except (
        zipfile.BadZipFile,
        ElementTree.ParseError,
        KeyError,
        IndexError,
        ValueError,
        RuntimeError,  # an encrypted member
        NotImplementedError,  # a compression method zipfile lacks
        zlib.error,
        EOFError,
    ) as exc:
        raise NotOffice(f"the document cannot be read: {exc}") from exc


class _Document:
    """One archive's parts, read against one budget of unpacked bytes."""

    def __init__(self, archive: zipfile.ZipFile) -> None:
        self.archive, self.names = archive, set(archive.namelist())
        self.left = MAX_UNPACKED_BYTES

    def text(self) -> str:
        names = self.names
        if "word/document.xml" in names:
            return _lines(_paragraphs(self.part("word/document.xml"), _W + "p", _W + "t"))
        slides = _numbered(names, r"ppt/slides/slide\d+\.xml")
        if slides:
            return "\n\n".join(
                _lines(_paragraphs(self.part(s), _A + "p", _A + "t")) for s in slides
            )
        if "xl/workbook.xml" in names:
            return self.sheets()
        if "content.xml" in names:
            root = self.part("content.xml")
            return _lines(
                "".join(e.itertext()) for e in root.iter() if e.tag in (_TEXT + "p", _TEXT + "h")
            )
        raise NotOffice("a zip archive that is not a Word, PowerPoint, Excel or OpenDocument file")

    def part(self, name: str) -> ElementTree.Element:
        with self.archive.open(name) as part:
            data = part.read(self.left + 1)
        self.left -= len(data)
        if self.left < 0:
            raise NotOffice(f"the document unpacks to more than {MAX_UNPACKED_BYTES >> 20} MiB")
        if b"<!DOCTYPE" in data or b"<!ENTITY" in data:
            raise NotOffice(f"{name} declares a DTD, which no office document has")
        return ElementTree.fromstring(data)

    def sheets(self) -> str:
        shared: list[str] = []
        if "xl/sharedStrings.xml" in self.names:
            strings = self.part("xl/sharedStrings.xml").iter(_S + "si")
            shared = ["".join(t.text or "" for t in si.iter(_S + "t")) for si in strings]
        out = []
        for sheet in _numbered(self.names, r"xl/worksheets/sheet\d+\.xml"):
            rows = []
            for row in self.part(sheet).iter(_S + "row"):
                cells = []
                for cell in row.iter(_S + "c"):
                    value = cell.find(_S + "v")
                    if cell.get("t") == "s" and value is not None and value.text:
                        cells.append(shared[int(value.text)])
                    elif cell.get("t") == "inlineStr":
                        cells.append("".join(t.text or "" for t in cell.iter(_S + "t")))
                    elif value is not None and value.text:
                        cells.append(value.text)
                rows.append("\t".join(cells))
            out.append(_lines(rows))
        return "\n\n".join(out)


def _numbered(names: set[str], pattern: str) -> list[str]:
    """The parts named by `pattern`, in the order of their numbers (slide2 before slide10)."""
    found = (n for n in names if re.fullmatch(pattern, n))
    return sorted(found, key=lambda n: int(re.sub(r"\D", "", n)))


def _paragraphs(root: ElementTree.Element, paragraph: str, run: str) -> Iterator[str]:
    for p in root.iter(paragraph):
        yield "".join(t.text or "" for t in p.iter(run))


def _lines(lines: Iterable[str]) -> str:
    return "\n".join(line for line in lines if line.strip())
