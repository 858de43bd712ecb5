"""The app: routes, error handlers and the request-id middleware (the only web-framework code).

Route handlers are module-level functions; what they share (the runs, the store) is on
`app.state.oars`. Handlers for responses are in `oars.http.responses`, conversations in
`oars.http.conversations`, files in `oars.http.files`, embeddings in
`oars.http.embeddings`, vector stores in `oars.http.vector_stores`.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import secrets
import socket
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Match, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket

from oars import api, catalog, logs
from oars.blobs import Blobs
from oars.embeddings import Embedder
from oars.errors import ClientError, EngineError, NotFound, StoreUnavailable
from oars.http import (
    chat,
    conversations,
    embeddings,
    files,
    messages,
    pages,
    responses,
    vector_stores,
    websocket,
)
from oars.http.common import JSON, Shared, shared
from oars.http.messages import anthropic_path
from oars.http.openapi import Endpoint, Param, docs_page, document_bytes
from oars.ingest import Ingester
from oars.messages import error_body
from oars.metrics import Metrics, timed_store
from oars.runs import Runs
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.store import Store
from oars.sweeper import Sweeper

log = logging.getLogger("oars.http")
access = logging.getLogger("oars.access")


def _served(oars: Shared) -> catalog.Served:
    toolboxes = oars.service.toolboxes
    return catalog.Served(
        created=oars.started,
        mcp=toolboxes is not None,
        web_search=toolboxes is not None and toolboxes.web is not None,
        file_search=toolboxes is not None and toolboxes.files is not None,
    )


async def list_models(request: Request) -> Response:
    oars = shared(request)
    return JSON(catalog.listing(catalog.models(oars.service.engines).values(), _served(oars)))


async def retrieve_model(request: Request) -> Response:
    oars = shared(request)
    model = request.path_params["model"]
    info = catalog.models(oars.service.engines).get(model)
    if info is None:
        raise NotFound(f"The model {model[:200]!r} does not exist.", param="model",
                       code="model_not_found")  # fmt: skip
    return JSON(catalog.entry(info, _served(oars)))


async def health(request: Request) -> Response:
    oars = shared(request)
    service = oars.service
    busy = {model: engine.busy for model, engine in service.engines.items()}
    body = api.Health(
        status="ok",
        model=service.default_model,
        busy=any(busy.values()),
        models=busy,
        running=oars.running,
    )
    return JSON(body.model_dump())


async def metrics(request: Request) -> Response:
    return Response(shared(request).metrics.render(), media_type=CONTENT_TYPE_LATEST)


async def openapi_json(request: Request) -> Response:
    return Response(document_bytes(ENDPOINTS), media_type="application/json")


async def docs(request: Request) -> Response:
    return HTMLResponse(docs_page(ENDPOINTS))


def _body(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


def _answer(
    path: str, status: int, body: dict[str, Any], headers: dict[str, str] | None = None
) -> JSON:
    """Every error answer of the app: OpenAI's body, or on the Messages routes Anthropic's
    (with the request id, in its body and in the `request-id` header the SDK reads)."""
    if not anthropic_path(path):
        return JSON(body, status_code=status, headers=headers)
    rid = logs.request_id.get()
    wire = error_body(status, body["error"]["message"], rid)
    return JSON(wire, status_code=status, headers={**(headers or {}), "request-id": rid or ""})


async def _client_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ClientError)
    return _answer(request.url.path, exc.status, exc.body(), exc.headers)


async def _engine_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, EngineError)
    log.error("engine error before streaming: %s", exc)
    return _answer(request.url.path, exc.status, exc.body())


async def _store_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StoreUnavailable)
    log.error("%s %s: %s", request.method, request.url.path, exc)
    return _answer(request.url.path, exc.status, exc.body())


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
    message = f"{request.method} {request.url.path}: {exc.detail}"
    body = _body(message, "invalid_request_error", code)
    return _answer(request.url.path, exc.status_code, body)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.exception("unhandled error", exc_info=exc)
    body = _body("internal server error", "server_error", "server_error")
    return _answer(request.url.path, 500, body)


_PAGE = [
    Param("after", "query", {"type": "string"}, "list after this id"),
    Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100}),
    Param("order", "query", {"type": "string", "enum": ["asc", "desc"]}),
]
_INCLUDE = Param(
    "include[]",
    "query",
    {"type": "array", "items": {"type": "string"}},
    "extra fields to include, e.g. reasoning.encrypted_content",
)
_RETRIEVE = [
    _INCLUDE,
    Param("stream", "query", {"type": "boolean"}, "replay the response's events"),
    Param(
        "starting_after",
        "query",
        {"type": "integer", "minimum": -1},
        "with stream: the sequence number to resume after",
    ),
]
_CONVERSATION_ITEM = "/v1/conversations/{conversation_id}/items/{item_id}"
_FILE = "/v1/files/{file_id}"
_FILES_PAGE = [
    Param("after", "query", {"type": "string"}, "list after this id"),
    Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 10000}),
    Param("order", "query", {"type": "string", "enum": ["asc", "desc"]}),
    Param("purpose", "query", {"type": "string"}, "only files of this purpose"),
]
R, CHAT, MSG, C, F, OPS = "responses", "chat", "messages", "conversations", "files", "operator"
EMB = "embeddings"
VS = "vector_stores"
_VS = "/v1/vector_stores/{vector_store_id}"
_VS_FILE = f"{_VS}/files/{{file_id}}"
_VS_BATCH = f"{_VS}/file_batches/{{batch_id}}"
_VS_PAGE = [*_PAGE, Param("before", "query", {"type": "string"}, "list before this id")]
_VS_FILES_PAGE = [
    *_VS_PAGE,
    Param(
        "filter",
        "query",
        {"type": "string", "enum": ["in_progress", "completed", "failed", "cancelled"]},
        "only files of this status",
    ),
]

ENDPOINTS = (
    Endpoint(
        "POST",
        "/v1/responses",
        responses.create,
        "Create a response (streamed when "
        "`stream` is true; over a WebSocket on the same path, `response.create` frames "
        "get one event per frame)",
        R,
        api.ResponseCreateParams,
        api.Response,
        streams=True,
    ),
    Endpoint(
        "POST",
        "/v1/responses/compact",
        responses.compact,
        "Compact a long history: "
        "recent user messages kept, the rest summarized into a sealed compaction item",
        R,
        api.CompactParams,
        api.CompactedResponse,
    ),
    Endpoint(
        "POST",
        "/v1/responses/input_tokens",
        responses.input_tokens,
        "Count a request's input tokens",
        R,
        api.InputTokenCountParams,
        api.InputTokenCountResponse,
    ),
    Endpoint(
        "GET",
        "/v1/responses/{response_id}",
        responses.retrieve,
        "Retrieve a stored response, or replay its events",
        R,
        returns=api.Response,
        streams=True,
        query=_RETRIEVE,
    ),
    Endpoint(
        "DELETE",
        "/v1/responses/{response_id}",
        responses.delete,
        "Delete a stored response",
        R,
        returns=api.ResponseDeleted,
    ),
    Endpoint(
        "POST",
        "/v1/responses/{response_id}/cancel",
        responses.cancel,
        "Cancel a background response",
        R,
        returns=api.Response,
    ),
    Endpoint(
        "GET",
        "/v1/responses/{response_id}/input_items",
        responses.input_items,
        "List a stored response's input items",
        R,
        returns=api.ResponseItemList,
        query=[*_PAGE, _INCLUDE],
    ),
    Endpoint(
        "POST",
        "/v1/chat/completions",
        chat.create,
        "Create a chat completion (streamed when `stream` is true): run as a response, "
        "never stored",
        CHAT,
        api.ChatCompletionCreateParams,
        api.ChatCompletion,
        streams=True,
        events=api.ChatCompletionChunk,
        done=True,
    ),
    Endpoint(
        "POST",
        "/v1/messages",
        messages.create,
        "Create a message, Anthropic's Messages API (streamed when `stream` is true): run as "
        "a response, never stored",
        MSG,
        api.MessageCreateParams,
        api.AnthropicMessage,
        streams=True,
        events=api.AnthropicStreamEvent,
        errors=api.AnthropicError,
    ),
    Endpoint(
        "POST",
        "/v1/messages/count_tokens",
        messages.count_tokens,
        "Count a Messages request's input tokens, as the model would see them",
        MSG,
        api.MessageCountTokensParams,
        api.MessageTokensCount,
        errors=api.AnthropicError,
    ),
    Endpoint(
        "POST",
        "/v1/conversations",
        conversations.create,
        "Create a conversation",
        C,
        api.ConversationCreateParams,
        api.Conversation,
    ),
    Endpoint(
        "GET",
        "/v1/conversations/{conversation_id}",
        conversations.retrieve,
        "Retrieve a conversation",
        C,
        returns=api.Conversation,
    ),
    Endpoint(
        "POST",
        "/v1/conversations/{conversation_id}",
        conversations.update,
        "Update a conversation's metadata",
        C,
        api.ConversationUpdateParams,
        api.Conversation,
    ),
    Endpoint(
        "DELETE",
        "/v1/conversations/{conversation_id}",
        conversations.delete,
        "Delete a conversation",
        C,
        returns=api.ConversationDeletedResource,
    ),
    Endpoint(
        "GET",
        "/v1/conversations/{conversation_id}/items",
        conversations.list_items,
        "List a conversation's items",
        C,
        returns=api.ConversationItemList,
        query=_PAGE,
    ),
    Endpoint(
        "POST",
        "/v1/conversations/{conversation_id}/items",
        conversations.add_items,
        "Add items to a conversation",
        C,
        api.ItemCreateParams,
        api.ConversationItemList,
    ),
    Endpoint(
        "GET",
        _CONVERSATION_ITEM,
        conversations.get_item,
        "Retrieve a conversation item",
        C,
        returns=api.ConversationItem,
    ),
    Endpoint(
        "DELETE",
        _CONVERSATION_ITEM,
        conversations.delete_item,
        "Delete a conversation item",
        C,
        returns=api.Conversation,
    ),
    Endpoint(
        "POST",
        "/v1/files",
        files.create,
        "Upload a file (multipart/form-data: `file`, `purpose`, `expires_after`), streamed to disk",
        F,
        api.FileUpload,
        api.FileObject,
        body_media="multipart/form-data",
    ),
    Endpoint(
        "GET",
        "/v1/files",
        files.list_files,
        "List files",
        F,
        returns=api.FileList,
        query=_FILES_PAGE,
    ),
    Endpoint("GET", _FILE, files.retrieve, "Retrieve a file", F, returns=api.FileObject),
    Endpoint(
        "GET",
        f"{_FILE}/content",
        files.content,
        "A file's bytes",
        F,
        returns="application/octet-stream",
    ),
    Endpoint("DELETE", _FILE, files.delete, "Delete a file", F, returns=api.FileDeleted),
    Endpoint(
        "POST",
        "/v1/embeddings",
        embeddings.create,
        "Embed texts as vectors, by the server's embedding model (`--embedding-model`)",
        EMB,
        api.EmbeddingCreateParams,
        api.EmbeddingList,
    ),
    Endpoint(
        "POST",
        "/v1/vector_stores",
        vector_stores.create,
        "Create a vector store (its `file_ids` are indexed in the background)",
        VS,
        api.VectorStoreCreateParams,
        api.VectorStore,
    ),
    Endpoint(
        "GET",
        "/v1/vector_stores",
        vector_stores.list_stores,
        "List vector stores",
        VS,
        returns=api.VectorStoreList,
        query=_VS_PAGE,
    ),
    Endpoint(
        "GET", _VS, vector_stores.retrieve, "Retrieve a vector store", VS, returns=api.VectorStore
    ),
    Endpoint(
        "POST",
        _VS,
        vector_stores.modify,
        "Modify a vector store's name, expiry or metadata",
        VS,
        api.VectorStoreUpdateParams,
        api.VectorStore,
    ),
    Endpoint(
        "DELETE",
        _VS,
        vector_stores.delete,
        "Delete a vector store (its files stay)",
        VS,
        returns=api.VectorStoreDeleted,
    ),
    Endpoint(
        "POST",
        f"{_VS}/search",
        vector_stores.search,
        "Search a vector store's chunks (keywords and vectors, fused)",
        VS,
        api.VectorStoreSearchParams,
        api.VectorStoreSearchPage,
    ),
    Endpoint(
        "POST",
        f"{_VS}/files",
        vector_stores.add_file,
        "Add a file to a vector store (indexed in the background)",
        VS,
        api.VectorStoreFileCreateParams,
        api.VectorStoreFile,
    ),
    Endpoint(
        "GET",
        f"{_VS}/files",
        vector_stores.list_files,
        "List a vector store's files",
        VS,
        returns=api.VectorStoreFileList,
        query=_VS_FILES_PAGE,
    ),
    Endpoint(
        "GET",
        _VS_FILE,
        vector_stores.retrieve_file,
        "Retrieve a vector store file",
        VS,
        returns=api.VectorStoreFile,
    ),
    Endpoint(
        "POST",
        _VS_FILE,
        vector_stores.update_file,
        "Update a vector store file's attributes",
        VS,
        api.VectorStoreFileUpdateParams,
        api.VectorStoreFile,
    ),
    Endpoint(
        "DELETE",
        _VS_FILE,
        vector_stores.delete_file,
        "Remove a file from a vector store (the file itself stays)",
        VS,
        returns=api.VectorStoreFileDeleted,
    ),
    Endpoint(
        "GET",
        f"{_VS_FILE}/content",
        vector_stores.file_content,
        "A vector store file's parsed text",
        VS,
        returns=api.VectorStoreFileContentPage,
    ),
    Endpoint(
        "POST",
        f"{_VS}/file_batches",
        vector_stores.create_batch,
        "Add a batch of files to a vector store",
        VS,
        api.VectorStoreFileBatchCreateParams,
        api.VectorStoreFileBatch,
    ),
    Endpoint(
        "GET",
        _VS_BATCH,
        vector_stores.retrieve_batch,
        "Retrieve a file batch",
        VS,
        returns=api.VectorStoreFileBatch,
    ),
    Endpoint(
        "POST",
        f"{_VS_BATCH}/cancel",
        vector_stores.cancel_batch,
        "Cancel a file batch (its files not yet indexed are cancelled)",
        VS,
        returns=api.VectorStoreFileBatch,
    ),
    Endpoint(
        "GET",
        f"{_VS_BATCH}/files",
        vector_stores.list_batch_files,
        "List a file batch's files",
        VS,
        returns=api.VectorStoreFileList,
        query=_VS_FILES_PAGE,
    ),
    Endpoint(
        "GET", "/v1/models", list_models, "List the models served", OPS, returns=api.ModelList
    ),
    Endpoint(
        "GET",
        "/v1/models/{model:path}",
        retrieve_model,
        "Retrieve a model served",
        OPS,
        returns=api.CatalogModel,
    ),
    Endpoint(
        "GET",
        "/health",
        health,
        "Liveness, and which models are generating",
        OPS,
        returns=api.Health,
    ),
    Endpoint(
        "GET", "/metrics", metrics, "Prometheus metrics", OPS, returns="text/plain; version=0.0.4"
    ),
    Endpoint(
        "GET", "/openapi.json", openapi_json, "This document", OPS, returns="application/json"
    ),
    Endpoint("GET", "/docs", docs, "This document as a page", OPS, returns="text/html"),
    Endpoint("GET", "/", pages.playground, "The playground page", OPS, returns="text/html"),
    Endpoint("GET", "/static/{name}", pages.static, "The playground's files", OPS, returns="*/*"),
    Endpoint(
        "GET",
        "/oars/responses",
        pages.recent,
        "The latest stored responses (for the playground)",
        OPS,
        returns=api.ResponseList,
        query=[Param("limit", "query", {"type": "integer", "minimum": 1, "maximum": 100})],
    ),
    Endpoint(
        "POST",
        "/oars/validate",
        pages.validate,
        "The stream validator's verdict on a stream of server-sent events",
        OPS,
        "text/event-stream",
        api.ValidationReport,
    ),
)
ROUTES = [endpoint.route() for endpoint in ENDPOINTS]
SOCKETS = [WebSocketRoute("/v1/responses", websocket.responses_socket)]


def default_replica(port: int | None = None) -> str:
    """A replica's name: stable across restarts of the same server, so that on startup it can
    fail what it left unfinished."""
    return (
        f"{socket.gethostname()}:{port}" if port is not None else f"replica-{secrets.token_hex(6)}"
    )


def create_app(
    service: ResponsesService,
    store: Store | None = None,
    *,
    settings: ServerSettings | None = None,
    metrics: Metrics | None = None,
    files: Path | None = None,
    embedder: Embedder | None = None,
) -> Starlette:
    """`store` None: nothing is kept (`store` is echoed false; stored-state endpoints 404).
    `settings` None: every field's default, and a replica name of its own. `metrics`: where
    the engines already report (`oars.serve.observe`), or None for a fresh registry. `files`:
    the folder of uploaded files' bytes (`OARS_HOME/files`), or None: the Files API is off
    (a 400), as it is without a store. `embedder`: the model `/v1/embeddings` runs and vector
    stores' chunks are embedded by (closed with the app), or None: that route is a 400 and
    vector stores are searched by keyword."""
    settings = settings or ServerSettings()
    limits = settings.limits
    metrics = metrics or Metrics()
    store = timed_store(store, metrics) if store is not None else None
    runs = Runs(
        service,
        store,
        replica=settings.replica or default_replica(),
        lease_seconds=settings.lease_seconds,
        metrics=metrics,
        concurrent_per_key=limits.concurrent_per_key,
        request_timeout=limits.request_timeout or None,
    )
    metrics.load = runs.load
    if service.toolboxes is not None:
        service.toolboxes.observe = metrics.mcp_call

    blobs = Blobs(files) if files is not None else None
    sweeper = (
        Sweeper(store, blobs, retention=settings.retention_days * 86_400)
        if store is not None and blobs is not None
        else None
    )
    ingester = (
        Ingester(store, blobs, embedder=embedder)
        if store is not None and blobs is not None
        else None
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        await runs.open()
        await service.open()
        for task in (sweeper, ingester):
            if task is not None:
                task.start()
        try:
            yield
        finally:
            for task in (sweeper, ingester):
                if task is not None:
                    await task.close()
            await runs.close()
            await service.aclose()
            if embedder is not None:
                embedder.close()
            if store is not None:
                await store.close()

    handlers = {
        ClientError: _client_error,
        EngineError: _engine_error,
        StoreUnavailable: _store_error,
        HTTPException: _http_error,
        Exception: _server_error,
    }
    app = Starlette(routes=[*ROUTES, *SOCKETS], exception_handlers=handlers, lifespan=lifespan)  # type: ignore[arg-type]
    app.state.oars = Shared(
        service, int(time.time()), metrics, limits, runs, blobs, embedder, ingester
    )
    if settings.api_keys:
        public = frozenset(f"/{name}" for name in settings.public)
        app.add_middleware(Auth, keys=settings.api_keys, public=public | _PAGES)
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
            access.info(
                "%s %s %d %.0f ms",
                method,
                path[:200],
                status,
                seconds * 1000,
                extra={
                    "method": method,
                    "path": path[:200],
                    "status": status,
                    "duration_ms": round(seconds * 1000, 1),
                },
            )
            logs.request_id.reset(token)


_PAGES = frozenset({"/", "/docs", "/openapi.json"})  # they hold no data: the key is typed in


def tenant(key: str) -> str:
    """The owner name stored with what a key makes: the key's hash, never the key."""
    return hashlib.sha256(key.encode()).hexdigest()[:32]


