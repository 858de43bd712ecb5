"""The backends `web_search` runs through, and the pages it opens: what the operator configures
with `--web-search KIND=TARGET`.

A search goes to the operator's own service, trusted wherever it is (SearXNG usually sits on
loopback or a private network): a SearXNG JSON API, a Brave- or Tavily-compatible HTTP API
(keyed by `OARS_WEB_SEARCH_KEY`, read once at startup and sent only to that API), or a tool on
one of the operator's MCP servers. A page is named by the model, so it is fetched as a
request-named MCP URL is: through `oars.mcp.guard`, which refuses loopback and private
addresses unless the operator allows a prefix (`--web-allow`), and re-checks every redirect.

Whatever goes wrong becomes `WebSearchFailed`, whose message the model reads: short, in our own
words, naming no more than the URL the model asked for (never the key, an error's text, or an
address a redirect led to).
"""

from __future__ import annotations

import asyncio
import html
import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urljoin, urlsplit

import httpx2

from oars.mcp.client import McpFailure, Session
from oars.mcp.config import McpConfig, OperatorServer
from oars.mcp.guard import PinnedTransport, Reach, Refused

KEY_VARIABLE = "OARS_WEB_SEARCH_KEY"
MAX_PAGE_BYTES = 2 * 2**20  # of a page read; the rest is never downloaded
MAX_REDIRECTS = 5
PAGE_TYPES = frozenset({"text/html", "application/xhtml+xml", "text/plain"})
_MAX_API_RESULTS = 20  # what Brave's and Tavily's APIs accept as a count
_CONTEXT = 200  # characters either side of a match, in `find_in_page`
_ACCEPT = {"accept": "text/html,application/xhtml+xml,text/plain;q=0.9", "user-agent": "oars"}
_TAG = re.compile(r"<[^>]*>")
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class Found:
    """One search result."""

    url: str
    title: str
    snippet: str


@dataclass(frozen=True)
class Page:
    """An opened page: where it ended up after redirects, and its main text."""

    url: str
    title: str
    text: str  # plain text: for HTML, the main text as trafilatura extracts it


class WebSearchFailed(Exception):
    """A search or fetch that failed: its message is what the model reads (no credentials, no
    internal addresses beyond the URL the model asked for)."""


def _clean(value: object) -> str:
    """A title or snippet as plain text: tags dropped (Brave marks matches with <strong>),
    entities decoded, whitespace collapsed."""
    if not isinstance(value, str):
        return ""
    return _SPACE.sub(" ", html.unescape(_TAG.sub("", value))).strip()


def _is_web(url: object) -> bool:
    try:
        return isinstance(url, str) and urlsplit(url).scheme in ("http", "https")
    except ValueError:  # not a URL at all, such as `http://[::1` (a bracket never closed)
        return False


def _results(items: Iterable[object], snippet_keys: Sequence[str]) -> list[Found]:
    """The results a backend listed: objects with an http(s) `url`, the snippet under the
    first of `snippet_keys` it has; anything else is dropped."""
    found = []
    for item in items:
        if isinstance(item, dict) and _is_web(item.get("url")):
            snippet = next((item[k] for k in snippet_keys if item.get(k)), "")
            found.append(Found(item["url"], _clean(item.get("title")), _clean(snippet)))
    return found


# ---- HTTP search APIs ---------------------------------------------------------------------------


