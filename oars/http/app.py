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

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match, Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from oars import logs
from oars.engines.upstream import UpstreamEngine
from oars.errors import ClientError, EngineError, StoreUnavailable
from oars.http import conversations, responses
from oars.http.common import JSON, Shared, error, shared
from oars.metrics import Metrics, timed_store
from oars.runs import Runs
from oars.service import ResponsesService
from oars.store import Store

log = logging.getLogger("oars.http")
access = logging.getLogger("oars.access")


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


async def metrics(request: Request) -> Response:
    return Response(shared(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


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
    Route("/metrics", metrics, methods=["GET"]),
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
    metrics = Metrics()
    store = timed_store(store, metrics) if store is not None else None
    runs = Runs(service, store, replica=replica or default_replica(), lease_seconds=lease_seconds,
                metrics=metrics)  # fmt: skip
    metrics.load = runs.load
    for engine in service.engines.values():
        if isinstance(engine, UpstreamEngine):
            engine.observe = metrics.upstream_reply

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
    app.state.oars = Shared(service, runs, store, int(time.time()), metrics)
    app.add_middleware(Observed, metrics=metrics)
    return app


class Observed:
    """Plain ASGI middleware (streams pass untouched): every response gets an `x-request-id`
    (the client's own when it sent a sane one), every request is counted and timed by route,
    and logged once it has ended."""

    def __init__(self, app: ASGIApp, metrics: Metrics) -> None:
        self.app, self.metrics = app, metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        rid = _client_request_id(scope) or f"req_{secrets.token_hex(12)}"
        token = logs.request_id.set(rid)
        started, status = time.monotonic(), 500

        async def send_observed(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message["headers"] = [*message.get("headers", []), (b"x-request-id", rid.encode())]
            await send(message)

        try:
            await self.app(scope, receive, send_observed)
        finally:
            seconds = time.monotonic() - started
            method, path = scope["method"], scope["path"]
            self.metrics.request_done(method, _route_of(scope), status, seconds)
            access.info("%s %s %d %.0f ms", method, path[:200], status, seconds * 1000,
                        extra={"method": method, "path": path[:200], "status": status,
                               "duration_ms": round(seconds * 1000, 1)})  # fmt: skip
            logs.request_id.reset(token)


def _client_request_id(scope: Scope) -> str | None:
    """A request id the client chose: kept when it is 1-200 visible ASCII characters."""
    for name, value in scope["headers"]:
        if name == b"x-request-id":
            if 0 < len(value) <= 200 and all(0x21 <= b <= 0x7E for b in value):
                return str(value.decode("ascii"))
            return None
    return None


def _route_of(scope: Scope) -> str:
    """The route's path template (bounded label values); `other` for paths no route has."""
    for route in ROUTES:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            return route.path
    return "other"
