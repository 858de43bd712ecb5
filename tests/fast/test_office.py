"""Office documents' text (`oars.office`), read with the standard library: Word, PowerPoint,
Excel and OpenDocument files built here part by part as their formats lay them out, then one
indexed into a vector store and found by search."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import pytest

from oars.chunking import Unsupported, extract
from oars.office import MAX_UNPACKED_BYTES, NotOffice, office_text
from tests.conftest import files_server, sdk

W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
A = 'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"'
S = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'
TEXT = 'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0"'


def _zip(parts: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, body in parts.items():
            archive.writestr(name, body)
    return out.getvalue()


def docx(*paragraphs: str) -> bytes:
    runs = "".join(
        f"<w:p><w:r><w:t>{p[:4]}</w:t></w:r><w:r><w:t>{p[4:]}</w:t></w:r></w:p>" for p in paragraphs
    )
    return _zip(
        {
            "[Content_Types].xml": "<Types/>",
            "word/document.xml": f"<w:document {W}><w:body>{runs}<w:p/></w:body></w:document>",
        }
    )


def test_each_format_gives_its_text_in_order() -> None:
    assert office_text(docx("Tidal pools hold anemones.", "Kelp forests sway.")) == (
        "Tidal pools hold anemones.\nKelp forests sway."
    )
    slide = "<p:sld xmlns:p='p' {a}><a:p><a:r><a:t>{t}</a:t></a:r></a:p></p:sld>"
    pptx = _zip(
        {
            f"ppt/slides/slide{n}.xml": slide.format(a=A, t=t)
            for n, t in ((10, "Tenth"), (2, "Second"))
        }
    )
    assert office_text(pptx) == "Second\n\nTenth"  # by number, not by name
    sheet = (
        f'<worksheet {S}><sheetData><row><c t="s"><v>1</v></c><c><v>42</v></c></row>'
        '<row><c t="inlineStr"><is><t>inline</t></is></c></row></sheetData></worksheet>'
    )
    xlsx = _zip(
        {
            "xl/workbook.xml": f"<workbook {S}/>",
            "xl/sharedStrings.xml": f"<sst {S}><si><t>zero</t></si><si><t>answer</t></si></sst>",
            "xl/worksheets/sheet1.xml": sheet,
        }
    )
    assert office_text(xlsx) == "answer\t42\ninline"
    odt = _zip(
        {
            "mimetype": "application/vnd.oasis.opendocument.text",
            "content.xml": f"<r {TEXT}><text:h>Title</text:h><text:p>Body <text:span>"
            "text</text:span></text:p></r>",
        }
    )
    assert office_text(odt) == "Title\nBody text"


def test_what_is_no_office_document_is_refused() -> None:
    with pytest.raises(NotOffice):
        office_text(_zip({"notes.txt": "a plain zip"}))
    with pytest.raises(NotOffice):
        office_text(_zip({"word/document.xml": "<w:document"}))  # broken XML
    bomb = _zip({"word/document.xml": b"<a>" + b" " * (MAX_UNPACKED_BYTES + 1) + b"</a>"})
    assert len(bomb) < MAX_UNPACKED_BYTES // 100
    with pytest.raises(NotOffice, match="MiB"):
        office_text(bomb)
    half = b"<a>" + b" " * (MAX_UNPACKED_BYTES // 2) + b"</a>"  # each part within, not all
    with pytest.raises(NotOffice, match="MiB"):
        office_text(_zip({f"ppt/slides/slide{n}.xml": half for n in (1, 2, 3)}))
    laughs = (
        '<?xml version="1.0"?><!DOCTYPE d [<!ENTITY a "aaaaaaaaaa">'
        '<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]>'
        f"<w:document {W}><w:body><w:p><w:r><w:t>&b;</w:t></w:r></w:p></w:body></w:document>"
    )
    with pytest.raises(NotOffice, match="DTD"):
        office_text(_zip({"word/document.xml": laughs}))
    with pytest.raises(Unsupported):
        extract(_zip({"a.bin": b"\x00"}), "a.zip")


def test_a_word_document_is_indexed_and_found(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/oars.db"
    with files_server(url, tmp_path / "files") as base, sdk(base) as client:
        made = client.files.create(
            file=("reef.docx", docx("Coral reefs bleach in warm water.")), purpose="assistants"
        )
        vs = client.vector_stores.create(name="docs")
        added = client.vector_stores.files.create_and_poll(
            file_id=made.id, vector_store_id=vs.id, poll_interval_ms=20
        )
        assert added.status == "completed"
        hits = client.vector_stores.search(vs.id, query="coral bleach").data
        assert [h.filename for h in hits] == ["reef.docx"]
        assert hits[0].content[0].text == "Coral reefs bleach in warm water."
