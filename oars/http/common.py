"""What the route modules share: the app's state, JSON bodies, query parameters, list pages,
and a run read to its end (streamed or not) while its client listens."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse

from oars.blobs import Blobs
from oars.embeddings import Embedder
from oars.errors import EngineError, InvalidRequest, NotFound, RequestTimeout, TooLarge
from oars.events import Event
from oars.ids import is_id
from oars.metrics import Metrics
from oars.normalize import ResponseRequest, normalize
from oars.runs import RunHandle, Runs
from oars.service import ResponsesService
from oars.settings import Limits
from oars.store import Page, Reads, Vectors
from oars.tenancy import Tenant
from oars.tools import ignored_tools
from oars.turn import Turn

log = logging.getLogger("oars.http")


class Nudge(Protocol):
    def nudge(self) -> None: ...


@dataclass
class Shared:
    """What every handler may use. Runs and stored state only as one tenant sees them
    (`view`): a handler cannot reach another API key's."""

    service: ResponsesService
    started: int
    metrics: Metrics
    limits: Limits
    _runs: Runs
    blobs: Blobs | None = None  # uploaded files' bytes (`/v1/files`); None: no files kept
    embedder: Embedder | None = None  # `/v1/embeddings`' model; None: none is served
    ingester: Nudge | None = None  # what indexes files added to vector stores

    def vectors(self) -> Vectors | None:
        """Vector stores: every method takes the tenant whose they are (`tenant_of`)."""
        return self._runs.store

    def tenant(self, tenant: str) -> Tenant:
        return Tenant(self._runs, tenant)

    @property
    def keeps(self) -> bool:
        """Responses are stored (`store` defaults to true)."""
        return self._runs.store is not None

    @property
    def running(self) -> int:
        return len(self._runs.active)


class JSON(JSONResponse):
    """JSON as UTF-8, or ASCII-escaped when it holds a lone surrogate a client sent (which
    UTF-8 cannot carry): what was stored can always be read back."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except UnicodeEncodeError:
            return json.dumps(content, separators=(",", ":")).encode()


def shared(request: Request) -> Shared:
    state: Shared = request.app.state.oars
    return state


def path_id(request: Request, name: str) -> str:
    """An id from the path; one that cannot name anything stored is simply not found."""
    value: str = request.path_params[name]
    if not is_id(value):
        raise NotFound(f"No object with id {value!r}.", param=name)
    return value


def tenant_of(request: Request) -> str:
    """Whose the request is: its API key, hashed ('' when the server has no keys)."""
    return str(request.scope.get("state", {}).get("tenant", ""))


def create_request(oars: Shared, body: Any) -> ResponseRequest:
    """A create body, validated for this server (the HTTP and WebSocket transports both start
    here)."""
    service = oars.service
    search = service.toolboxes.web if service.toolboxes is not None else None
    web = search is not None
    request = normalize(
        body,
        served_model=service.default_model,
        default_temperature=service.default_temperature,
        max_output_tokens=oars.limits.max_output_tokens,
        can_store=oars.keeps,
        mcp_servers=service.toolboxes.labels if service.toolboxes else frozenset(),
        web_search=web,
        web_pages=search is not None and search.fetches,
        file_search=service.toolboxes is not None and service.toolboxes.files is not None,
    )
    for kind in [] if web else ignored_tools(request.echo["tools"]):
        oars.metrics.tool_ignored(kind)
        if kind not in _TOLD:
            _TOLD.add(kind)
            log.warning(
                "a request sent a %s tool; this server runs no web search (--web-search sets "
                "one), so the model is not offered one (said once; oars_tools_ignored_total "
                "counts them)",
                kind,
            )
    return request


_TOLD: set[str] = set()  # the ignored tool types already logged


async def open_turn(oars: Shared, request: ResponseRequest, store: Reads | None) -> Turn:
    """A request's turn, outside a run (to count its tokens)."""
    return await Turn.open(request, store, oars.service.unseal)


def view(request: Request) -> Tenant:
    """The runs and the store as the request's tenant sees them."""
    return shared(request).tenant(tenant_of(request))


def store_of(request: Request) -> Reads:
    """The store as the request's tenant sees it."""
    store = view(request).store
    if store is None:
        raise NotFound("This server keeps no stored state (it runs without a store).")
    return store


def error(
    status: int, message: str, type_: str, code: str | None, param: str | None = None
) -> JSON:
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return JSON(body, status_code=status)


