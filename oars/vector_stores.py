"""The Vector Stores API's rules: what a body may hold, and what a search's filters keep.

Every field a route reads is checked here (a 400 naming it); the routes (`oars.http.vector_stores`)
and the store (`oars.store.vectors`) take what comes out. Scores, in 0..1, where
`score_threshold` applies: a store with vectors fuses its keyword list and its vector list by
reciprocal rank (`fused`); one without (indexed while no embedding model ran) shows its keyword
rank `s` (FTS5's `-bm25()` on SQLite, `ts_rank_cd` on PostgreSQL, ≥ 0, larger is better) as
`s / (s + 1)`, in the same order.

Filters (`ComparisonFilter`, `CompoundFilter`) apply to a file's `attributes` before ranking: a
file whose attributes fail them gives no result. A key the attributes lack fails every
comparison but `ne` and `nin`; `gt`/`gte`/`lt`/`lte` compare numbers with numbers and strings
with strings, and fail across types.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

from oars.chunking import AUTO_MAX, AUTO_OVERLAP, MAX_MAX, MIN_MAX
from oars.errors import InvalidRequest

Json = dict[str, Any]
MAX_ATTRIBUTES, MAX_KEY, MAX_VALUE = 16, 64, 512
MAX_BATCH = 2000
MAX_DAYS = 365
MAX_QUERIES = 10
MAX_QUERY_CHARS = 4_096  # of one query
MAX_STORE_FILES = 10_000  # in one vector store, as OpenAI's
MAX_FILE_CHUNKS = 20_000  # of one file: past it, the file fails (`invalid_file`)
FILE_STATUSES = ("in_progress", "completed", "failed", "cancelled")


def fail(message: str, param: str | None) -> InvalidRequest:
    return InvalidRequest(message, param=param)


def object_body(body: Any) -> Json:
    if not isinstance(body, dict):
        raise InvalidRequest(
            "The request body must be a JSON object.", param=None, code="invalid_type"
        )
    return body


def known(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise InvalidRequest(
            f"Unrecognized request argument supplied: {unknown[0][:100]}",
            param=unknown[0][:100],
            code="unknown_parameter",
        )


def text_field(body: Mapping[str, Any], name: str, limit: int) -> str | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, str) or len(value) > limit):
        raise fail(f"Invalid '{name}': expected a string of up to {limit} characters.", name)
    return value


def chunking(value: Any, param: str = "chunking_strategy") -> Json:
    """`auto` or `static` → what a file records: `{type: static, static: {…}}`."""
    if value is None:
        value = {"type": "auto"}
    if not isinstance(value, dict) or value.get("type") not in ("auto", "static"):
        raise fail(f"Invalid '{param}': expected {{type: 'auto' | 'static'}}.", param)
    if value["type"] == "auto":
        return _static(AUTO_MAX, AUTO_OVERLAP)
    static = value.get("static")
    if not isinstance(static, dict):
        raise fail(f"Invalid '{param}.static': expected an object.", f"{param}.static")
    size = static.get("max_chunk_size_tokens")
    overlap = static.get("chunk_overlap_tokens")
    if not _int(size) or not MIN_MAX <= size <= MAX_MAX:
        raise fail(
            f"Invalid '{param}.static.max_chunk_size_tokens': an integer from {MIN_MAX} to "
            f"{MAX_MAX}.",
            f"{param}.static.max_chunk_size_tokens",
        )
    if not _int(overlap) or not 0 <= overlap <= size // 2:
        raise fail(
            f"Invalid '{param}.static.chunk_overlap_tokens': an integer from 0 to half of "
            "max_chunk_size_tokens.",
            f"{param}.static.chunk_overlap_tokens",
        )
    return _static(size, overlap)


def _static(size: int, overlap: int) -> Json:
    return {
        "type": "static",
        "static": {"max_chunk_size_tokens": size, "chunk_overlap_tokens": overlap},
    }


def _int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def attributes(value: Any, param: str = "attributes") -> Json:
    """Up to 16 pairs; keys up to 64 characters; values a string (≤ 512), number or bool."""
    if value is None:
        return {}
    if not isinstance(value, dict) or len(value) > MAX_ATTRIBUTES:
        raise fail(f"Invalid '{param}': an object of at most {MAX_ATTRIBUTES} pairs.", param)
    for key, item in value.items():
        good = isinstance(item, bool) or (
            isinstance(item, (int, float)) and math.isfinite(item)
            if not isinstance(item, str)
            else len(item) <= MAX_VALUE
        )
        if len(key) > MAX_KEY or not good:
            raise fail(
                f"Invalid '{param}.{key[:64]}': keys up to {MAX_KEY} characters; values a "
                f"string of up to {MAX_VALUE} characters, a number or a boolean.",
                f"{param}.{key[:64]}",
            )
    return dict(value)


def expires_after(value: Any) -> Json | None:
    if value is None:
        return None
    days = value.get("days") if isinstance(value, dict) else None
    if not isinstance(value, dict) or value.get("anchor") != "last_active_at":
        raise fail(
            "Invalid 'expires_after.anchor': expected 'last_active_at'.", "expires_after.anchor"
        )
    if not _int(days) or not 1 <= days <= MAX_DAYS:
        raise fail(
            f"Invalid 'expires_after.days': an integer from 1 to {MAX_DAYS}.",
            "expires_after.days",
        )
    return {"anchor": "last_active_at", "days": days}


def room(store: Json, adding: int) -> None:
    """A store may take `adding` more files (a 400 past `MAX_STORE_FILES`)."""
    if store["file_counts"]["total"] + adding > MAX_STORE_FILES:
        raise InvalidRequest(
            f"Vector store '{store['id']}' holds {store['file_counts']['total']} files; adding "
            f"{adding} would pass the limit of {MAX_STORE_FILES}.",
            param=None,
            code="too_many_files",
        )


def file_ids(value: Any, param: str = "file_ids") -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_BATCH:
        raise fail(f"Invalid '{param}': a list of up to {MAX_BATCH} file ids.", param)
    for i, item in enumerate(value):
        if not isinstance(item, str) or not 0 < len(item) <= 200:
            raise fail(f"Invalid '{param}[{i}]': expected a file id.", f"{param}[{i}]")
    return list(dict.fromkeys(value))


# ---- search ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ranking:
    """`ranking_options`: the least score kept, and how reciprocal rank fusion weighs the
    chunks nearest by vector against those ranked by keyword (`hybrid_search`)."""

    threshold: float = 0.0
    embedding_weight: float = 1.0
    text_weight: float = 1.0


@dataclass(frozen=True)
class Search:
    queries: tuple[str, ...]
    filters: Json | None
    max_num_results: int
    ranking: Ranking


_SEARCH = frozenset({"query", "filters", "max_num_results", "ranking_options", "rewrite_query"})


def search(body: Json) -> Search:
    known(body, _SEARCH)
    query = body.get("query")
    queries = [query] if isinstance(query, str) else query
    if (
        not isinstance(queries, list)
        or not 0 < len(queries) <= MAX_QUERIES
        or not all(isinstance(q, str) and q.strip() for q in queries)
    ):
        raise fail(
            f"Invalid 'query': a non-empty string or a list of up to {MAX_QUERIES}.", "query"
        )
    if any(len(q) > MAX_QUERY_CHARS for q in queries):
        raise fail(f"Invalid 'query': a query of at most {MAX_QUERY_CHARS} characters.", "query")
    limit = body.get("max_num_results", 10)
    if not _int(limit) or not 1 <= limit <= 50:
        raise fail("Invalid 'max_num_results': an integer from 1 to 50.", "max_num_results")
    if not isinstance(body.get("rewrite_query", False), bool):
        raise fail("Invalid 'rewrite_query': expected a boolean.", "rewrite_query")
    filters = body.get("filters")
    if filters is not None:
        check_filter(filters, "filters")
    return Search(tuple(queries), filters, limit, ranking(body.get("ranking_options")))


def ranking(options: Any, param: str = "ranking_options") -> Ranking:
    """`ranking_options` of `/search` or of a `file_search` tool, checked."""
    if options is None:
        return Ranking()
    if not isinstance(options, dict):
        raise fail(f"Invalid '{param}': expected an object.", param)
    known(options, frozenset({"ranker", "score_threshold", "hybrid_search"}))
    if options.get("ranker", "auto") not in ("none", "auto", "default-2024-11-15"):
        raise fail(
            f"Invalid '{param}.ranker': one of none, auto, default-2024-11-15.", f"{param}.ranker"
        )
    threshold = _number_in(options.get("score_threshold", 0.0), f"{param}.score_threshold", 1.0)
    hybrid = options.get("hybrid_search")
    if hybrid is None:
        return Ranking(threshold)
    where = f"{param}.hybrid_search"
    if not isinstance(hybrid, dict):
        raise fail(f"Invalid '{where}': expected an object.", where)
    known(hybrid, frozenset({"embedding_weight", "text_weight"}))
    weights = [
        _number_in(hybrid.get(name, 1.0), f"{where}.{name}", None)
        for name in ("embedding_weight", "text_weight")
    ]
    if not any(weights):
        raise fail(f"Invalid '{where}': the two weights cannot both be 0.", where)
    return Ranking(threshold, *weights)


def _number_in(value: Any, param: str, most: float | None) -> float:
    """A number from 0 (to `most`, if given)."""
    if (
        not _number(value)
        or not math.isfinite(value)
        or value < 0
        or (most is not None and value > most)
    ):
        span = "from 0" if most is None else f"from 0 to {most:g}"
        raise fail(f"Invalid '{param}': a number {span}.", param)
    return float(value)


_COMPARE = frozenset({"eq", "ne", "gt", "gte", "lt", "lte", "in", "nin"})
_SCALAR = (str, int, float, bool)
MAX_FILTER_DEPTH = 8


def check_filter(value: Any, param: str, depth: int = 0) -> None:
    """A `ComparisonFilter` or `CompoundFilter`, nested up to `MAX_FILTER_DEPTH`."""
    kind = value.get("type") if isinstance(value, dict) else None
    if kind in ("and", "or") and depth < MAX_FILTER_DEPTH:
        assert isinstance(value, dict)
        inner = value.get("filters")
        if not isinstance(inner, list) or not inner:
            raise fail(f"Invalid '{param}.filters': a non-empty list.", f"{param}.filters")
        for i, item in enumerate(inner):
            check_filter(item, f"{param}.filters[{i}]", depth + 1)
        return
    if kind not in _COMPARE or not isinstance(value, dict) or not isinstance(value.get("key"), str):
        raise fail(
            f"Invalid '{param}': expected {{key, type: eq|ne|gt|gte|lt|lte|in|nin, value}} or "
            "{type: and|or, filters}.",
            param,
        )
    item = value.get("value")
    listed = kind in ("in", "nin")
    good = (
        isinstance(item, list) and all(isinstance(v, _SCALAR) for v in item)
        if listed
        else isinstance(item, _SCALAR)
    )
    if not good:
        raise fail(
            f"Invalid '{param}.value': for {kind}, a {'list' if listed else 'scalar'}.",
            f"{param}.value",
        )


def matches(spec: Json, attributes: Mapping[str, Any]) -> bool:
    """Whether a file's attributes pass a filter (checked by `check_filter`)."""
    kind = spec["type"]
    if kind == "and":
        return all(matches(f, attributes) for f in spec["filters"])
    if kind == "or":
        return any(matches(f, attributes) for f in spec["filters"])
    if spec["key"] not in attributes:
        return kind in ("ne", "nin")
    have, want = attributes[spec["key"]], spec["value"]
    if kind in ("in", "nin"):
        return bool(any(_same(have, w) for w in want) == (kind == "in"))
    if kind in ("eq", "ne"):
        return bool(_same(have, want) == (kind == "eq"))
    if _number(have) != _number(want) or isinstance(have, bool) or isinstance(want, bool):
        return False
    return bool(_ORDER[kind](have, want))


