"""The `mcp` tool of a request: the server it names, which of its tools the model may call, and
which calls wait for the client's approval.

`{"type": "mcp", "server_label", "server_url", "authorization", "headers", "allowed_tools",
"require_approval", "server_description"}`, as OpenAI defines it. Without `require_approval`
every call waits for approval (OpenAI's default). `authorization` and `headers` live in memory
for the one request: they are never echoed, stored or logged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from oars.errors import InvalidRequest

LABEL = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_FILTER_KEYS = frozenset({"tool_names", "read_only"})


@dataclass(frozen=True)
class ToolFilter:
    """`{tool_names, read_only}`: a tool matches when it is among the names (if given) and its
    read-only hint is the one asked for (if asked); an empty filter matches every tool."""

    names: frozenset[str] | None = None
    read_only: bool | None = None

    def matches(self, name: str, read_only: bool) -> bool:
        named = self.names is None or name in self.names
        return named and (self.read_only is None or self.read_only == read_only)


EVERY = ToolFilter()


@dataclass(frozen=True)
class McpServer:
    """One `mcp` tool. `url` None: the operator's server of that label."""

    label: str
    url: str | None = None
    authorization: str | None = field(default=None, repr=False)
    headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    allowed: ToolFilter = EVERY
    always: ToolFilter | None = EVERY  # calls that wait for approval …
    never: ToolFilter | None = None  # … unless they match this (and not `always`)
    description: str | None = None
    param: str = "tools"  # where the request named it
    deferred: bool = False  # its tools are listed, and offered once a tool search finds them

    def allows(self, name: str, read_only: bool) -> bool:
        return self.allowed.matches(name, read_only)

    def needs_approval(self, name: str, read_only: bool) -> bool:
        if self.always is not None and self.always.matches(name, read_only):
            return True
        return not (self.never is not None and self.never.matches(name, read_only))

    def http_headers(self) -> dict[str, str]:
        """What goes to the server with every request: the client's headers and its token."""
        headers = dict(self.headers)
        if self.authorization:
            headers["Authorization"] = f"Bearer {self.authorization}"
        return headers


@dataclass(frozen=True)
class McpChoice:
    """`tool_choice: {"type": "mcp", "server_label", "name"?}`: the reply calls that server's
    tool (any of its tools without a name)."""

    label: str
    name: str | None = None


def _fail(message: str, param: str) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def _filter(raw: Any, param: str) -> ToolFilter:
    if isinstance(raw, list):
        return ToolFilter(names=frozenset(_names(raw, param)))
    if not isinstance(raw, dict) or set(raw) - _FILTER_KEYS:
        raise _fail(
            f"Invalid '{param}': expected a list of tool names or an object with "
            "'tool_names' and 'read_only'.",
            param,
        )
    names, read_only = raw.get("tool_names"), raw.get("read_only")
    if read_only is not None and not isinstance(read_only, bool):
        raise _fail(f"Invalid '{param}.read_only': expected a boolean.", f"{param}.read_only")
    named = None if names is None else frozenset(_names(names, f"{param}.tool_names"))
    return ToolFilter(named, read_only)


def _names(raw: Any, param: str) -> list[str]:
    if not isinstance(raw, list) or not all(isinstance(n, str) and n for n in raw):
        raise _fail(f"Invalid '{param}': expected a list of tool names.", param)
    return raw


def _approval(raw: Any, param: str) -> tuple[ToolFilter | None, ToolFilter | None]:
    """`require_approval` → (always, never)."""
    if raw is None or raw == "always":
        return EVERY, None
    if raw == "never":
        return None, EVERY
    if not isinstance(raw, dict) or not raw or set(raw) - {"always", "never"}:
        raise _fail(
            f"Invalid '{param}': expected 'always', 'never' or an object with 'always' "
            "and 'never' filters.",
            param,
        )
    always = raw.get("always")
    never = raw.get("never")
    return (
        None if always is None else _filter(always, f"{param}.always"),
        None if never is None else _filter(never, f"{param}.never"),
    )


def _url(raw: Any, param: str) -> str:
    if not isinstance(raw, str) or not raw:
        raise _fail(f"Invalid '{param}': expected an http or https URL.", param)
    parts = urlsplit(raw)
    try:
        parts.port  # noqa: B018 (raises for a port that is not a number)
    except ValueError:
        raise _fail(f"Invalid '{param}': the port is not a number.", param) from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _fail(f"Invalid '{param}': expected an http or https URL with a host.", param)
    return raw


_HEADER_NAME = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]{1,256}")
_HEADER_VALUE = re.compile(r"[\t\x20-\x7e]{0,8192}")  # what HTTP/1.1 may carry as it is
_TOKEN = re.compile(r"[\x21-\x7e]{1,8192}")


def _headers(raw: Any, param: str) -> dict[str, str]:
    """Header names and values HTTP can carry; the 400 for one that cannot names the header,
    never its value."""
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in raw.items()
    ):
        raise _fail(f"Invalid '{param}': expected an object of header names and strings.", param)
    for name, value in raw.items():
        if not _HEADER_NAME.fullmatch(name):
            raise _fail(f"Invalid '{param}': a header name must be an HTTP token.", param)
        if not _HEADER_VALUE.fullmatch(value):
            raise _fail(
                f"Invalid '{param}.{name}': a header value must be printable ASCII.",
                f"{param}.{name}",
            )
    if any(k.lower() == "authorization" for k in raw):
        raise _fail(
            f"Invalid '{param}': send the token as 'authorization', not as a header.", param
        )
    return raw


