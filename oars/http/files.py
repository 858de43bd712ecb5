"""`/v1/files`: uploads kept as bytes on disk (`oars.blobs`) and a row in the store, per API key.

The order is what keeps a half-written file from being seen: an upload is streamed to a
temporary file, renamed into place when whole, and only then is its row written; a delete takes
the row first, then the bytes. An upload refused or cut off leaves neither. A file past its
`expires_at` is gone for every route, as if deleted.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import AsyncIterator
from typing import BinaryIO

from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse

from oars.blobs import Blobs, Part
from oars.errors import InvalidRequest, NotFound, RequestTimeout, StoreUnavailable, TooLarge
from oars.files import new_file
from oars.http.common import JSON, page_wire, path_id, query_choice, query_int, shared, view
from oars.store import FileQuery, Reads, StoredFile
from oars.uploads import Form, FormReader

log = logging.getLogger("oars.http")

_FORM_BYTES = 64 * 1024  # what a form may hold besides the file: its fields, part headers
_WRITE_BYTES = 2**20  # an upload is written to disk in pieces of about this size
_READ_BYTES = 2**16  # and read back in these
_MAX_LIST = 10_000


def _files(request: Request) -> tuple[Reads, Blobs]:
    """The store as the request's tenant sees it, and where the bytes are: a 400 when the
    server keeps no files (nothing could be uploaded, and nothing was)."""
    store, blobs = view(request).store, shared(request).blobs
    if store is None or blobs is None:
        why = "it runs without a store (--store none)" if store is None else "it has no folder"
        raise InvalidRequest(
            f"This server keeps no files: {why}, and the Files API keeps each file's row there.",
            param=None,
            code="files_unavailable",
        )
    return store, blobs


def _missing(file_id: str) -> NotFound:
    return NotFound(f"File with id '{file_id}' not found.", param="file_id")


async def _mine(request: Request, store: Reads) -> StoredFile:
    """The path's file: one of the tenant's that has not expired (any other is a 404)."""
    file_id = path_id(request, "file_id")
    found = await store.get_file(file_id)
    if found is None:
        raise _missing(file_id)
    if found.expired(time.time()):
        raise NotFound(
            f"File with id '{file_id}' expired at {found.expires_at} and is gone.",
            param="file_id",
            code="file_expired",
        )
    return found


async def _receive(request: Request, reader: FormReader, part: Part, idle: float) -> Form:
    """Stream the body through `reader` into `part`, a piece at a time in a thread (the disk
    never blocks the loop that serves the streams)."""
    chunks, pending, size = request.stream().__aiter__(), list[bytes](), 0
    try:
        while True:
            try:
                async with asyncio.timeout(idle):
                    chunk = await chunks.__anext__()
            except StopAsyncIteration:
                break
            for data in reader.feed(chunk):
                pending.append(data)
                size += len(data)
            if size >= _WRITE_BYTES:
                await asyncio.to_thread(part.write, b"".join(pending))
                pending, size = [], 0
    except TimeoutError as exc:
        raise RequestTimeout(f"The upload stalled: nothing arrived for {idle:g} s.") from exc
    except ClientDisconnect as exc:
        raise InvalidRequest(
            "The upload was cut off before its end.", param="file", code="upload_incomplete"
        ) from exc
    if pending:
        await asyncio.to_thread(part.write, b"".join(pending))
    return reader.finish()


async def create(request: Request) -> Response:
    store, blobs = _files(request)
    limits = shared(request).limits
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limits.max_file_bytes + _FORM_BYTES:
        raise TooLarge(limits.max_file_bytes, "The file")
    reader = FormReader(
        request.headers.get("content-type"), file_field="file", max_file_bytes=limits.max_file_bytes
    )
    try:
        part = blobs.begin()
        try:
            file = new_file(
                await _receive(request, reader, part, limits.body_seconds), time.time_ns()
            )
            await asyncio.to_thread(blobs.keep, part, file.id)
        except BaseException:
            part.discard()
            raise
    except OSError as exc:
        raise StoreUnavailable(f"Cannot keep the file: {exc.strerror or exc}") from exc
    try:
        await store.create_file(file)
    except BaseException:
        blobs.remove(file.id)
        raise
    return JSON(file.wire())


async def retrieve(request: Request) -> Response:
    store, _ = _files(request)
    return JSON((await _mine(request, store)).wire())


async def content(request: Request) -> Response:
    store, blobs = _files(request)
    file = await _mine(request, store)
    handle = blobs.open(file.id)
    if handle is None:  # deleted since its row was read
        raise _missing(file.id)
    size = os.fstat(handle.fileno()).st_size
    return StreamingResponse(
        _read(handle),
        media_type="application/octet-stream",
        headers={"content-length": str(size)},
    )


async def _read(handle: BinaryIO) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(handle.read, _READ_BYTES):
            yield chunk
    finally:
        handle.close()


async def delete(request: Request) -> Response:
    store, blobs = _files(request)
    file = await _mine(request, store)
    if not await store.delete_file(file.id):
        raise _missing(file.id)
    try:
        await asyncio.to_thread(blobs.remove, file.id)
    except OSError as exc:  # its row is gone: the bytes are never served again
        log.warning("file %s: its bytes could not be removed: %s", file.id, exc)
    return JSON({"id": file.id, "object": "file", "deleted": True})


async def list_files(request: Request) -> Response:
    store, _ = _files(request)
    after = request.query_params.get("after")
    query = FileQuery(
        limit=query_int(request, "limit", _MAX_LIST, 1, _MAX_LIST),
        order=query_choice(request, "order", ("asc", "desc"), "desc"),
        after=after,
        purpose=request.query_params.get("purpose"),
        now=int(time.time()),
    )
    page = await store.list_files(query)
    if page is None:
        raise InvalidRequest(f"Invalid 'after': no file with id {after!r}.", param="after")
    return JSON(page_wire(page))
