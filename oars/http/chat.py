"""`/v1/chat/completions`: a chat request run as a response (`oars.chat` translates both ways).

The request goes through the same door as `/v1/responses` (the tenant's runs, its key's
limits) and the same run; only the wire forms differ. Nothing is stored.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from oars.chat import ChatTranslation, ChunkStream, completion, translate
from oars.errors import ClientError
from oars.events import Event
from oars.http.common import (
    JSON,
    create_request,
    finished,
    read_json,
    shared,
    translated_stream,
    view,
)
from oars.http.sse import KEEPALIVE
from oars.jsonfast import dumps_bytes
from oars.runs import RunHandle

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
_DONE = b"data: [DONE]\n\n"


async def create(request: Request) -> Response:
    chat = translate(await read_json(request))
    try:
        req = create_request(shared(request), chat.body)
        handle = await view(request).submit(req)
    except ClientError as exc:
        chat.rename(exc)
        raise
    if chat.stream:
        keepalive = shared(request).limits.keepalive_seconds
        chunks = _chunks(handle, chat, keepalive)
        return StreamingResponse(chunks, media_type="text/event-stream", headers=_SSE_HEADERS)
    response = await finished(handle, request)
    if response is None:
        return Response(status_code=499)  # nobody is listening; the engine has stopped
    return JSON(completion(response, logprobs=chat.logprobs))


async def _chunks(
    handle: RunHandle, chat: ChatTranslation, keepalive: float | None
) -> AsyncIterator[bytes]:
    """The run's events as `data:` lines of chunks, one write per batch, then `[DONE]`."""
    stream = ChunkStream(include_usage=chat.include_usage, logprobs=chat.logprobs)

    def encode(event: Event) -> bytes:
        return b"".join(b"data: " + dumps_bytes(chunk) + b"\n\n" for chunk in stream.feed(event))

    async for data in translated_stream(handle, keepalive, encode, KEEPALIVE):
        yield data
    yield _DONE
