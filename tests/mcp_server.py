"""A real MCP server for the tests, from the `mcp` package: `python -m tests.mcp_server
TRANSPORT [PORT]` with TRANSPORT `streamable-http`, `sse` or `stdio`.

Its tools: `add` and `echo` (annotated read-only), `open_vault` (the word inside for the code
1234, a tool error otherwise), `slow` (sleeps), `crash` (the process exits mid-call). Over HTTP
it also answers `GET /stats` (how many `tools/list` and `tools/call` requests it has had, and the
last `authorization` and `x-test` headers it saw) and `/garbage` (200 with a body that is not
JSON, as a broken server would).
"""

from __future__ import annotations

import json
import os
import sys
from collections import Counter
from typing import Any

import anyio
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

WORD = "aubergine"
READ_ONLY = ToolAnnotations(read_only_hint=True)

server = MCPServer("vault", instructions="A vault that holds one word.")


@server.tool(annotations=READ_ONLY)
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool(annotations=READ_ONLY)
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
def open_vault(code: str) -> str:
    """Open the vault with its four-digit code and read the word inside."""
    if code != "1234":
        raise ToolError(f"wrong code {code!r}: the vault stays shut")
    return f"The word inside the vault is {WORD}."


@server.tool()
async def slow(seconds: float) -> str:
    """Wait a while, then answer."""
    await anyio.sleep(seconds)
    return "finally"


@server.tool()
def crash() -> str:
    """Stop the server in the middle of the call."""
    os._exit(3)


class Counted:
    """The app, with `/stats` and `/garbage` beside it, counting the JSON-RPC methods posted."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.methods: Counter[str] = Counter()
        self.headers: dict[str, str] = {}

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if scope["path"] == "/stats":
            return await _answer(send, 200, {"methods": self.methods, "headers": self.headers})
        if scope["path"] == "/garbage":
            return await _answer(send, 200, None)
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.headers.update({k: headers[k] for k in ("authorization", "x-test") if k in headers})
        body = b""
        more = True
        while more and scope["method"] == "POST":
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        self._count(body)
        sent = False

        async def replay() -> Any:
            nonlocal sent
            if not sent and scope["method"] == "POST":
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    def _count(self, body: bytes) -> None:
        try:
            message = json.loads(body) if body else None
        except json.JSONDecodeError:
            return
        for one in message if isinstance(message, list) else [message]:
            if isinstance(one, dict) and isinstance(one.get("method"), str):
                self.methods[one["method"]] += 1


async def _answer(send: Any, status: int, value: Any) -> None:
    body = b"this is not JSON {" if value is None else json.dumps(value).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    transport = sys.argv[1]
    if transport == "stdio":
        server.run("stdio")
        return
    import uvicorn

    port = int(sys.argv[2])
    app = server.sse_app() if transport == "sse" else server.streamable_http_app()
    uvicorn.run(Counted(app), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