class _Api:
    """An HTTP search API at the operator's URL: how a query is asked (`request`), and where
    its answer lists the results (under the keys `listed_at`, each with a `snippet`)."""

    name = ""
    listed_at: tuple[str, ...] = ("results",)
    snippet = "content"

    def __init__(self, url: str, key: str, timeout: float) -> None:
        self.url, self._key = url, key
        self.http = httpx2.AsyncClient(timeout=timeout)

    def request(self, query: str, count: int, location: Mapping[str, Any]) -> httpx2.Request:
        raise NotImplementedError

    async def search(self, query: str, count: int, location: Mapping[str, Any]) -> list[Found]:
        try:
            response = await self.http.send(self.request(query, count, location))
        except httpx2.TimeoutException:
            raise TimeoutError from None
        except httpx2.HTTPError as exc:  # its text may quote the request: not shown
            raise WebSearchFailed(
                f"could not reach the search backend ({type(exc).__name__})"
            ) from None
        if not response.is_success:
            raise WebSearchFailed(f"the search backend answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            raise WebSearchFailed("the search backend's answer is not JSON") from None
        for key in self.listed_at:  # an absent list is no results
            body = body.get(key) if isinstance(body, dict) else None
        if not isinstance(body, list | None):
            raise WebSearchFailed("the search backend's answer holds no list of results")
        return _results(body or [], (self.snippet,))

    async def aclose(self) -> None:
        await self.http.aclose()


class _Searxng(_Api):
    """SearXNG's JSON API (`format=json`, enabled in the instance's settings). It takes no
    count (we cut its page) and no location: its `language` is not where the user is."""

    name = "searxng"

    def request(self, query: str, count: int, location: Mapping[str, Any]) -> httpx2.Request:
        base = self.url.rstrip("/")
        url = base if base.endswith("/search") else f"{base}/search"
        return self.http.build_request("GET", url, params={"q": query, "format": "json"})


class _Brave(_Api):
    """Brave Search's web API, or one that speaks it; `country` from the user's location."""

    name = "brave"
    listed_at = ("web", "results")
    snippet = "description"

    def request(self, query: str, count: int, location: Mapping[str, Any]) -> httpx2.Request:
        params: dict[str, Any] = {"q": query, "count": min(count, _MAX_API_RESULTS)}
        country = location.get("country")
        if isinstance(country, str) and len(country) == 2:
            params["country"] = country
        headers = {"accept": "application/json", "x-subscription-token": self._key}
        return self.http.build_request("GET", self.url, params=params, headers=headers)


class _Tavily(_Api):
    """Tavily's search API, or one that speaks it (its `country` wants a country's English
    name, which a user location does not give: none is passed)."""

    name = "tavily"

    def request(self, query: str, count: int, location: Mapping[str, Any]) -> httpx2.Request:
        body = {"query": query, "max_results": min(count, _MAX_API_RESULTS)}
        headers = {"authorization": f"Bearer {self._key}"}
        return self.http.build_request("POST", self.url, json=body, headers=headers)


# ---- a tool on an operator's MCP server ---------------------------------------------------------


class _McpTool:
    """A search tool on one of the operator's MCP servers, called with `{"query": …}` (and
    the count and location fields its input schema names). One session per search: a search
    is rare beside the model's steps, and a session would outlive no response anyway."""

    name = "mcp"

    def __init__(self, server: OperatorServer, tool: str, config: McpConfig) -> None:
        self.server, self.tool, self.config = server, tool, config
        self._properties: frozenset[str] | None = None  # of the tool's input, once listed

    async def search(self, query: str, count: int, location: Mapping[str, Any]) -> list[Found]:
        session = Session(self.server.endpoint(), self.config.reach, self.config.limits)
        try:
            properties = self._properties
            if properties is None:
                properties = await self._schema(session)
            arguments: dict[str, Any] = {"query": query}
            arguments |= {k: count for k in ("max_results", "count") if k in properties}
            arguments |= {k: v for k, v in location.items() if k in properties and k != "type"}
            return _tool_results(await session.call(self.tool, arguments))
        except McpFailure as exc:
            raise WebSearchFailed(f"the search tool failed: {_said(exc)}") from None
        finally:
            await session.close()

    async def _schema(self, session: Session) -> frozenset[str]:
        tool = next((t for t in await session.list_tools() if t["name"] == self.tool), None)
        if tool is None:
            raise WebSearchFailed(f"the search backend has no tool {self.tool!r}")
        self._properties = frozenset(tool["input_schema"].get("properties") or ())
        return self._properties

    async def aclose(self) -> None:
        return None


def _said(failure: McpFailure) -> str:
    """What a failed call says: its message, or the text its tool gave."""
    content = failure.error.get("content") or []
    texts = [block.get("text") or "" for block in content if isinstance(block, dict)]
    return str(failure.error.get("message") or " ".join(texts).strip() or failure)


def _tool_results(text: str) -> list[Found]:
    """A search tool's output: JSON results (a list, an object with `results`, or one value
    per content block, as an MCP server returns a list), else one result of plain text."""
    items: list[object] = []
    for value in _json_values(text):
        if isinstance(value, dict) and isinstance(value.get("results"), list):
            items += value["results"]
        else:
            items += value if isinstance(value, list) else [value]
    if not items or not all(isinstance(item, dict) for item in items):
        return [Found("", "", text.strip())] if text.strip() else []
    return _results(items, ("content", "snippet", "description"))


def _json_values(text: str) -> list[Any]:
    """The JSON values `text` holds one after another, or none if it is not only JSON."""
    decoder, values, rest = json.JSONDecoder(), [], text.strip()
    while rest:
        try:
            value, end = decoder.raw_decode(rest)
        except ValueError:
            return []
        values.append(value)
        rest = rest[end:].lstrip()
    return values


_Backend = _Api | _McpTool

# ---- the service web_search runs through --------------------------------------------------------


class WebSearch:
    """The operator's search backend, and the pages the model may open through it."""

    def __init__(self, backend: _Backend, *, fetch: bool, reach: Reach, timeout: float) -> None:
        self.backend_name: str = backend.name
        self.fetches = fetch  # the operator lets the model open pages at all
        self.timeout = timeout
        self._backend = backend
        transport = PinnedTransport(reach, trusted=False)  # the model names the URLs
        self._pages = httpx2.AsyncClient(transport=transport, timeout=timeout)

    async def search(
        self, query: str, count: int, location: Mapping[str, Any] | None = None
    ) -> list[Found]:
        """At most `count` results; `location` (a request's `user_location`) goes where the
        backend takes one."""
        try:
            async with asyncio.timeout(self.timeout):
                found = await self._backend.search(query, count, location or {})
        except TimeoutError:
            raise WebSearchFailed(
                f"the search backend did not answer within {self.timeout:g} s"
            ) from None
        return found[:count]

    async def open_page(self, url: str, max_chars: int) -> Page:
        """The page's title and first `max_chars` characters of main text."""
        if not self.fetches:
            raise WebSearchFailed("this server does not open pages")
        try:
            async with asyncio.timeout(self.timeout):
                page = await self._download(url)
        except (TimeoutError, httpx2.TimeoutException):
            raise WebSearchFailed(f"{url} did not load within {self.timeout:g} s") from None
        except Refused:
            raise WebSearchFailed(
                f"{url} is not on a public address; this server opens such pages only where "
                "its operator allows (--web-allow)"
            ) from None
        except (httpx2.HTTPError, httpx2.InvalidURL, OSError, ValueError) as exc:
            raise WebSearchFailed(f"could not load {url} ({_why(exc)})") from None
        title, text = await asyncio.to_thread(_readable, page)
        return Page(page.url, title, text[:max_chars])

    async def _download(self, asked: str) -> _Download:
        """The page at `asked`, redirects followed here (each a request the guard checks, to
        the host it names: the transport pins the address it resolved)."""
        url = asked
        for _ in range(MAX_REDIRECTS + 1):
            if not _is_web(url):
                raise WebSearchFailed(f"{asked} does not lead to an http or https URL")
            async with self._pages.stream("GET", url, headers=_ACCEPT) as response:
                if not response.is_redirect:
                    return await _read(asked, url, response)
                url = urljoin(url, response.headers["location"])
        raise WebSearchFailed(f"{asked} redirects more than {MAX_REDIRECTS} times")

    async def aclose(self) -> None:
        await self._backend.aclose()
        await self._pages.aclose()


@dataclass(frozen=True)
class _Download:
    url: str
    kind: str  # the content type, without parameters
    charset: str | None
    data: bytes = field(repr=False)


async def _read(asked: str, url: str, response: httpx2.Response) -> _Download:
    """A page's body, if it is one oars reads, up to `MAX_PAGE_BYTES`."""
    if not response.is_success:
        raise WebSearchFailed(f"{asked} answered HTTP {response.status_code}")
    kind = response.headers.get("content-type", "").partition(";")[0].strip().lower()
    if kind not in PAGE_TYPES:
        raise WebSearchFailed(
            f"{asked} is not a page oars can read (content type {kind or 'none'})"
        )
    data = bytearray()
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= MAX_PAGE_BYTES:
            break
    return _Download(url, kind, response.charset_encoding, bytes(data[:MAX_PAGE_BYTES]))


def _why(exc: BaseException) -> str:
    """A failed fetch in a few words (an exception's own text may name a redirect's host)."""
    if isinstance(exc, httpx2.ConnectError):
        return "could not connect"
    if isinstance(exc, httpx2.InvalidURL | ValueError):  # ValueError: a redirect's, urllib's
        return "not a valid URL"
    if isinstance(exc, OSError):
        return "its host name does not resolve"
    return type(exc).__name__


def _readable(page: _Download) -> tuple[str, str]:
    """A page's title and text: for HTML, the main text as trafilatura extracts it, or (where
    it finds none, as on a very short page) every text trafilatura's baseline keeps. CPU work,
    run in a thread; trafilatura is imported on the first page opened, not at startup."""
    if page.kind == "text/plain":
        return "", _decoded(page.data, page.charset)
    import trafilatura
    from trafilatura.settings import Document

    # without a charset in the header, trafilatura guesses from the bytes
    tree = trafilatura.load_html(_decoded(page.data, page.charset) if page.charset else page.data)
    if tree is None:
        return "", _clean(_decoded(page.data, page.charset))
    found = trafilatura.bare_extraction(
        tree, url=page.url, include_comments=False, with_metadata=True
    )
    if isinstance(found, Document) and found.text:
        return _clean(found.title), found.text
    metadata = trafilatura.extract_metadata(tree, default_url=page.url, extensive=False)
    return _clean(metadata.title), trafilatura.html2txt(tree)


def _decoded(data: bytes, charset: str | None) -> str:
    try:
        return data.decode(charset or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return data.decode("utf-8", errors="replace")


# ---- configuration ------------------------------------------------------------------------------

_APIS: Mapping[str, type[_Api]] = {"searxng": _Searxng, "brave": _Brave, "tavily": _Tavily}
_KEYED = frozenset({"brave", "tavily"})


def web_search(
    spec: str,
    *,
    fetch: bool = True,
    allow: Sequence[str] = (),
    timeout: float = 10.0,
    env: Mapping[str, str] = os.environ,
    mcp: McpConfig | None = None,
) -> WebSearch:
    """Parse `--web-search` (ValueError with a clear message on a bad spec)."""
    try:
        reach = Reach(allow)
    except ValueError as exc:
        raise ValueError(f"--web-allow: {exc}") from None
    backend = _backend(spec, timeout, env, mcp)
    return WebSearch(backend, fetch=fetch, reach=reach, timeout=timeout)


def _backend(spec: str, timeout: float, env: Mapping[str, str], mcp: McpConfig | None) -> _Backend:
    """`KIND=TARGET`: an API at a URL, or `mcp=LABEL[:TOOL]`."""
    kind, eq, target = spec.partition("=")
    if kind == "mcp" and target:
        label, _, tool = target.partition(":")
        if mcp is None or label not in mcp.servers:
            raise ValueError(
                f"--web-search {spec!r}: no MCP server is labelled {label!r} "
                "(--mcp-server LABEL=URL names one)"
            )
        return _McpTool(mcp.servers[label], tool or "search", mcp)
    api = _APIS.get(kind)
    if api is None or not eq or not _is_web(target) or not urlsplit(target).hostname:
        raise ValueError(
            "--web-search: expected searxng=URL, brave=URL, tavily=URL or mcp=LABEL[:TOOL] "
            f"(an http or https URL), got {spec!r}"
        )
    key = env.get(KEY_VARIABLE, "") if kind in _KEYED else ""
    if kind in _KEYED and not key:
        raise ValueError(f"--web-search {kind}=URL: its API key is read from {KEY_VARIABLE}")
    return api(target, key, timeout)


# ---- what the model's web_search does with pages and results ------------------------------------


def find_in_page(text: str, pattern: str, limit: int = 2000) -> str:
    """The passages of `text` that contain `pattern` (case-insensitive, plain substring, any
    run of whitespace matching any other), each with a little context, at most `limit`
    characters; a clear 'not found' sentence otherwise."""
    words = pattern.split()
    if not words:
        return "Nothing to find: the pattern is empty."
    matches = list(re.finditer(r"\s+".join(map(re.escape, words)), text, re.IGNORECASE))
    if not matches:
        return f"{pattern!r} is not on this page."
    spans = _merged((m.start() - _CONTEXT, m.end() + _CONTEXT) for m in matches)
    passages = [
        ("…" if start > 0 else "")
        + text[max(start, 0) : end].strip()
        + ("…" if end < len(text) else "")
        for start, end in spans
    ]
    found = f"{len(matches)} matches of {pattern!r}:\n\n" + "\n\n".join(passages)
    return found[:limit]


def _merged(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """Sorted spans, those that overlap joined."""
    merged: list[tuple[int, int]] = []
    for start, end in spans:
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def allowed(url: str, domains: Sequence[str]) -> bool:
    """Whether `url`'s host is one of `domains` or a subdomain of one (empty `domains`: all).
    Compare hosts case-insensitively, ignore a leading 'www.' in the domain list, never match
    'evilexample.com' for 'example.com'."""
    if not domains:
        return True
    try:
        host = (urlsplit(url).hostname or "").rstrip(".")
        names = {_domain(d) for d in domains} - {""}
    except ValueError:  # not a URL (`http://[::1`): on no domain
        return False
    return bool(host) and any(host == name or host.endswith(f".{name}") for name in names)


def _domain(text: str) -> str:
    """An allowed domain as a bare host name: lower case, without a scheme, a path or a
    leading 'www.' (`https://www.example.com/` is `example.com`)."""
    host = urlsplit(text).hostname if "://" in text else text.strip().partition("/")[0]
    return (host or "").lower().rstrip(".").removeprefix("www.")
