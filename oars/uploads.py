"""An upload's `multipart/form-data` body, read as it arrives: the file part's bytes handed on
chunk by chunk (never held whole), the other fields kept (they are small, and bounded).

`FormReader` is an incremental consumer like the parsers: `feed(chunk)` returns the file's bytes
in that chunk, `finish()` the form. It does no I/O; whoever feeds it writes the bytes. Every
malformed body is a 400 naming what is wrong, a file over the limit a 413, both as soon as the
bytes that show it arrive.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from python_multipart.exceptions import FormParserError
from python_multipart.multipart import MultipartParser, parse_options_header

from oars.errors import InvalidRequest, TooLarge

MAX_FIELDS = 16  # parts besides the file
MAX_FIELD_BYTES = 4096  # each one's value


@dataclass(frozen=True)
class Form:
    """A whole form: its text fields, and the file part's name and size (the name None when
    the body had no file part)."""

    fields: Mapping[str, str]
    filename: str | None
    size: int


def _malformed(why: str) -> InvalidRequest:
    return InvalidRequest(
        f"The request body is not valid multipart/form-data: {why}.",
        param=None,
        code="invalid_multipart",
    )


def _text(raw: bytes) -> str:
    """A header's text: UTF-8 as clients send it, else Latin-1 (every byte is one)."""
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return raw.decode("latin-1")


def _boundary(content_type: str | None) -> bytes:
    kind, options = parse_options_header(content_type or "")
    if kind != b"multipart/form-data":
        raise InvalidRequest(
            "The request body must be multipart/form-data (a file upload), not "
            f"{(content_type or 'none')[:100]!r}.",
            param=None,
            code="invalid_content_type",
        )
    boundary = options.get(b"boundary", b"")
    if not 0 < len(boundary) <= 70:  # RFC 2046's bounds
        raise _malformed("its Content-Type names no boundary of 1 to 70 characters")
    return boundary


class FormReader:
    """Reads a form whose part `file_field` is the upload (at most `max_file_bytes` long)."""

    def __init__(self, content_type: str | None, *, file_field: str, max_file_bytes: int) -> None:
        self.file_field, self.max_file_bytes = file_field, max_file_bytes
        self.fields: dict[str, str] = {}
        self.filename: str | None = None
        self.size = 0
        self._out: list[bytes] = []
        self._headers: dict[str, str] = {}
        self._header = [bytearray(), bytearray()]  # the header being read: its name, its value
        self._name: str | None = None  # the part being read: a field's name, or None: the file
        self._value = bytearray()
        self._ended = False
        self._parser = MultipartParser(
            _boundary(content_type),
            {
                "on_part_begin": self._headers.clear,
                "on_header_field": lambda d, s, e: self._header[0].extend(d[s:e]),
                "on_header_value": lambda d, s, e: self._header[1].extend(d[s:e]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._part_begins,
                "on_part_data": self._data,
                "on_part_end": self._part_end,
                "on_end": self._end,
            },
        )

    def feed(self, chunk: bytes) -> list[bytes]:
        """Read `chunk`; return the file's bytes in it."""
        if self._ended:
            return []  # the epilogue, after the closing boundary: nothing
        try:
            self._parser.write(chunk)
        except FormParserError as exc:
            raise _malformed(str(exc).rstrip(".") or "it cannot be parsed") from exc
        out, self._out = self._out, []
        return out

    def finish(self) -> Form:
        """The form, once the body has ended."""
        if not self._ended:
            raise _malformed("it ends before its closing boundary")
        return Form(dict(self.fields), self.filename, self.size)

    # ---- the parser's callbacks ---------------------------------------------------------

    def _header_end(self) -> None:
        name, value = self._header  # as Latin-1 (byte for byte): a parameter is decoded alone
        self._headers[name.decode("latin-1").strip().lower()] = value.decode("latin-1").strip()
        name.clear()
        value.clear()

    def _part_begins(self) -> None:
        kind, options = parse_options_header(self._headers.get("content-disposition", ""))
        name = _text(options.get(b"name", b""))
        if kind != b"form-data" or not name:
            raise _malformed("a part has no Content-Disposition: form-data with a name")
        if name != self.file_field:
            if name in self.fields or len(self.fields) >= MAX_FIELDS:
                raise _malformed(f"'{name[:100]}' is given twice, or there are too many fields")
            self._name = name
            return
        if self.filename is not None:
            raise _malformed(f"it holds more than one '{self.file_field}'")
        if b"filename" not in options:
            raise InvalidRequest(
                f"Invalid '{self.file_field}': expected a file (a part with a filename), "
                "not a text field.",
                param=self.file_field,
            )
        self.filename = _text(options[b"filename"]).replace("%22", '"')
        self._name = None

    def _data(self, data: bytes, start: int, end: int) -> None:
        if self._name is not None:
            if len(self._value) + end - start > MAX_FIELD_BYTES:
                raise InvalidRequest(
                    f"Invalid '{self._name[:100]}': longer than {MAX_FIELD_BYTES} bytes.",
                    param=self._name[:100],
                )
            self._value.extend(data[start:end])
            return
        self.size += end - start
        if self.size > self.max_file_bytes:
            raise TooLarge(self.max_file_bytes, "The file")
        self._out.append(data[start:end])

    def _part_end(self) -> None:
        if self._name is None:
            return
        try:
            self.fields[self._name] = self._value.decode()
        except UnicodeDecodeError as exc:
            raise InvalidRequest(
                f"Invalid '{self._name[:100]}': not UTF-8 text.", param=self._name[:100]
            ) from exc
        self._value.clear()
        self._name = None

    def _end(self) -> None:
        self._ended = True
