"""Routes: `POST /v1/responses`, `GET /v1/models`, `GET /health`."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
import time
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oars.errors import ClientError, EngineError, InvalidRequest
from oars.http.sse import encode_stream
from oars.normalize import normalize
from oars.service import ResponsesService, Run

log = logging.getLogger("oars.http")

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _error(status: int, message: str, type_: str, code: str | None, param: str | None = None
           ) -> JSONResponse:  # fmt: skip
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSONResponse(body, status_code=status)


async def _read_json(request: Request) -> Any:
    raw = await request.body()
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON: {exc}", param=None, code="invalid_json"
        ) from exc


async def _finish_unless_disconnected(run: Run, request: Request) -> bool:
    """Run a non-streamed generation to its end, or stop it when the client goes away."""

    async def drain() -> None:
        async for _ in run.events():
            pass

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    generation, watch = asyncio.create_task(drain()), asyncio.create_task(disconnected())
    await asyncio.wait((generation, watch), return_when=asyncio.FIRST_COMPLETED)
    watch.cancel()
    if generation.done():
        generation.result()  # re-raise what broke it
        return True
    generation.cancel()  # closes the engine's stream, which stops the generation
    with contextlib.suppress(asyncio.CancelledError):
        await generation
    log.info("client disconnected; generation stopped")
    return False


def create_app(service: ResponsesService) -> Starlette:
    started = int(time.time())

    async def create_response(request: Request) -> Response:
        body = await _read_json(request)
        req = normalize(body, served_model=service.engine.info.id,
                        default_temperature=service.default_temperature)  # fmt: skip
        run = await asyncio.to_thread(service.start, req)
        if req.stream:
            return StreamingResponse(
                encode_stream(run.events()), media_type="text/event-stream", headers=_SSE_HEADERS
            )
        if not await _finish_unless_disconnected(run, request):
            return Response(status_code=499)  # nobody is listening; the engine has stopped
        response = run.builder.response
        if response["status"] == "failed":
            return _error(500, response["error"]["message"], "server_error", "server_error")
        return JSONResponse(response)

    async def list_models(request: Request) -> Response:
        model = {"id": service.engine.info.id, "object": "model", "created": started,
                 "owned_by": "oars"}  # fmt: skip
        return JSONResponse({"object": "list", "data": [model]})

    async def health(request: Request) -> Response:
        engine = service.engine
        return JSONResponse({"status": "ok", "model": engine.info.id, "busy": engine.busy})

    async def client_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, ClientError)
        return JSONResponse(exc.body(), status_code=exc.status)

    async def engine_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, EngineError)
        log.error("engine error before streaming: %s", exc)
        return JSONResponse(exc.body(), status_code=exc.status)

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return _error(exc.status_code, message, "invalid_request_error", code)

    async def server_error(request: Request, exc: Exception) -> Response:
        log.exception("unhandled error", exc_info=exc)
        return _error(500, "internal server error", "server_error", "server_error")

    routes = [
        Route("/v1/responses", create_response, methods=["POST"]),
        Route("/v1/models", list_models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]

    handlers = {ClientError: client_error, EngineError: engine_error, HTTPException: http_error,
                Exception: server_error}  # fmt: skip
    app = Starlette(routes=routes, exception_handlers=handlers)  # type: ignore[arg-type]
    app.add_middleware(RequestId)
    return app


class RequestId:
    """Plain ASGI middleware (streams pass untouched): an `x-request-id` on every response."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        request_id = f"req_{secrets.token_hex(12)}".encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"x-request-id", request_id)]
            await send(message)

        await self.app(scope, receive, send_with_id)
