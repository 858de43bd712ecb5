"""Which addresses an MCP server that a request names may reach.

A URL a request supplies reaches public addresses only: loopback, private ranges, link-local
and the other special-purpose blocks are refused, or any request could make this server reach
its own network (server-side request forgery). The check is on the addresses the host resolves
to, and the connection goes to the very address that was checked, so a name that resolves
elsewhere a moment later is not followed. An operator allows more by URL prefix
(`--mcp-allow http://127.0.0.1:9000/`); servers the operator configures are trusted.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

import httpx2


class Refused(Exception):
    """The URL reaches an address this server may not connect to for a request."""


# IPv6 blocks that carry an IPv4 address a gateway may forward to (NAT64, 6to4, Teredo, the
# IPv4-compatible and -translated forms): refused whatever the address inside.
_EMBEDDING = tuple(
    ipaddress.ip_network(block)
    for block in (
        "64:ff9b::/96",
        "64:ff9b:1::/48",
        "2002::/16",
        "2001::/32",
        "::/96",
        "::ffff:0:0:0/96",
    )
)


def is_public(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif any(ip in block for block in _EMBEDDING):
            return False
    return ip.is_global and not ip.is_multicast


@dataclass(frozen=True)
class _Prefix:
    """An allowed URL prefix, compared by parts (a host that merely starts like it, or a
    prefix hidden in the userinfo, is not covered). Without a port, every port of the host."""

    scheme: str
    host: str
    port: int | None
    path: str

    @classmethod
    def of(cls, url: str) -> _Prefix:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"expected an http or https URL, got {url!r}")
        return cls(parts.scheme, parts.hostname.lower(), parts.port, parts.path)

    def covers(self, url: str) -> bool:
        """Same scheme and host (and port, if it has one), and a path under its path, whole
        segments: `/mcp` covers `/mcp` and `/mcp/x`, not `/mcpx`. A path with dot segments or
        encoded dots and slashes is covered by nothing (the server may read it elsewhere)."""
        other = _Prefix.of(url)
        ports = (_port(self.scheme, self.port), _port(other.scheme, other.port))
        base = self.path.rstrip("/")
        return (
            (self.scheme, self.host) == (other.scheme, other.host)
            and (self.port is None or ports[0] == ports[1])
            and not _DOTTED.search(other.path)
            and (other.path == base or other.path.startswith(base + "/"))
        )


_DOTTED = re.compile(r"(^|/)\.\.?(/|$)|%2e|%2f|%5c|\\", re.IGNORECASE)


def _port(scheme: str, port: int | None) -> int:
    return port if port is not None else (443 if scheme == "https" else 80)


class Reach:
    """The addresses request-named MCP servers may have, and the URLs allowed beyond them."""

    def __init__(self, allowed: Sequence[str] = ()) -> None:
        self.allowed = tuple(_Prefix.of(url) for url in allowed)

    def trusted(self, url: str) -> bool:
        """The operator allowed this URL to reach any address."""
        try:
            return any(prefix.covers(url) for prefix in self.allowed)
        except ValueError:
            return False

    async def address(self, host: str, port: int) -> str:
        """The address to connect to for `host`, once every address it has is checked."""
        loop = asyncio.get_running_loop()
        try:
            found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise OSError(f"cannot resolve {host!r}: {exc.strerror or exc}") from exc
        addresses = [str(info[4][0]) for info in found]
        if not addresses or not all(is_public(a) for a in addresses):
            raise Refused(
                f"{host!r} resolves to an address that is not public; this server "
                "reaches such addresses only for URLs its operator allows "
                "(--mcp-allow)"
            )
        return addresses[0]

    async def check(self, url: str) -> None:
        """Raise `Refused` for a URL that reaches a non-public address (DNS failures are left
        to the connection, which reports them)."""
        if self.trusted(url):
            return
        parts = urlsplit(url)
        host = parts.hostname or ""
        try:
            await self.address(host, _port(parts.scheme, parts.port))
        except OSError:
            return


class PinnedTransport(httpx2.AsyncHTTPTransport):
    """An HTTP transport that connects only where `reach` allows, to the address it checked:
    every request is checked (a redirect, or the SSE endpoint a server names, included), unless
    the server is the operator's (`trusted`)."""

    def __init__(self, reach: Reach, *, trusted: bool) -> None:
        super().__init__()
        self.reach, self.trusted = reach, trusted

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        if not self.trusted and not self.reach.trusted(str(request.url)):
            host = request.url.host
            address = await self.reach.address(host, _port(request.url.scheme, request.url.port))
            request.url = request.url.copy_with(host=address)
            request.extensions = {**request.extensions, "sni_hostname": host}
        return await super().handle_async_request(request)
