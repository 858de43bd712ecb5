"""The app: routes, error handlers and the request-id middleware (the only web-framework code).

Route handlers are module-level functions; what they share (the runs, the store) is on
`app.state.oars`. Handlers for responses are in `oars.http.responses`, conversations in
`oars.http.conversations`.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oars.errors import ClientError, EngineError, StoreUnavailable
from oars.http import conversations, responses
from oars.http.common import JSON, Shared, error, shared
from oars.runs import Runs
from oars.service import ResponsesService
from oars.store import Store

log = logging.getLogger("oars.http")


async def list_models(request: Request) -> Response:
    oars = shared(request)
    models = [{"id": model, "object": "model", "created": oars.started,
               "owned_by": engine.info.owned_by} for model, engine in oars.service.engines.items()]  # fmt: skip
    return JSON({"object": "list", "data": models})


async def health(request: Request) -> Response:
    oars = shared(request)
    service = oars.service
    busy = {model: engine.busy for model, engine in service.engines.items()}
    return JSON({"status": "ok", "model": service.default_model, "busy": any(busy.values()),
                 "models": busy, "running": len(oars.runs.active)})  # fmt: skip


async def _client_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ClientError)
    return JSON(exc.body(), status_code=exc.status)


async def _engine_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngineError)
    log.error("engine error before streaming: %s", exc)
    return JSON(exc.body(), status_code=exc.status)


async def _store_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StoreUnavailable)
    log.error("%s %s: %s", request.method, request.url.path, exc)
    return JSON(exc.body(), status_code=exc.status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error(exc.status_code, message, "invalid_request_error", code)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    return error(500, "internal server error", "server_error", "server_error")


ROUTES = [
    Route("/v1/responses", responses.create, methods=["POST"]),
    Route("/v1/responses/input_tokens", responses.input_tokens, methods=["POST"]),
    Route("/v1/responses/{response_id}", responses.retrieve, methods=["GET"]),
    Route("/v1/responses/{response_id}", responses.delete, methods=["DELETE"]),
    Route("/v1/responses/{response_id}/cancel", responses.cancel, methods=["POST"]),
    Route("/v1/responses/{response_id}/input_items", responses.input_items, methods=["GET"]),
    Route("/v1/conversations", conversations.create, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", conversations.retrieve, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}", conversations.update, methods=["POST"]),
    Route("/v1/conversations/{conversation_id}", conversations.delete, methods=["DELETE"]),
    Route("/v1/conversations/{conversation_id}/items", conversations.list_items, methods=["GET"]),
    Route("/v1/conversations/{conversation_id}/items", conversations.add_items, methods=["POST"]),
    Route(
        "/v1/conversations/{conversation_id}/items/{item_id}",
        conversations.get_item,
        methods=["GET"],
    ),
    Route(
        "/v1/conversations/{conversation_id}/items/{item_id}",
        conversations.delete_item,
        methods=["DELETE"],
    ),
    Route("/v1/models", list_models, methods=["GET"]),
    Route("/health", health, methods=["GET"]),
]


def default_replica(port: int | None = None) -> str:
    """A replica's name: stable across restarts of the same server, so that on startup it can
    fail what it left unfinished."""
    return (
        f"{socket.gethostname()}:{port}" if port is not None else f"replica-{secrets.token_hex(6)}"
    )


def create_app(service: ResponsesService, store: Store | None = None, *,
               replica: str | None = None, lease_seconds: float = 10.0) -> Starlette:  # fmt: skip
    """`store` None: nothing is kept (`store` is echoed false; stored-state endpoints 404)."""
    runs = Runs(service, store, replica=replica or default_replica(), lease_seconds=lease_seconds)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runs.open()
        try:
            yield
        finally:
            await runs.close()
            await service.aclose()
            if store is not None:
                await store.close()

    handlers = {ClientError: _client_error, EngineError: _engine_error,
                StoreUnavailable: _store_error, HTTPException: _http_error,
                Exception: _server_error}  # fmt: skip
    app = Starlette(routes=ROUTES, exception_handlers=handlers, lifespan=lifespan)  # type: ignore[arg-type]
    app.state.oars = Shared(service, runs, store, int(time.time()))
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
