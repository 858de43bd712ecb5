"""An MCP server on loopback for `bench.mcp`: one tool, `open_vault`, over streamable HTTP.

python -m bench.vault PORT
"""

from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

WORD = "aubergine"

server = MCPServer("vault", instructions="A vault that holds one word.")


@server.tool()
def open_vault(code: str) -> str:
    """Open the vault with its four-digit code and read the word inside."""
    if code != "1234":
        raise ToolError(f"wrong code {code!r}: the vault stays shut")
    return f"The word inside the vault is {WORD}."


def main() -> None:
    port = int(sys.argv[1])
    uvicorn.run(server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main()
