"""`/v1/vector_stores`: stores of files indexed for `file_search`, their files and file
batches, and keyword search over their chunks, per API key.

Adding a file only records it (`in_progress`); the ingester (`oars.ingest`) indexes it in the
background and the store's `status` and `file_counts` follow. Every id is the tenant's or a
404; a store past its `expires_at` is `expired`, and searching or adding to it is a 400.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from oars import vector_stores as rules
from oars.chunking import Unsupported, extract
from oars.errors import InvalidRequest, NotFound
from oars.http.common import (
    JSON,
    page_wire,
    path_id,
    query_choice,
    query_int,
    read_json,
    shared,
    tenant_of,
    view,
)
from oars.ids import new_id
from oars.normalize import validate_metadata
from oars.ranking import search_store, used
from oars.ranking import usable as usable_store
from oars.store import Json, ListQuery, NewVectorFile, NewVectorStore, Page, Vectors


def _vectors(request: Request) -> tuple[Vectors, str]:
    """The store and the request's tenant: a 400 when the server keeps nothing."""
    vectors = shared(request).vectors()
    if vectors is None or shared(request).blobs is None:
        raise InvalidRequest(
            "This server keeps no vector stores: it runs without a store or a files folder.",
            param=None,
            code="vector_stores_unavailable",
        )
    return vectors, tenant_of(request)


def _nudge(request: Request) -> None:
    ingester = shared(request).ingester
    if ingester is not None:
        ingester.nudge()


async def _body(request: Request, allowed: frozenset[str]) -> Json:
    body = rules.object_body(await read_json(request))
    rules.known(body, allowed)
    return body


def _list_query(request: Request) -> ListQuery:
    params = request.query_params
    return ListQuery(
        limit=query_int(request, "limit", 20, 1, 100),
        order=query_choice(request, "order", ("asc", "desc"), "desc"),
        after=params.get("after"),
        before=params.get("before"),
    )


def _status_filter(request: Request) -> str | None:
    status = request.query_params.get("filter")
    if status is not None and status not in rules.FILE_STATUSES:
        raise InvalidRequest(
            f"Invalid 'filter': one of {', '.join(rules.FILE_STATUSES)}.", param="filter"
        )
    return status


def _page(page: Page | None) -> Response:
    if page is None:
        raise InvalidRequest("Invalid 'after' or 'before': no such id here.", param="after")
    return JSON(page_wire(page))


async def _store(request: Request, vectors: Vectors, tenant: str, *, usable: bool = False) -> Json:
    vs_id = path_id(request, "vector_store_id")
    if usable:
        return await usable_store(vectors, vs_id, tenant, "vector_store_id")
    found = await vectors.get_vector_store(vs_id, tenant=tenant)
    if found is None:
        raise NotFound(f"Vector store with id '{vs_id}' not found.", param="vector_store_id")
    return found


def _named(ids: list[str], param: str = "file_ids") -> list[tuple[str, str]]:
    return [(file_id, f"{param}[{i}]") for i, file_id in enumerate(ids)]


async def _new_files(
    request: Request, named: list[tuple[str, str]], attributes: Json, chunking: Json
) -> list[NewVectorFile]:
    """The files to add, each (id, the parameter that names it): each one of the tenant's and
    not expired, else a 404 naming its parameter."""
    store, now = view(request).store, time.time()
    assert store is not None
    for file_id, param in named:
        found = await store.get_file(file_id)
        if found is None or found.expired(now):
            raise NotFound(f"File with id '{file_id}' not found.", param=param)
    return [NewVectorFile(file_id, attributes, chunking) for file_id, _ in named]


# ---- stores -------------------------------------------------------------------------------

_CREATE = frozenset(
    {"name", "description", "file_ids", "chunking_strategy", "expires_after", "metadata"}
)


