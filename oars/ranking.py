"""A search of vector stores, as `/v1/vector_stores/{id}/search` and the `file_search` tool run
it: each query ranked two ways over the store's indexed chunks (`oars.store.vectors`), by
keyword and, where the store holds vectors, by nearness to the query's vector from the same
embedding model; the two lists fused by reciprocal rank (`oars.vector_stores.fused`), only in
the files whose attributes pass the filters; a chunk found by several queries keeps its best
score. Scores are in 0..1, cut at `score_threshold` and at the most results asked for.

A store's vectors are of the model that embedded its first file (`EmbeddedBy`): a server that
runs another model, or none, refuses to search it (a 400 naming both) rather than compare
vectors of two models or quietly drop to keywords.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from oars import vector_stores as rules
from oars.embeddings import Embedder, embedded_by
from oars.errors import ClientError, EngineError, InvalidRequest, NotFound, StoreUnavailable
from oars.file_run import FileSearchFailed, Hit, Searchers
from oars.store import EmbeddedBy, Json, Vectors
from oars.vector_stores import Ranking

MAX_WORDS = 64  # of a query, searched for
CANDIDATES = 50  # the most chunks each list brings to the fusion
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
    embedder: Embedder | None,
    filters: Mapping[str, Any] | None,
    limit: int,
    ranking: Ranking,
) -> list[Ranked]:
    """The best chunks of one store for `queries`, best first."""
    files = await vectors.searchable_files(vector_store_id)
    only = None
    if filters is not None:
        only = [
            f for f, (_, attributes) in files.items() if rules.matches(dict(filters), attributes)
        ]
    by = await comparable(vectors, vector_store_id, embedder, "vector_store_id")
    near: list[bytes | None] = [None] * len(queries)
    if by is not None and embedder is not None:
        embedded = await embedder.embed(list(queries))
        near = [row.astype("<f4").tobytes() for row in embedded.vectors]
    depth = max(limit, CANDIDATES)
    best: dict[int, tuple[float, Any]] = {}
    for query, vector in zip(queries, near, strict=True):
        words = re.findall(r"\w+", query.lower())[:MAX_WORDS]
        keyword = await vectors.search_chunks(vector_store_id, words, only, depth)
        keyword = [hit for hit in keyword if hit.file_id in files]
        if vector is None:
            scores = {hit.chunk_id: rules.score(hit.rank) for hit in keyword}
            hits = keyword
        else:
            nearest = await vectors.search_vectors(vector_store_id, vector, only, depth)
            nearest = [hit for hit in nearest if hit.file_id in files]
            scores = rules.fused(_places(keyword), _places(nearest), ranking)
            hits = keyword + nearest
        for hit in hits:
            score = scores.get(hit.chunk_id)
            if score is None:
                continue
            if hit.chunk_id not in best or best[hit.chunk_id][0] < score:
                best[hit.chunk_id] = (score, hit)
    found: list[Ranked] = []
    for score, hit in sorted(best.values(), key=lambda sh: (-sh[0], sh[1].chunk_id)):
        if score < ranking.threshold or len(found) == limit:
            break
        filename, attributes = files[hit.file_id]
        found.append(Ranked(hit.chunk_id, hit.file_id, filename, score, attributes, hit.text))
    return found


def _places(hits: Sequence[Any]) -> dict[int, int]:
    return {hit.chunk_id: place for place, hit in enumerate(hits, 1)}


async def comparable(
    vectors: Vectors, vector_store_id: str, embedder: Embedder | None, param: str
) -> EmbeddedBy | None:
    """The model of the store's vectors (None: it holds none), which must be `embedder`'s."""
    by = await vectors.vector_store_embedding(vector_store_id)
    if by is None or by == embedded_by(embedder):
        return by
    runs = "no embedding model" if embedder is None else f"'{embedder.model}'"
    raise InvalidRequest(
        f"Vector store '{vector_store_id}' holds vectors of the embedding model '{by.model}' "
        f"({by.dimensions} dimensions), and this server runs {runs}: it cannot be searched "
        f"here (start the server with `--embedding-model {by.model}`).",
        param=param,
        code="embedding_model_mismatch",
    )


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

    def __init__(self, vectors: Vectors, stores: list[Json], embedder: Embedder | None) -> None:
        self.vectors, self.stores, self.embedder = vectors, stores, embedder

    async def search(
        self,
        query: str,
        *,
        limit: int,
        filters: Mapping[str, Any] | None,
        ranking: Ranking,
    ) -> list[Hit]:
        hits: list[Hit] = []
        try:
            for store in self.stores:
                found = await search_store(
                    self.vectors,
                    store["id"],
                    [query],
                    embedder=self.embedder,
                    filters=filters,
                    limit=limit,
                    ranking=ranking,
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
        # (a store refilled by another model since; the embedding server down)
        except (StoreUnavailable, ClientError, EngineError) as exc:
            raise FileSearchFailed(str(exc)) from exc
        return sorted(hits, key=lambda hit: -hit.score)[:limit]


def searchers(vectors: Vectors, embedder: Embedder | None = None) -> Searchers:
    """The searchers of `vectors`' tenants, comparing vectors by `embedder`'s: each store a
    request names is its tenant's, usable, and of that model (or of none), or the request is
    refused before anything is sent."""

    async def open_(tenant: str, store_ids: Sequence[str]) -> StoreSearcher:
        stores = []
        for store_id in dict.fromkeys(store_ids):
            stores.append(await usable(vectors, store_id, tenant, "tools"))
            await comparable(vectors, store_id, embedder, "tools")
        return StoreSearcher(vectors, stores, embedder)

    return open_
