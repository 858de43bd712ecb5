"""What the operator says about MCP: its own servers, which request URLs may reach private
addresses, and the limits of a call.

`--mcp-server LABEL=URL` (repeatable) or `[[mcp_server]]` tables in a TOML file (`--mcp-servers
FILE`):

    [[mcp_server]]
    label = "vault"
    url = "http://10.0.0.5:9000/mcp"          # or: command = ["python", "-m", "vault_server"]
    headers_env = { Authorization = "VAULT_TOKEN" }   # header → environment variable
    env = { VAULT_MODE = "read" }              # for a command

A request names such a server by its label alone (`{"type": "mcp", "server_label": "vault"}`);
its URL, headers and command never leave the server, and it may be on any address.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from oars.errors import InvalidRequest
from oars.mcp.client import Endpoint
from oars.mcp.guard import Reach, Refused
from oars.mcp.limits import Limits
from oars.mcp.servers import LABEL, McpServer

MAX_ROUNDS = 10  # generations in one response, at most, when server-side tools run


@dataclass(frozen=True)
class OperatorServer:
    """An MCP server the operator configured: a URL, or a command speaking MCP on stdio."""

    label: str
    url: str | None = None
    command: tuple[str, ...] = ()
    env: Mapping[str, str] | None = None
    headers_env: Mapping[str, str] = field(default_factory=dict)  # header → env variable

    def endpoint(self) -> Endpoint:
        headers = {name: os.environ.get(var, "") for name, var in self.headers_env.items()}
        return Endpoint(self.label, self.url, headers, self.command, self.env, trusted=True)


def server_arg(text: str) -> OperatorServer:
    """`LABEL=URL` (the `--mcp-server` option)."""
    label, eq, url = text.partition("=")
    if not eq or not LABEL.fullmatch(label) or urlsplit(url).scheme not in ("http", "https"):
        raise ValueError(f"expected LABEL=URL (a label of letters, digits, _ or -), got {text!r}")
    return OperatorServer(label, url)


def load_servers(path: str) -> list[OperatorServer]:
    """The `[[mcp_server]]` tables of a TOML file."""
    with open(path, "rb") as f:
        tables = tomllib.load(f).get("mcp_server", [])
    return [_table(table, f"{path}: mcp_server #{i + 1}") for i, table in enumerate(tables)]


def _table(table: Mapping[str, object], where: str) -> OperatorServer:
    known = {"label", "url", "command", "env", "headers_env"}
    label, url, command = table.get("label"), table.get("url"), table.get("command")
    if set(table) - known or not isinstance(label, str) or not LABEL.fullmatch(label):
        raise ValueError(f"{where}: needs a label and knows only {', '.join(sorted(known))}")
    if (url is None) == (command is None):
        raise ValueError(f"{where}: give either url or command")
    if command is not None and (
        not isinstance(command, list) or not command or not all(isinstance(c, str) for c in command)
    ):
        raise ValueError(f"{where}: command is a list of strings")
    return OperatorServer(
        label,
        url if isinstance(url, str) else None,
        tuple(command or ()),  # type: ignore[arg-type]
        _strings(table.get("env"), f"{where}: env"),
        _strings(table.get("headers_env"), f"{where}: headers_env") or {},
    )


def _strings(value: object, where: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise ValueError(f"{where} is a table of strings")
    return {str(k): v for k, v in value.items()}


@dataclass(frozen=True)
class McpConfig:
    """The operator's servers, the URLs allowed beyond public addresses, and the limits."""

    servers: Mapping[str, OperatorServer] = field(default_factory=dict)
    reach: Reach = field(default_factory=Reach)
    limits: Limits = field(default_factory=Limits)
    max_rounds: int = MAX_ROUNDS

    @classmethod
    def of(
        cls,
        servers: Sequence[OperatorServer] = (),
        allow: Sequence[str] = (),
        max_rounds: int = MAX_ROUNDS,
        **limits: Any,
    ) -> McpConfig:
        """`limits`: the fields of `Limits`."""
        by_label = {s.label: s for s in servers}
        if len(by_label) != len(servers):
            raise ValueError("two MCP servers have one label")
        return cls(by_label, Reach(allow), Limits(**limits), max_rounds)

    @property
    def labels(self) -> frozenset[str]:
        return frozenset(self.servers)

    def endpoint(self, server: McpServer) -> Endpoint:
        """Where a request's server is: its URL, or the operator's server of its label."""
        if server.url is None:
            return self.servers[server.label].endpoint()
        # every request to it is checked (and allowed by `--mcp-allow` on its own)
        return Endpoint(server.label, server.url, server.http_headers())

    async def check(self, server: McpServer) -> None:
        """A 400 for a request URL that reaches an address it may not."""
        if server.url is None:
            return
        try:
            await self.reach.check(server.url)
        except Refused as exc:
            raise InvalidRequest(
                f"Invalid '{server.param}.server_url': {exc}.", param=f"{server.param}.server_url"
            ) from exc
