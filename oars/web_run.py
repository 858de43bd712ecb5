"""One response's web searches: what the model asks of the web, run through the operator's
backend (`oars.web_search`) as `web_search_call` items.

The model calls `web_search` (a query), `open_page` (a URL) or `find_in_page` (a URL and a
phrase), as `oars.tools.WEB_TOOLS` offers them; each call is one item whose action says which.
The item keeps no results (OpenAI's keeps none either): what the call read is kept here, by the
item's id, and the steps after it render it for the model (`read`). The request's `web_search`
tool says how much is read (`search_context_size`), which domains may be (`filters.
allowed_domains`, subdomains included, applied to what the backend answers and to every page
opened) and where the user is (`user_location`, for backends that take it). A backend that
fails, or a page that may not or cannot be read, is a `failed` call the model reads; the
response goes on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from oars.events import Event, ResponseBuilder
from oars.events.items import arguments_object
from oars.tools import WEB_SEARCH_TYPES, Tool
from oars.turn import Turn
from oars.web_search import Found, Page, WebSearch, WebSearchFailed, allowed, find_in_page

# search_context_size → (results of a search, characters read of a page)
CONTEXT_SIZES = {"low": (3, 2_000), "medium": (5, 4_000), "high": (8, 8_000)}
SNIPPET_CHARS = 400  # of one result, as the model reads it
_WIDER = 3  # with allowed domains, ask the backend for this many times the results to keep


@dataclass
class WebRun:
    """The web searches of one response, and what they read."""

    backend: WebSearch
    tools: dict[str, Tool]  # the web functions offered, by the name the model calls them
    domains: tuple[str, ...] = ()
    results: int = 5
    page_chars: int = 4_000
    location: Mapping[str, Any] | None = None
    read: dict[str, str] = field(default_factory=dict)  # by item id: what the call read
    pages: dict[str, Page] = field(default_factory=dict)  # opened in this response, by URL

    @classmethod
    def of(cls, backend: WebSearch, turn: Turn) -> WebRun | None:
        """The response's web searches, if its request sends `web_search` (its settings are
        its first such tool's)."""
        tools = {t.model_name: t for t in turn.tools.offered if t.kind == "server_web_search"}
        wire = next(
            (t for t in turn.request.echo["tools"] if t.get("type") in WEB_SEARCH_TYPES), None
        )
        if not tools or wire is None:
            return None
        results, page_chars = CONTEXT_SIZES[wire.get("search_context_size") or "medium"]
        filters = wire.get("filters") or {}
        location = wire.get("user_location")
        return cls(
            backend,
            tools,
            tuple(filters.get("allowed_domains") or ()),
            results,
            page_chars,
            location if isinstance(location, dict) else None,
        )

    async def run(
        self, builder: ResponseBuilder, name: str, arguments: str
    ) -> AsyncIterator[Event]:
        """One call the model wrote: its item, in progress while the backend answers, then
        completed (or failed, with the reason as what the model reads)."""
        asked = arguments_object(arguments)
        events = builder.web_search_call(action_of(name, asked))
        item_id = str(events[-1]["item_id"])
        for event in events:
            yield event
        try:
            text, sources = await self._call(name, asked)
        except WebSearchFailed as exc:
            self.read[item_id] = f"Error: {exc}"
            for event in builder.web_search_done(failed=True):
                yield event
            return
        self.read[item_id] = text
        for event in builder.web_search_done(failed=False, sources=sources):
            yield event

    async def _call(self, name: str, asked: Mapping[str, Any]) -> tuple[str, dict[str, str]]:
        """What the call read, and the URLs it found (by URL, their titles)."""
        if name == "web_search":
            return await self._search(_text(asked, "query"))
        url = _text(asked, "url")
        page = await self._page(url)
        if name == "open_page":
            return f"{page.title}\n{page.url}\n\n{page.text}", {page.url: page.title}
        return find_in_page(page.text, _text(asked, "pattern")), {page.url: page.title}

    async def _search(self, query: str) -> tuple[str, dict[str, str]]:
        asked = self.results * (_WIDER if self.domains else 1)
        found = await self.backend.search(query, asked, self.location)
        kept = [f for f in found if allowed(f.url, self.domains)]
        kept = kept[: self.results]
        sources = {f.url: f.title for f in kept if f.url}
        return _results(query, kept), sources

    async def _page(self, url: str) -> Page:
        if not allowed(url, self.domains):
            raise WebSearchFailed(f"{url} is not on a domain this search may read")
        page = self.pages.get(url)
        if page is None:
            page = await self.backend.open_page(url, self.page_chars)
            if not allowed(page.url, self.domains):  # a redirect led away
                raise WebSearchFailed(f"{url} leads to a page not on a domain this search may read")
            self.pages[url] = page
        return page


def _text(asked: Mapping[str, Any], key: str) -> str:
    value = asked.get(key)
    if not isinstance(value, str) or not value.strip():
        raise WebSearchFailed(f"the call has no {key}")
    return value.strip()


def action_of(name: str, asked: Mapping[str, Any]) -> dict[str, Any]:
    """The item's action: what the model asked, as OpenAI's item shows it."""

    def field_(key: str) -> str:
        value = asked.get(key)
        return value if isinstance(value, str) else ""

    if name == "web_search":
        return {"type": "search", "query": field_("query"), "queries": [field_("query")]}
    if name == "open_page":
        return {"type": "open_page", "url": field_("url")}
    return {"type": "find_in_page", "url": field_("url"), "pattern": field_("pattern")}


def _results(query: str, found: list[Found]) -> str:
    """Search results as the model reads them, numbered, each with its URL to cite."""
    if not found:
        return f"No results for {json.dumps(query)}."
    lines = [f"Results for {json.dumps(query)}:"]
    for n, result in enumerate(found, 1):
        lines += ["", f"[{n}] {result.title}".rstrip()]
        lines += [f"URL: {result.url}"] if result.url else []
        lines += [result.snippet[:SNIPPET_CHARS]]
    lines += ["", "Cite a result you use with a Markdown link to its URL: [title](url)."]
    return "\n".join(lines)
