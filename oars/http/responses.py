"""`/v1/responses` and its stored-state routes: every handler reads a run; a streamed one that
is not in the background stops its run when its client goes away."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from oars import compactor
from oars.errors import EngineError, InvalidRequest, NotFound, StoreUnavailable
from oars.events import Event
from oars.http.common import (
    JSON,
    create_request,
    finish_unless_disconnected,
    follow_run,
    list_page,
    open_turn,
    page_wire,
    path_id,
    query_int,
    read_json,
    shared,
    store_of,
    view,
)
from oars.http.sse import encode_batches
from oars.ids import new_id
from oars.normalize import ENCRYPTED_REASONING, INCLUDABLE, normalize_compact
from oars.turn import items_of

log = logging.getLogger("oars.http")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _sse(batches: AsyncIterator[list[Event]]) -> StreamingResponse:
    return StreamingResponse(
        encode_batches(batches), media_type="text/event-stream", headers=_SSE_HEADERS
    )


async def create(request: Request) -> Response:
    req = create_request(shared(request), await read_json(request))
    handle = await view(request).submit(req)
    if req.stream:
        keepalive = shared(request).limits.keepalive_seconds
        return _sse(follow_run(handle, keepalive, owns=not req.background))
    if req.background:
        return JSON(handle.initial)
    if not await finish_unless_disconnected(handle, request):
        return Response(status_code=499)  # nobody is listening; the engine has stopped
    response = handle.snapshot
    if handle.unkept:
        raise StoreUnavailable(response["error"]["message"])
    if response["status"] == "failed":
        raise handle.generation.error or EngineError(response["error"]["message"])
    return JSON(response)


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
    tenant = view(request)
    stored = await tenant.get(response_id)
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
    return _sse(tenant.follow(response_id, after, shared(request).limits.keepalive_seconds))


async def delete(request: Request) -> Response:
    response_id = path_id(request, "response_id")
    store_of(request)
    await view(request).delete(response_id)
    return JSON({"id": response_id, "object": "response", "deleted": True})


async def cancel(request: Request) -> Response:
    store_of(request)
    return JSON(await view(request).cancel(path_id(request, "response_id")))


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
    req = normalize_compact(await read_json(request))
    store = view(request).store
    items = await items_of(req.previous_response_id, req.input_items, store, service.unseal)
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
    req = create_request(oars, await read_json(request))
    turn = await open_turn(oars, req, view(request).store)
    count = await oars.service.count_tokens(req.model, turn.engine_request())
    body: dict[str, Any] = {"object": "response.input_tokens", "input_tokens": count}
    return JSON(body)