_ORDER = {"gt": operator.gt, "gte": operator.ge, "lt": operator.lt, "lte": operator.le}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, bool) == isinstance(b, bool) and bool(a == b)


def score(rank: float) -> float:
    """A keyword rank (≥ 0, larger better) → 0..1, in the same order: a store without vectors
    is ranked by keyword alone."""
    rank = max(rank, 0.0)
    return rank / (rank + 1.0)


RRF_K = 60  # reciprocal rank fusion's constant: a list's n-th (from 1) counts 1 / (60 + n)


def fused(places: Mapping[int, int], near: Mapping[int, int], ranking: Ranking) -> dict[int, float]:
    """Reciprocal rank fusion of a keyword list and a vector list (each chunk id → its place
    from 1), weighted by `ranking`: each chunk's score is its weighted sum over the best it
    could be (first in both), so 0..1 and 1 only for the first of both lists."""
    best = (ranking.text_weight + ranking.embedding_weight) / (RRF_K + 1)
    scores: dict[int, float] = {}
    for weight, ranked in ((ranking.text_weight, places), (ranking.embedding_weight, near)):
        for chunk, place in ranked.items() if weight else ():  # (a list weighed 0 finds none)
            scores[chunk] = scores.get(chunk, 0.0) + weight / (RRF_K + place) / best
    return {chunk: min(score, 1.0) for chunk, score in scores.items()}
