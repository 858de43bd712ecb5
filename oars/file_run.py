"""One response's file searches: what the model asks of the request's vector stores, run by this
server as `file_search_call` items.

The model calls `file_search` with `queries` (OpenAI's model writes several at once); each call
is one item. Every query runs against every store the tool names (`vector_store_ids`), with its
`filters` and `ranking_options` (`oars.vector_stores.Ranking`); the hits are merged (a chunk found twice keeps
its best score), ranked, and cut to `max_num_results`. The model reads them numbered by handles
that go on across the response's searches (`【1】`, `【2】`, …) and cites one by writing its
handle; `oars.parsing.citations` takes the marker out of the text and the builder makes it a
`file_citation`. A store that fails is a `failed` call the model reads; the response goes on.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from oars.events import Event, ResponseBuilder
from oars.events.builder import Found
from oars.events.items import arguments_object
from oars.turn import Turn
from oars.vector_stores import Ranking, ranking

MAX_RESULTS = 20  # a tool that names none: OpenAI's echo shows 20
RESULT_CHARS = 1_500  # of one result, as the model reads it
READ_CHARS = 12_000  # of one call's results, as the model reads them


@dataclass(frozen=True)
class Hit:
    """A chunk a search found."""

    file_id: str
    filename: str
    score: float  # 0..1
    text: str
    attributes: Mapping[str, Any]
    chunk: str  # the chunk's identity (its file and position): one found twice is one


class FileSearchFailed(Exception):
    """A search could not run (a store gone, the database down): the call fails with this."""


class FileSearcher(Protocol):
    """The vector stores a request's tool names, as its tenant may search them (`Searchers`
    opens one)."""

    async def search(
        self,
        query: str,
        *,
        limit: int,
        filters: Mapping[str, Any] | None,
        ranking: Ranking,
    ) -> list[Hit]:
        """The best `limit` chunks for `query` over the stores, best first (`FileSearchFailed`
        when it cannot run)."""
        ...


# A tenant's searcher over the given vector stores (the tenant: the hashed API key, '' without
# keys); a store it may not see is a 404 before anything is sent.
Searchers = Callable[[str, Sequence[str]], Awaitable[FileSearcher]]


@dataclass
class FileRun:
    """The file searches of one response, and what they read."""

    searcher: FileSearcher
    limit: int = MAX_RESULTS
    filters: Mapping[str, Any] | None = None
    ranking: Ranking = field(default_factory=Ranking)
    read: dict[str, str] = field(default_factory=dict)  # by item id: what the call read
    handles: int = 0  # results shown so far: the next is `【handles + 1】`

    @classmethod
    def of(cls, searcher: FileSearcher, turn: Turn) -> FileRun | None:
        """The response's file searches, if its request sends `file_search` (its settings are
        its first such tool's)."""
        wire = next((t for t in turn.request.echo["tools"] if t.get("type") == "file_search"), None)
        if wire is None:
            return None
        return cls(
            searcher,
            wire.get("max_num_results") or MAX_RESULTS,
            wire.get("filters"),
            ranking(wire.get("ranking_options")),  # (checked with the request)
        )

    async def run(self, builder: ResponseBuilder, arguments: str) -> AsyncIterator[Event]:
        """One call the model wrote: its item, searching while the stores answer, then
        completed (or failed, with the reason as what the model reads)."""
        queries = _queries(arguments_object(arguments))
        events = builder.file_search_call()
        item_id = str(events[-1]["item_id"])
        for event in events:
            yield event
        try:
            if not queries:
                raise FileSearchFailed("the call has no queries")
            found = self._shown(await self._search(queries))
        except FileSearchFailed as exc:
            self.read[item_id] = f"Error: {exc}"
            for event in builder.file_search_done(queries, None):
                yield event
            return
        self.read[item_id] = _results(queries, found)
        for event in builder.file_search_done(queries, found):
            yield event

    async def _search(self, queries: list[str]) -> list[Hit]:
        best: dict[str, Hit] = {}
        for query in queries:
            for hit in await self.searcher.search(
                query,
                limit=self.limit,
                filters=self.filters,
                ranking=self.ranking,
            ):
                if hit.chunk not in best or best[hit.chunk].score < hit.score:
                    best[hit.chunk] = hit
        return sorted(best.values(), key=lambda hit: -hit.score)[: self.limit]

    def _shown(self, hits: list[Hit]) -> list[Found]:
        """The hits under the response's next handles."""
        start, self.handles = self.handles, self.handles + len(hits)
        return [
            Found(str(start + n), h.file_id, h.filename, h.score, h.text, h.attributes)
            for n, h in enumerate(hits, 1)
        ]


def _queries(asked: Mapping[str, Any]) -> list[str]:
    """What the call searches for: `queries`, or a lone `query` (a model that wrote one)."""
    raw = asked.get("queries", asked.get("query"))
    raw = [raw] if isinstance(raw, str) else raw
    if not isinstance(raw, list):
        return []
    return [q.strip() for q in raw if isinstance(q, str) and q.strip()][:_MAX_QUERIES]


_MAX_QUERIES = 3  # as the function offered takes them (`oars.tools.FILE_SEARCH`)


def _results(queries: list[str], found: list[Found]) -> str:
    """Results as the model reads them, numbered by their handles, then how to cite one (the
    shape of a web search's, which the small default model answers from)."""
    asked = ", ".join(json.dumps(q) for q in queries)
    if not found:
        return f"No results for {asked}."
    lines = [f"Results for {asked}:"]
    for result in found:
        lines += ["", f"[{result.handle}] {result.filename}", result.text[:RESULT_CHARS]]
    text = "\n".join(lines)[:READ_CHARS]
    return text + "\n\nCite a result you use with its number in these brackets: 【1】."