class Auth:
    """Plain ASGI middleware: with API keys, every route but the public ones needs
    `Authorization: Bearer KEY` or `x-api-key: KEY` (401 otherwise), and the request's tenant is its key's."""

    def __init__(self, app: ASGIApp, keys: Sequence[str], public: frozenset[str]) -> None:
        self.app, self.public = app, public
        self.tenants = {hashlib.sha256(k.encode()).digest(): tenant(k) for k in keys}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope["path"]
        if path in self.public or path.startswith("/static/"):
            return await self.app(scope, receive, send)
        given = _key(scope)
        found = self.tenants.get(hashlib.sha256(given.encode()).digest()) if given else None
        if found is None:
            message = (
                "Incorrect API key provided."
                if given
                else "You didn't provide an API key: send it as 'Authorization: Bearer KEY' "
                "or 'x-api-key: KEY'."
            )
            code = "invalid_api_key" if given else "missing_api_key"
            body = _answer(path, 401, _body(message, "invalid_request_error", code))
            body.headers["www-authenticate"] = "Bearer"
            if scope["type"] == "websocket":
                return await _deny(WebSocket(scope, receive, send), body)
            return await body(scope, receive, send)
        scope.setdefault("state", {})["tenant"] = found
        await self.app(scope, receive, send)


async def _deny(websocket: WebSocket, response: Response) -> None:
    """Refuse a handshake with an HTTP answer, or (a server without that extension) a close."""
    try:
        await websocket.send_denial_response(response)
    except RuntimeError:
        await websocket.close(code=1008, reason="unauthorized")


def _key(scope: Scope) -> str | None:
    """The API key: `Authorization: Bearer KEY`, or `x-api-key: KEY` (Anthropic's clients)."""
    for name, value in scope["headers"]:
        if name == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return str(token.strip())
        elif name == b"x-api-key" and value.strip():
            return str(value.decode("latin-1").strip())
    return None


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
