"""One MCP server for one response, through the official `mcp` SDK's client.

Streamable HTTP first; SSE where the URL's path ends in `/sse`, or where the server does not
answer streamable HTTP; stdio for a server the operator configured with a command. A response
opens one session per server it uses, on first use, and closes it when it ends.

The SDK's client runs task groups that must be left by the task that entered them, so each
session lives in a task of its own; calls are made from the response's task, each under its
own timeout, and a cancelled response simply stops waiting (its session then closes).

Every failure becomes the error object of an `mcp_call` (`McpFailure.error`): the server's
JSON-RPC errors as `mcp_protocol_error`, a tool's `isError` result as
`mcp_tool_execution_error` with its content, and everything on the way (refused connections,
HTTP statuses, timeouts) as `http_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pydantic
from mcp import Client
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from oars.mcp.guard import PinnedTransport, Reach, Refused
from oars.mcp.limits import Limits

log = logging.getLogger("oars.mcp")

Json = dict[str, Any]
_MAX_PAGES = 20  # of a tool listing
_CLOSE_SECONDS = 5.0
SSE_IDLE_SECONDS = 3600.0  # an SSE session waits for the model's next call, which may be slow


@dataclass(frozen=True)
class Endpoint:
    """Where a server is: a URL (with the headers every request carries), or a command that
    speaks MCP on its stdin and stdout."""

    label: str
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    command: tuple[str, ...] = ()
    env: Mapping[str, str] | None = field(default=None, repr=False)
    trusted: bool = False  # the operator's: reached wherever it is


class McpFailure(Exception):
    """A listing or a call that did not succeed; `error` is the `mcp_call` error object."""

    def __init__(self, error: Json) -> None:
        super().__init__(error.get("message") or json.dumps(error.get("content")))
        self.error = error


def http_error(code: int, message: str) -> Json:
    return {"type": "http_error", "code": code, "message": message}


def protocol_error(code: int, message: str) -> Json:
    return {"type": "mcp_protocol_error", "code": code, "message": message}


def _leaf(exc: BaseException) -> BaseException:
    """The first error inside the SDK's task-group exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def failure(exc: BaseException, timeout: float) -> McpFailure:
    """What went wrong, as an `mcp_call` error."""
    exc = _leaf(exc)
    if isinstance(exc, McpFailure):
        return exc
    if isinstance(exc, TimeoutError | httpx2.TimeoutException):
        return McpFailure(http_error(504, f"the MCP server did not answer within {timeout:g} s"))
    if isinstance(exc, Refused):
        return McpFailure(http_error(403, str(exc)))
    if isinstance(exc, httpx2.HTTPStatusError):
        status = exc.response.status_code
        return McpFailure(http_error(status, f"the MCP server answered HTTP {status}"))
    if isinstance(exc, httpx2.ConnectError | ConnectionError):
        return McpFailure(http_error(502, "could not connect to the MCP server"))
    if isinstance(exc, httpx2.TransportError):  # its text may quote what was sent: not shown
        return McpFailure(
            http_error(502, f"the connection to the MCP server failed ({_kind(exc)})")
        )
    if isinstance(exc, OSError):  # resolving the host (the message is oars's own)
        return McpFailure(http_error(502, f"could not reach the MCP server: {_said(exc)}"))
    if isinstance(exc, MCPError):
        return McpFailure(protocol_error(exc.error.code, exc.error.message))
    if isinstance(exc, pydantic.ValidationError | ValueError):
        return McpFailure(protocol_error(-32700, "the MCP server's answer is not valid MCP"))
    log.warning("MCP client error", exc_info=exc)
    return McpFailure(protocol_error(-32603, f"the MCP client failed: {type(exc).__name__}"))


def _kind(exc: BaseException) -> str:
    return type(exc).__name__


