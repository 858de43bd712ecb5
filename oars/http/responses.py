"""`/v1/responses` and its stored-state routes: every handler reads a run, none owns one."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from oars import compactor
from oars.errors import InvalidRequest, NotFound, StoreUnavailable
from oars.events import Event
from oars.history import items_of, resolve
from oars.http.common import (
    JSON,
    Shared,
    list_page,
    page_wire,
    path_id,
    query_int,
    read_json,
    shared,
    store_of,
    tenant_of,
)
from oars.http.sse import encode_stream
from oars.ids import new_id
from oars.normalize import (
    ENCRYPTED_REASONING,
    INCLUDABLE,
    ResponseRequest,
    normalize,
    normalize_compact,
)
from oars.runs import RunHandle
from oars.store.tenant import scoped

log = logging.getLogger("oars.http")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _sse(events: AsyncIterator[Event]) -> StreamingResponse:
    return StreamingResponse(
        encode_stream(events), media_type="text/event-stream", headers=_SSE_HEADERS
    )


async def _request(request: Request) -> ResponseRequest:
    return prepare(shared(request), await read_json(request), tenant_of(request))


def prepare(oars: Shared, body: Any, tenant: str) -> ResponseRequest:
    """A create body, validated for this server and this tenant (the HTTP and WebSocket
    transports both start here)."""
    service = oars.service
    req = normalize(
        body,
        served_model=service.default_model,
        default_temperature=service.default_temperature,
        can_store=oars.store is not None,
        unseal=service.sealer.unseal if service.sealer else None,
    )
    return _capped(replace(req, tenant=tenant), oars.limits.max_output_tokens)


def _capped(req: ResponseRequest, cap: int | None) -> ResponseRequest:
    """The server's cap on output tokens: asking for more is a 400; asking for none gets it."""
    asked = req.engine.sampling.max_output_tokens
    if cap is None or (asked is not None and asked <= cap):
        return req
    if asked is not None:
        raise InvalidRequest(
            f"Invalid 'max_output_tokens': {asked} is more than this server allows ({cap}).",
            param="max_output_tokens",
        )
    sampling = replace(req.engine.sampling, max_output_tokens=cap)
    return replace(req, engine=replace(req.engine, sampling=sampling))


async def create(request: Request) -> Response:
    req = await _request(request)
    handle = await shared(request).runs.submit(req)
    if req.stream:
        return _sse(_read(handle, owns=not req.background))
    if req.background:
        return JSON(handle.initial)
    if not await _finish_unless_disconnected(handle, request):
        return Response(status_code=499)  # nobody is listening; the engine has stopped
    response = handle.snapshot
    if handle.unkept:
        raise StoreUnavailable(response["error"]["message"])
    if response["status"] == "failed":
        body = {"error": {**response["error"], "type": "server_error", "param": None}}
        return JSON(body, status_code=500)
    return JSON(response)


async def _read(handle: RunHandle, after: int = -1, *, owns: bool) -> AsyncIterator[Event]:
    """A reader of the run's log; one that owns the run stops it when the client goes away."""
    try:
        async for event in handle.events(after):
            yield event
    finally:
        if owns and not handle.done:
            log.info("client disconnected; generation stopped")
            handle.cancel()


async def _finish_unless_disconnected(handle: RunHandle, request: Request) -> bool:
    """Wait for a non-streamed run to end, or stop it when the client goes away."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    result, watch = asyncio.ensure_future(handle.result()), asyncio.create_task(disconnected())
    await asyncio.wait((result, watch), return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    if result.done():
        result.result()
        return True
    handle.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await result
    log.info("client disconnected; generation stopped")
    return False


def _include(request: Request) -> list[str]:
    values = request.query_params.getlist("include[]") + request.query_params.getlist("include")
    for i, value in enumerate(values):
        if value not in INCLUDABLE:
            raise InvalidRequest(
                f"Invalid 'include[{i}]': unknown value {value!r}.", param=f"include[{i}]"
            )
    return values


def _with_encrypted_reasoning(request: Request, snapshot: dict[str, Any]) -> dict[str, Any]:
    """`include[]=reasoning.encrypted_content` on a read: seal reasoning items that lack it."""
    sealer = shared(request).service.sealer
    if sealer is None:
        return snapshot
    output = [
        {
            **item,
            "encrypted_content": sealer.seal(
                "".join(p.get("text", "") for p in item.get("content") or [])
            ),
        }
        if item.get("type") == "reasoning" and not item.get("encrypted_content")
        else item
        for item in snapshot["output"]
    ]
    return {**snapshot, "output": output}


async def retrieve(request: Request) -> Response:
    response_id = path_id(request, "response_id")
    include = _include(request)
    runs = shared(request).runs
    stored = await runs.get(response_id, tenant_of(request))
    stream = request.query_params.get("stream", "false").lower()
    if stream not in ("true", "false"):
        raise InvalidRequest("Invalid 'stream': expected true or false.", param="stream")
    if stream == "false":
        if ENCRYPTED_REASONING in include:
            return JSON(_with_encrypted_reasoning(request, stored.snapshot))
        return JSON(stored.snapshot)
    if not stored.streamed:
        raise InvalidRequest(
            "This response was neither streamed nor run in the background: it "
            "has no events to stream.",
            param="stream",
        )
    after = query_int(request, "starting_after", -1, -1, 2**31 - 1)
    return _sse(runs.follow(response_id, after))


async def delete(request: Request) -> Response:
    response_id = path_id(request, "response_id")
    store = store_of(request)
    handle = shared(request).runs.active.get(response_id)
    if handle is not None and handle.request.store and handle.request.tenant == tenant_of(request):
        handle.cancel()
        await handle.result()
    if not await store.delete(response_id):
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
    return JSON({"id": response_id, "object": "response", "deleted": True})


async def cancel(request: Request) -> Response:
    store_of(request)
    snapshot = await shared(request).runs.cancel(
        path_id(request, "response_id"), tenant_of(request)
    )
    return JSON(snapshot)


async def input_items(request: Request) -> Response:
    response_id = path_id(request, "response_id")
    _include(request)
    page = await store_of(request).input_items(response_id, **list_page(request))
    if page is None:
        raise NotFound(f"Response with id '{response_id}' not found.", param="response_id")
    return JSON(page_wire(page))


async def compact(request: Request) -> Response:
    oars = shared(request)
    service = oars.service
    req = normalize_compact(
        await read_json(request), unseal=service.sealer.unseal if service.sealer else None
    )
    store = scoped(oars.store, tenant_of(request)) if oars.store else None
    items = await items_of(req.previous_response_id, req.input_items, store)
    compacted = await compactor.compact(service, req.model, items)
    oars.metrics.compacted(req.model, "endpoint")
    body = {
        "id": new_id("resp"),
        "object": "response.compaction",
        "created_at": int(time.time()),
        "output": [*compacted.kept, compacted.item],
        "usage": compacted.usage,
    }
    return JSON(body)


async def input_tokens(request: Request) -> Response:
    oars = shared(request)
    req = await _request(request)
    history = await resolve(req, scoped(oars.store, req.tenant) if oars.store else None)
    count = await oars.service.count_tokens(history.request)
    body: dict[str, Any] = {"object": "response.input_tokens", "input_tokens": count}
    return JSON(body)
