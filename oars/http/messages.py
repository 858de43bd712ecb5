"""`/v1/messages` and `/v1/messages/count_tokens`: Anthropic's Messages API run as a response
(`oars.messages` translates both ways).

The request goes through the same door as `/v1/responses` (the tenant's runs, its key's
limits) and the same run; only the wire forms differ. Errors, before the stream and inside it,
are in Anthropic's shape (the app's handlers choose it by path: `anthropic_path`). Nothing is
stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from oars.errors import ClientError
from oars.events import Event
from oars.http.common import (
    JSON,
    create_request,
    finished,
    open_turn,
    read_json,
    shared,
    translated_stream,
    view,
)
from oars.jsonfast import dumps_bytes
from oars.messages import EventStream, message, translate
from oars.normalize import ResponseRequest
from oars.runs import RunHandle
from oars.translation import Translation

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_PING = b'event: ping\ndata: {"type":"ping"}\n\n'


def anthropic_path(path: str) -> bool:
    """The routes whose errors are in Anthropic's shape."""
    return path == "/v1/messages" or path.startswith("/v1/messages/")


def _request(request: Request, translation: Translation) -> ResponseRequest:
    try:
        return create_request(shared(request), translation.body)
    except ClientError as exc:
        raise translation.rename(exc) from None


async def create(request: Request) -> Response:
    translation = translate(await read_json(request))
    req = _request(request, translation)
    try:
        handle = await view(request).submit(req)
    except ClientError as exc:
        raise translation.rename(exc) from None
    if translation.stream:
        keepalive = shared(request).limits.keepalive_seconds
        events = _events(handle, keepalive)
        return StreamingResponse(events, media_type="text/event-stream", headers=_SSE_HEADERS)
    response = await finished(handle, request)
    if response is None:
        return Response(status_code=499)  # nobody is listening; the engine has stopped
    return JSON(message(response, handle.generation.stop_sequence))


async def count_tokens(request: Request) -> Response:
    oars = shared(request)
    translation = translate(await read_json(request), counting=True)
    req = _request(request, translation)
    turn = await open_turn(oars, req, None)
    count = await oars.service.count_tokens(req.model, turn.engine_request())
    return JSON({"input_tokens": count})


def _sse(name: str, data: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + dumps_bytes(data) + b"\n\n"


async def _events(handle: RunHandle, keepalive: float | None) -> AsyncIterator[bytes]:
    """The run's events as named Messages events; `ping` while silent."""
    stream = EventStream()

    def encode(event: Event) -> bytes:
        # The run has ended when its terminal event is read: its stop sequence is known then.
        events = stream.feed(event, handle.generation.stop_sequence)
        return b"".join(_sse(name, data) for name, data in events)

    async for data in translated_stream(handle, keepalive, encode, _PING):
        yield data