def _said(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    return text.splitlines()[0][:300]


def listed_tool(tool: Any) -> Json:
    """An MCP tool as `mcp_list_tools` shows it (its `readOnlyHint` as `read_only`)."""
    annotations = getattr(tool, "annotations", None)
    read_only = bool(annotations is not None and annotations.read_only_hint)
    listed = {"name": tool.name, "input_schema": tool.input_schema}
    if tool.description is not None:  # absent, not null: clients' schemas say so
        listed["description"] = tool.description
    return {**listed, "annotations": {"read_only": read_only}}


def output_of(result: Any, limit: int) -> str:
    """A tool's result as the text the model reads: text blocks as they are, other blocks as
    JSON, the structured content when there is nothing else; at most `limit` characters."""
    parts = [
        block.text
        if getattr(block, "type", None) == "text"
        else json.dumps(block.model_dump(mode="json", by_alias=True, exclude_none=True))
        for block in result.content
    ]
    if not parts and result.structured_content is not None:
        parts.append(json.dumps(result.structured_content, ensure_ascii=False))
    text = "\n".join(parts)
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n[… {len(text) - limit} more characters left out]"


def _content(result: Any, limit: int) -> list[Json]:
    """A failed call's content blocks, as the server sent them, or (past `limit` characters of
    JSON) its text cut to `limit`."""
    content: list[Json] = [block.model_dump(mode="json") for block in result.content]
    if len(json.dumps(content)) <= limit:
        return content
    return [{"type": "text", "text": output_of(result, limit), "annotations": None, "meta": None}]


class Session:
    """One server, for one response: connected on first use, closed by `close()`."""

    def __init__(self, endpoint: Endpoint, reach: Reach, limits: Limits) -> None:
        self.endpoint, self.reach, self.limits = endpoint, reach, limits
        self._task: asyncio.Task[None] | None = None
        self._ready: asyncio.Future[Client] | None = None
        self._closing = asyncio.Event()

    async def list_tools(self) -> list[Json]:
        """The server's tools, every page of them."""
        timeout = self.limits.list_seconds
        try:
            async with asyncio.timeout(timeout):
                client = await self._client()
                tools: list[Json] = []
                cursor: str | None = None
                for _ in range(_MAX_PAGES):
                    page = await client.list_tools(cursor=cursor, cache_mode="refresh")
                    tools += [listed_tool(t) for t in page.tools]
                    cursor = page.next_cursor
                    if cursor is None:
                        break
                return tools
        except Exception as exc:
            raise failure(exc, timeout) from exc

    async def call(self, name: str, arguments: Json) -> str:
        """Run a tool: its output, or `McpFailure`."""
        timeout = self.limits.call_seconds
        try:
            async with asyncio.timeout(timeout):
                client = await self._client()
                result = await client.call_tool(name, arguments, read_timeout_seconds=timeout)
        except Exception as exc:
            raise failure(exc, timeout) from exc
        if result.is_error:
            content = _content(result, self.limits.max_output_chars)
            raise McpFailure({"type": "mcp_tool_execution_error", "content": content})
        return output_of(result, self.limits.max_output_chars)

    async def close(self) -> None:
        self._closing.set()
        task = self._task
        if task is None:
            return
        done, _ = await asyncio.wait([task], timeout=_CLOSE_SECONDS)
        if not done:
            task.cancel()
            await asyncio.wait([task], timeout=_CLOSE_SECONDS)

    # ---- the session's own task ---------------------------------------------------------

    async def _client(self) -> Client:
        if self._ready is None:
            self._ready = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._serve(self._ready), name="mcp session")
        seconds = self.limits.connect_seconds
        try:
            async with asyncio.timeout(seconds):
                return await asyncio.shield(self._ready)
        except TimeoutError:
            if self._task is not None:
                self._task.cancel()
            message = f"the MCP server did not complete its handshake within {seconds:g} s"
            raise McpFailure(http_error(504, message)) from None

    async def _serve(self, ready: asyncio.Future[Client]) -> None:
        attempts = self._attempts()
        for i, attempt in enumerate(attempts):
            try:
                async with contextlib.AsyncExitStack() as stack:
                    transport = await attempt(stack)
                    client = Client(transport, read_timeout_seconds=self.limits.call_seconds)
                    ready.set_result(await stack.enter_async_context(client))
                    await self._closing.wait()
                    return
            except BaseException as exc:  # the task's boundary: the waiter gets the error
                if ready.done():
                    log.debug("MCP session to %s ended: %r", self.endpoint.label, _leaf(exc))
                    return
                if i + 1 < len(attempts) and _not_streamable(exc):
                    continue
                ready.set_exception(exc if isinstance(exc, Exception) else TimeoutError())
                return

    def _attempts(self) -> list[Callable[[contextlib.AsyncExitStack], Awaitable[Any]]]:
        """The transports to try, in order."""
        e = self.endpoint
        if e.command:
            return [self._stdio]
        assert e.url is not None
        if urlsplit(e.url).path.rstrip("/").endswith("/sse"):
            return [self._sse]
        return [self._streamable, self._sse]

    async def _stdio(self, stack: contextlib.AsyncExitStack) -> Any:
        e = self.endpoint
        env = dict(e.env) if e.env is not None else None
        return stdio_client(
            StdioServerParameters(command=e.command[0], args=[*e.command[1:]], env=env)
        )

    async def _streamable(self, stack: contextlib.AsyncExitStack) -> Any:
        assert self.endpoint.url is not None
        http = await stack.enter_async_context(self._http())
        return streamable_http_client(self.endpoint.url, http_client=http)

    async def _sse(self, stack: contextlib.AsyncExitStack) -> Any:
        assert self.endpoint.url is not None
        return sse_client(
            self.endpoint.url,
            timeout=self.limits.connect_seconds,
            sse_read_timeout=SSE_IDLE_SECONDS,
            httpx_client_factory=self._http,
        )

    def _http(
        self,
        headers: dict[str, str] | None = None,
        timeout: httpx2.Timeout | None = None,
        auth: httpx2.Auth | None = None,
    ) -> httpx2.AsyncClient:
        """An HTTP client to the server, on the pinned transport, with its headers (the SDK's
        client factory; it passes no `auth` of its own here)."""
        timeout = timeout or httpx2.Timeout(
            self.limits.connect_seconds, read=self.limits.call_seconds
        )
        headers = {**(headers or {}), **self.endpoint.headers}
        transport = PinnedTransport(self.reach, trusted=self.endpoint.trusted)
        return httpx2.AsyncClient(headers=headers, timeout=timeout, transport=transport, auth=auth)


def _not_streamable(exc: BaseException) -> bool:
    """A server that does not speak streamable HTTP refuses it with an error answer."""
    return isinstance(_leaf(exc), MCPError | httpx2.HTTPStatusError)