async def read_body(request: Request) -> bytes:
    """The body, read no further than the server's limit (a 413 past it)."""
    limits = shared(request).limits
    limit = limits.max_body_bytes
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(limit)
    chunks, size = [], 0
    try:
        async with asyncio.timeout(limits.body_seconds):
            async for chunk in request.stream():
                size += len(chunk)
                if size > limit:
                    raise TooLarge(limit)
                chunks.append(chunk)
    except TimeoutError as exc:
        raise RequestTimeout(
            f"The request body did not arrive within {limits.body_seconds} s."
        ) from exc
    return b"".join(chunks)


async def read_json(request: Request) -> Any:
    return parse_json(await read_body(request))


def parse_json(raw: bytes) -> Any:
    """A JSON body or frame, as strictly as every route reads one (400 `invalid_json`)."""
    try:
        # UTF-8, strictly: json.loads(bytes) would also take UTF-16 and encoded surrogates
        value = json.loads(raw.decode("utf-8").removeprefix("\ufeff"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise InvalidRequest(
            f"The request body is not valid JSON: {exc}", param=None, code="invalid_json"
        ) from exc
    if b"\\ud" in raw or b"\\uD" in raw:  # only an escape can make a lone surrogate
        where = lone_surrogate(value)
        if where is not None:
            raise InvalidRequest(
                f"Invalid '{where}': the string holds a lone surrogate escape "
                "(\\ud800-\\udfff without its pair), which is not Unicode text.",
                param=where,
                code="invalid_unicode",
            )
    return value


def lone_surrogate(value: Any, path: str = "") -> str | None:
    """The path (`input[0].content[0].text`) of the first string or key holding a lone
    surrogate, or None."""
    if isinstance(value, str):
        return None if _encodable(value) else path or "body"
    if isinstance(value, list):
        for i, item in enumerate(value):
            found = lone_surrogate(item, f"{path}[{i}]")
            if found is not None:
                return found
    elif isinstance(value, dict):
        for key, item in value.items():
            here = f"{path}.{key}" if path else key
            if not _encodable(key):
                return path or "body"
            found = lone_surrogate(item, here)
            if found is not None:
                return found
    return None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def query_int(request: Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query_params.get(name)
    if raw is None:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = lo - 1
    if not lo <= value <= hi:
        raise InvalidRequest(
            f"Invalid '{name}': expected an integer from {lo} to {hi}.", param=name
        )
    return value


def query_choice(request: Request, name: str, allowed: tuple[str, ...], default: str) -> str:
    value = request.query_params.get(name, default)
    if value not in allowed:
        raise InvalidRequest(f"Invalid '{name}': expected one of {', '.join(allowed)}.", param=name)
    return value


def list_page(request: Request, default_order: str = "desc") -> dict[str, Any]:
    """`after`, `limit` (1-100, default 20) and `order` of a list endpoint."""
    return {
        "after": request.query_params.get("after"),
        "limit": query_int(request, "limit", 20, 1, 100),
        "order": query_choice(request, "order", ("asc", "desc"), default_order),
    }


def page_wire(page: Page) -> dict[str, Any]:
    data = page.items
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": page.has_more,
    }


async def follow_run(
    handle: RunHandle, keepalive: float | None, *, owns: bool
) -> AsyncIterator[list[Event]]:
    """A reader of the run's log; one that owns the run stops it when the client goes away."""
    try:
        async for batch in handle.batches(-1, keepalive):
            yield batch
    finally:
        if owns and not handle.done:
            log.info("client disconnected; generation stopped")
            handle.cancel()


async def finish_unless_disconnected(handle: RunHandle, request: Request) -> bool:
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


async def finished(handle: RunHandle, request: Request) -> dict[str, Any] | None:
    """A stateless front door's run read to its end: its final response, or None when the
    client went away (the engine stopped). A failed run raises its error: nothing was sent yet."""
    if not await finish_unless_disconnected(handle, request):
        return None
    response = handle.snapshot
    if response["status"] == "failed":
        raise handle.generation.error or EngineError(response["error"]["message"])
    return response


async def translated_stream(
    handle: RunHandle, keepalive: float | None, encode: Callable[[Event], bytes], idle: bytes
) -> AsyncIterator[bytes]:
    """A front door's stream: each batch of the run's events encoded in its wire form, one
    write per batch; `idle` while the run is silent."""
    async for batch in follow_run(handle, keepalive, owns=True):
        if not batch:
            yield idle
            continue
        data = b"".join(encode(event) for event in batch)
        if data:
            yield data