async def create(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    body = await _body(request, _CREATE)
    name = rules.text_field(body, "name", 256) or ""
    description = rules.text_field(body, "description", 512)
    metadata = validate_metadata(body)
    expiry = rules.expires_after(body.get("expires_after"))
    chunking = rules.chunking(body.get("chunking_strategy"))
    added = await _new_files(request, _named(rules.file_ids(body.get("file_ids"))), {}, chunking)
    days = None if expiry is None else expiry["days"]
    made = NewVectorStore(new_id("vs"), time.time_ns(), name, description, metadata, days)
    await vectors.create_vector_store(made, added, tenant=tenant)
    _nudge(request)
    return JSON(await vectors.get_vector_store(made.id, tenant=tenant))


async def list_stores(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    return _page(await vectors.list_vector_stores(_list_query(request), tenant=tenant))


async def retrieve(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    return JSON(await _store(request, vectors, tenant))


async def modify(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    body = await _body(request, frozenset({"name", "expires_after", "metadata"}))
    found = await _store(request, vectors, tenant)
    changes: dict[str, Any] = {}
    if body.get("name") is not None:
        changes["name"] = rules.text_field(body, "name", 256)
    if "metadata" in body:
        changes["metadata"] = validate_metadata(body)
    if "expires_after" in body:
        expiry = rules.expires_after(body["expires_after"])
        changes["expires_days"] = None if expiry is None else expiry["days"]
    await vectors.update_vector_store(found["id"], changes, tenant=tenant)
    return JSON(await _store(request, vectors, tenant))


async def delete(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    found = await _store(request, vectors, tenant)
    await vectors.delete_vector_store(found["id"], tenant=tenant)
    return JSON({"id": found["id"], "object": "vector_store.deleted", "deleted": True})


# ---- files --------------------------------------------------------------------------------


async def _file(request: Request, vectors: Vectors, tenant: str, vs_id: str) -> Json:
    file_id = path_id(request, "file_id")
    found = await vectors.get_vector_file(vs_id, file_id, tenant=tenant)
    if found is None:
        raise NotFound(f"No file with id '{file_id}' in vector store '{vs_id}'.", param="file_id")
    return found


async def add_file(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    body = await _body(request, frozenset({"file_id", "attributes", "chunking_strategy"}))
    file_id = body.get("file_id")
    if not isinstance(file_id, str) or not file_id:
        raise InvalidRequest(
            "Missing required parameter: 'file_id'.",
            param="file_id",
            code="missing_required_parameter",
        )
    attributes = rules.attributes(body.get("attributes"))
    chunking = rules.chunking(body.get("chunking_strategy"))
    vs = await _store(request, vectors, tenant, usable=True)
    rules.room(vs, 1)
    added = await _new_files(request, [(file_id, "file_id")], attributes, chunking)
    await vectors.add_vector_files(vs["id"], added, tenant=tenant)
    await used(vectors, vs)
    _nudge(request)
    return JSON(await vectors.get_vector_file(vs["id"], file_id, tenant=tenant))


async def list_files(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    vs = await _store(request, vectors, tenant)
    status = _status_filter(request)
    query = _list_query(request)
    return _page(await vectors.list_vector_files(vs["id"], query, tenant=tenant, status=status))


async def retrieve_file(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    vs = await _store(request, vectors, tenant)
    return JSON(await _file(request, vectors, tenant, vs["id"]))


async def update_file(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    body = await _body(request, frozenset({"attributes"}))
    if "attributes" not in body:
        raise InvalidRequest(
            "Missing required parameter: 'attributes'.",
            param="attributes",
            code="missing_required_parameter",
        )
    attributes = rules.attributes(body["attributes"])
    vs = await _store(request, vectors, tenant)
    file = await _file(request, vectors, tenant, vs["id"])
    return JSON(await vectors.update_vector_file(vs["id"], file["id"], attributes, tenant=tenant))


async def delete_file(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    vs = await _store(request, vectors, tenant)
    file = await _file(request, vectors, tenant, vs["id"])
    await vectors.delete_vector_file(vs["id"], file["id"], tenant=tenant)
    return JSON({"id": file["id"], "object": "vector_store.file.deleted", "deleted": True})


async def file_content(request: Request) -> Response:
    """The file's text as it was indexed (none until it is)."""
    vectors, tenant = _vectors(request)
    vs = await _store(request, vectors, tenant)
    file = await _file(request, vectors, tenant, vs["id"])
    data: list[Json] = []
    blobs, store = shared(request).blobs, view(request).store
    row = await store.get_file(file["id"]) if store is not None else None
    indexed = file["status"] == "completed" and row is not None and blobs is not None
    handle = blobs.open(file["id"]) if indexed and blobs is not None else None
    if handle is not None and row is not None:
        with handle:
            raw = await asyncio.to_thread(handle.read)
        with contextlib.suppress(Unsupported):  # (it was read once: it still can be)
            data = [{"type": "text", "text": await asyncio.to_thread(extract, raw, row.filename)}]
    page = {"object": "vector_store.file_content.page", "data": data, "has_more": False}
    return JSON({**page, "next_page": None})


# ---- batches ------------------------------------------------------------------------------


async def _batch_files(request: Request, body: Json) -> list[NewVectorFile]:
    attributes = rules.attributes(body.get("attributes"))
    chunking = rules.chunking(body.get("chunking_strategy"))
    if ("file_ids" in body) == ("files" in body):
        raise InvalidRequest("Send either 'file_ids' or 'files' (not both).", param="file_ids")
    if "file_ids" in body:
        ids = rules.file_ids(body["file_ids"])
        if not ids:
            raise InvalidRequest("Invalid 'file_ids': at least one.", param="file_ids")
        return await _new_files(request, _named(ids), attributes, chunking)
    files = body["files"]
    if not isinstance(files, list) or not 0 < len(files) <= rules.MAX_BATCH:
        raise InvalidRequest(f"Invalid 'files': 1 to {rules.MAX_BATCH} objects.", param="files")
    added: list[NewVectorFile] = []
    for i, one in enumerate(files):
        if not isinstance(one, dict):
            raise InvalidRequest(f"Invalid 'files[{i}]': expected an object.", param=f"files[{i}]")
        rules.known(one, frozenset({"file_id", "attributes", "chunking_strategy"}))
        file_id = one.get("file_id")
        if not isinstance(file_id, str) or not 0 < len(file_id) <= 200:
            raise InvalidRequest(
                f"Invalid 'files[{i}].file_id': expected a file id.", param=f"files[{i}].file_id"
            )
        mine, cut = attributes, chunking
        if one.get("attributes") is not None:
            mine = rules.attributes(one["attributes"], f"files[{i}].attributes")
        if "chunking_strategy" in one:
            cut = rules.chunking(one["chunking_strategy"], f"files[{i}].chunking_strategy")
        added += await _new_files(request, [(file_id, f"files[{i}].file_id")], mine, cut)
    return list({f.file_id: f for f in added}.values())


async def create_batch(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    body = await _body(request, frozenset({"file_ids", "files", "attributes", "chunking_strategy"}))
    vs = await _store(request, vectors, tenant, usable=True)
    added = await _batch_files(request, body)
    rules.room(vs, len(added))
    batch_id = new_id("vsfb")
    await vectors.create_file_batch(vs["id"], batch_id, int(time.time()), tenant=tenant)
    await vectors.add_vector_files(vs["id"], added, tenant=tenant, batch_id=batch_id)
    await used(vectors, vs)
    _nudge(request)
    return JSON(await vectors.get_file_batch(vs["id"], batch_id, tenant=tenant))


async def _batch(request: Request, vectors: Vectors, tenant: str) -> Json:
    vs = await _store(request, vectors, tenant)
    batch_id = path_id(request, "batch_id")
    found = await vectors.get_file_batch(vs["id"], batch_id, tenant=tenant)
    if found is None:
        raise NotFound(f"File batch with id '{batch_id}' not found.", param="batch_id")
    return found


async def retrieve_batch(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    return JSON(await _batch(request, vectors, tenant))


async def cancel_batch(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    batch = await _batch(request, vectors, tenant)
    await vectors.cancel_file_batch(batch["vector_store_id"], batch["id"], tenant=tenant)
    return JSON(await _batch(request, vectors, tenant))


async def list_batch_files(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    batch = await _batch(request, vectors, tenant)
    status = _status_filter(request)
    page = await vectors.list_vector_files(
        batch["vector_store_id"],
        _list_query(request),
        tenant=tenant,
        status=status,
        batch_id=batch["id"],
    )
    return _page(page)


# ---- search -------------------------------------------------------------------------------


async def search(request: Request) -> Response:
    vectors, tenant = _vectors(request)
    asked = rules.search(rules.object_body(await read_json(request)))
    vs = await _store(request, vectors, tenant, usable=True)
    found = await search_store(
        vectors,
        vs["id"],
        asked.queries,
        embedder=shared(request).embedder,
        filters=asked.filters,
        limit=asked.max_num_results,
        ranking=asked.ranking,
    )
    data = [
        {
            "file_id": r.file_id,
            "filename": r.filename,
            "score": r.score,
            "attributes": r.attributes,
            "content": [{"type": "text", "text": r.text}],
        }
        for r in found
    ]
    await used(vectors, vs)
    return JSON(
        {
            "object": "vector_store.search_results.page",
            "search_query": list(asked.queries),
            "data": data,
            "has_more": False,
            "next_page": None,
        }
    )