_UNSUPPORTED = {
    "connector_id": "OpenAI's hosted connectors do not exist on this server; give the MCP "
    "server's 'server_url' instead",
    "tunnel_id": "Secure MCP Tunnels do not exist on this server; give the MCP server's "
    "'server_url' instead",
}


def parse_server(
    raw: Mapping[str, Any], param: str, configured: frozenset[str], searching: bool = False
) -> McpServer:
    """One `mcp` tool of `tools`, as `tools[i]` (`configured`: the operator's server labels,
    which a request may name without a URL; `searching`: the request has this server's tool
    search, which finds the tools of a deferred server)."""
    for key, why in _UNSUPPORTED.items():
        if raw.get(key) is not None:
            raise _fail(f"Invalid '{param}.{key}': {why}.", f"{param}.{key}")
    deferred = raw.get("defer_loading")
    if deferred is not None and not isinstance(deferred, bool):
        raise _fail(
            f"Invalid '{param}.defer_loading': expected a boolean.", f"{param}.defer_loading"
        )
    if deferred and not searching:
        raise _fail(
            f"Invalid '{param}.defer_loading': an MCP server's tools are deferred for this "
            'server\'s tool search to find; add {"type": "tool_search"} to \'tools\'.',
            f"{param}.defer_loading",
        )
    label = raw.get("server_label")
    if not isinstance(label, str) or not LABEL.fullmatch(label):
        raise _fail(
            f"Invalid '{param}.server_label': expected 1 to 64 letters, digits, "
            "underscores or dashes.",
            f"{param}.server_label",
        )
    url = raw.get("server_url")
    if url is None and label not in configured:
        raise _fail(
            f"Missing '{param}.server_url': no MCP server is configured on this server "
            f"with the label {label!r}.",
            f"{param}.server_url",
        )
    authorization = raw.get("authorization")
    if authorization is not None and (
        not isinstance(authorization, str)
        or (authorization and not _TOKEN.fullmatch(authorization))
    ):
        raise _fail(
            f"Invalid '{param}.authorization': expected a token of printable ASCII without spaces.",
            f"{param}.authorization",
        )
    description = raw.get("server_description")
    if description is not None and not isinstance(description, str):
        raise _fail(
            f"Invalid '{param}.server_description': expected a string.",
            f"{param}.server_description",
        )
    allowed = raw.get("allowed_tools")
    always, never = _approval(raw.get("require_approval"), f"{param}.require_approval")
    return McpServer(
        label=label,
        url=None if url is None else _url(url, f"{param}.server_url"),
        authorization=authorization or None,
        headers=_headers(raw.get("headers"), f"{param}.headers"),
        allowed=EVERY if allowed is None else _filter(allowed, f"{param}.allowed_tools"),
        always=always,
        never=never,
        description=description,
        param=param,
        deferred=bool(deferred),
    )


def parse_servers(
    tools: Sequence[Any], configured: frozenset[str] = frozenset()
) -> tuple[McpServer, ...]:
    """The `mcp` tools of `tools` (400 for two of one label, or one deferred without this
    server's tool search to find its tools)."""
    servers: list[McpServer] = []
    searching = any(
        isinstance(t, dict) and t.get("type") == "tool_search" and t.get("execution") != "client"
        for t in tools
    )
    for i, raw in enumerate(tools):
        if isinstance(raw, dict) and raw.get("type") == "mcp":
            server = parse_server(raw, f"tools[{i}]", configured, searching)
            if any(s.label == server.label for s in servers):
                raise _fail(
                    f"Invalid 'tools[{i}].server_label': {server.label!r} names two MCP tools.",
                    f"tools[{i}].server_label",
                )
            servers.append(server)
    return tuple(servers)


def parse_choice(choice: Any, servers: Sequence[McpServer]) -> McpChoice | None:
    """`tool_choice` of type `mcp` (None for any other choice). Without a `server_label` (the
    AI SDK and the Agents SDK send `{"type": "mcp"}`), the request's only MCP server."""
    if not isinstance(choice, dict) or choice.get("type") != "mcp":
        return None
    label, name = choice.get("server_label"), choice.get("name")
    if label is None and len(servers) == 1:
        label = servers[0].label
    if not any(s.label == label for s in servers):
        raise _fail(
            f"Invalid 'tool_choice.server_label': no MCP tool in 'tools' has the label {label!r}."
            if label is not None or not servers
            else "Missing 'tool_choice.server_label': the request has several MCP tools.",
            "tool_choice.server_label",
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise _fail("Invalid 'tool_choice.name': expected a tool name.", "tool_choice.name")
    return McpChoice(str(label), name)


def echo(raw: Mapping[str, Any]) -> dict[str, Any]:
    """The tool as a response shows it: no `authorization`, no header values, and the URL
    without its credentials or query."""
    shown = {k: v for k, v in raw.items() if k not in ("authorization", "headers")}
    shown["headers"] = None
    if isinstance(raw.get("server_url"), str):
        shown["server_url"] = public_url(raw["server_url"])
    return shown


def public_url(url: str) -> str:
    """`url` as it may be shown, stored or logged: its scheme, host and port (as OpenAI keeps
    only the scheme and domain; a path may hold a secret as well as a query may)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{host}:{parts.port}" if parts.port is not None else host
    return urlunsplit((parts.scheme, netloc, "", "", ""))
