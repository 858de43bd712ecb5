"""The text of office documents, read with the standard library alone: each format is a zip of
XML parts, and its text is in known elements.

- Word (`.docx`): `word/document.xml`, a paragraph a line (`w:p`, its `w:t` runs).
- PowerPoint (`.pptx`): `ppt/slides/slideN.xml` in slide order, a paragraph a line (`a:p`).
- Excel (`.xlsx`): each sheet of `xl/worksheets/`, a row a line, cells apart by tabs (shared
  strings looked up, numbers as written).
- OpenDocument (`.odt`, `.odp`, `.ods`): `content.xml`, its headings and paragraphs.

A part is read up to `MAX_PART_BYTES` uncompressed, so a small zip cannot unpack into much
more (a zip bomb); XML is read by expat, which expands no external entity.
"""

from __future__ import annotations

import io
import re
import zipfile
from collections.abc import Iterator
from xml.etree import ElementTree

MAX_PART_BYTES = 64 * 2**20

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
            names = set(archive.namelist())
            if "word/document.xml" in names:
                return _lines(_paragraphs(_part(archive, "word/document.xml"), _W + "p", _W + "t"))
            slides = sorted(
                (n for n in names if re.fullmatch(r"ppt/slides/slide\d+\.xml", n)),
                key=lambda n: int(re.sub(r"\D", "", n)),
            )
            if slides:
                return "\n\n".join(
                    _lines(_paragraphs(_part(archive, s), _A + "p", _A + "t")) for s in slides
                )
            if "xl/workbook.xml" in names:
                return _sheets(archive, names)
            if "content.xml" in names:
                root = _part(archive, "content.xml")
                return _lines(
                    "".join(e.itertext())
                    for e in root.iter()
                    if e.tag in (_TEXT + "p", _TEXT + "h")
                )
    except (zipfile.BadZipFile, ElementTree.ParseError, KeyError, IndexError, ValueError) as exc:
        if isinstance(exc, NotOffice):
            raise
        raise NotOffice(f"the document cannot be read: {exc}") from exc
    raise NotOffice("a zip archive that is not a Word, PowerPoint, Excel or OpenDocument file")


def _part(archive: zipfile.ZipFile, name: str) -> ElementTree.Element:
    with archive.open(name) as part:
        data = part.read(MAX_PART_BYTES + 1)
    if len(data) > MAX_PART_BYTES:
        raise NotOffice(f"{name} unpacks to more than {MAX_PART_BYTES >> 20} MiB")
    return ElementTree.fromstring(data)


def _paragraphs(root: ElementTree.Element, paragraph: str, run: str) -> Iterator[str]:
    for p in root.iter(paragraph):
        yield "".join(t.text or "" for t in p.iter(run))


def _lines(lines: Iterator[str] | list[str]) -> str:
    return "\n".join(line for line in lines if line.strip())


def _sheets(archive: zipfile.ZipFile, names: set[str]) -> str:
    shared: list[str] = []
    if "xl/sharedStrings.xml" in names:
        root = _part(archive, "xl/sharedStrings.xml")
        shared = ["".join(t.text or "" for t in si.iter(_S + "t")) for si in root.iter(_S + "si")]
    sheets = sorted(
        (n for n in names if re.fullmatch(r"xl/worksheets/sheet\d+\.xml", n)),
        key=lambda n: int(re.sub(r"\D", "", n)),
    )
    out = []
    for sheet in sheets:
        rows = []
        for row in _part(archive, sheet).iter(_S + "row"):
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
