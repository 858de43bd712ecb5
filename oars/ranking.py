"""A search of vector stores, as `/v1/vector_stores/{id}/search` and the `file_search` tool run
it: each query's words ranked by keyword over the store's indexed chunks (`oars.store.vectors`),
only in the files whose attributes pass the filters, a chunk found by several queries keeping its
best rank; scores in 0..1 (`oars.vector_stores.score`), cut at `score_threshold` and at the
most results asked for.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oars import vector_stores as rules
from oars.errors import InvalidRequest, NotFound, StoreUnavailable
from oars.file_run import FileSearchFailed, Hit, Searchers
from oars.store import Json, Vectors

MAX_WORDS = 64  # of a query, searched for
TOUCH_EVERY = 60  # seconds: how stale a store's `last_active_at` may be


@dataclass(frozen=True)
class Ranked:
    """One chunk a search found."""

    chunk_id: int
    file_id: str
    filename: str
    score: float
    attributes: Json
    text: str


async def search_store(
    vectors: Vectors,
    vector_store_id: str,
    queries: Sequence[str],
    *,
    filters: Mapping[str, Any] | None,
    limit: int,
    threshold: float,
) -> list[Ranked]:
    """The best chunks of one store for `queries`, best first."""
    files = await vectors.searchable_files(vector_store_id)
    only = None
    if filters is not None:
        only = [
            f for f, (_, attributes) in files.items() if rules.matches(dict(filters), attributes)
        ]
    best: dict[int, Any] = {}
    for query in queries:
        words = re.findall(r"\w+", query.lower())[:MAX_WORDS]
        for hit in await vectors.search_chunks(vector_store_id, words, only, limit):
            known = best.get(hit.chunk_id)
            if hit.file_id in files and (known is None or hit.rank > known.rank):
                best[hit.chunk_id] = hit
    found: list[Ranked] = []
    for hit in sorted(best.values(), key=lambda h: (-h.rank, h.chunk_id)):
        score = rules.score(hit.rank)
        if score < threshold or len(found) == limit:
            break
        filename, attributes = files[hit.file_id]
        found.append(Ranked(hit.chunk_id, hit.file_id, filename, score, attributes, hit.text))
    return found


async def used(vectors: Vectors, store: Json) -> None:
    """The store was used now: its `last_active_at` (and so `expires_at`) moves, at most once
    a minute (a search is a read; not every one need be a write)."""
    now = int(time.time())
    if now - store["last_active_at"] >= TOUCH_EVERY:
        await vectors.touch_vector_store(store["id"], now)
        store["last_active_at"] = now  # a response's next search need not write it again


async def usable(vectors: Vectors, vector_store_id: str, tenant: str, param: str) -> Json:
    """The tenant's store, to search or add to: a 404 if it is not theirs, a 400 if expired."""
    found = await vectors.get_vector_store(vector_store_id, tenant=tenant)
    if found is None:
        raise NotFound(f"Vector store with id '{vector_store_id}' not found.", param=param)
    if found["status"] == "expired":
        raise InvalidRequest(
            f"Vector store '{vector_store_id}' has expired: it can no longer be searched or "
            "changed.",
            param=param,
            code="vector_store_expired",
        )
    return found


class StoreSearcher:
    """A response's `file_search` over its tenant's stores (`oars.file_run.FileSearcher`)."""

    def __init__(self, vectors: Vectors, stores: list[Json]) -> None:
        self.vectors, self.stores = vectors, stores

    async def search(
        self,
        query: str,
        *,
        limit: int,
        filters: Mapping[str, Any] | None,
        threshold: float,
    ) -> list[Hit]:
        hits: list[Hit] = []
        try:
            for store in self.stores:
                found = await search_store(
                    self.vectors,
                    store["id"],
                    [query],
                    filters=filters,
                    limit=limit,
                    threshold=threshold,
                )
                hits += [
                    Hit(
                        r.file_id,
                        r.filename,
                        r.score,
                        r.text,
                        r.attributes,
                        f"{store['id']}/{r.chunk_id}",
                    )
                    for r in found
                ]
                await used(self.vectors, store)
        except StoreUnavailable as exc:
            raise FileSearchFailed(str(exc)) from exc
        return sorted(hits, key=lambda hit: -hit.score)[:limit]


def searchers(vectors: Vectors) -> Searchers:
    """The searchers of `vectors`' tenants: each store a request names is its tenant's and
    usable, or the request is refused before anything is sent."""

    async def open_(tenant: str, store_ids: Sequence[str]) -> StoreSearcher:
        stores = [
            await usable(vectors, store_id, tenant, "tools")
            for store_id in dict.fromkeys(store_ids)
        ]
        return StoreSearcher(vectors, stores)

    return open_
