"""Vector stores on SQL: the part of `SqlStore` that keeps `/v1/vector_stores`, their files,
batches and chunks, and searches the chunks by keyword.

A store's `status`, `file_counts` and `usage_bytes` are not kept but read from its files' rows,
so they cannot drift. A file's chunks are written with its `completed` in one transaction
(`index_vector_file`): a crash leaves the file `in_progress` and chunkless, and the ingester
takes it up again. The keyword index is FTS5 (SQLite, kept by triggers) or a generated tsvector
(PostgreSQL); both rank with their own statistics over every store's chunks.

Each chunk keeps its vector beside its text (`_v7`). On PostgreSQL with pgvector the database
compares them; elsewhere (SQLite, or PostgreSQL without the extension) numpy does, over a copy
of the store's vectors that the replica keeps while the store's `chunks_version` is the one
it was read at (each transaction that changes a store's chunks moves it).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import (
    ColumnElement,
    Table,
    and_,
    bindparam,
    delete,
    func,
    insert,
    select,
    text,
    tuple_,
    update,
)
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from oars.jsonfast import dumps
from oars.store.base import (
    ChunkVectors,
    EmbeddedBy,
    Hit,
    Json,
    ListQuery,
    NewVectorFile,
    NewVectorStore,
    Page,
    Pending,
    WrongEmbedding,
)
from oars.store.schema import (
    files,
    vector_chunks,
    vector_store_file_batches,
    vector_store_files,
    vector_stores,
)
from oars.store.transactions import guarded

_DAY = 86_400
VS, VF, BATCHES, CHUNKS = (
    vector_stores,
    vector_store_files,
    vector_store_file_batches,
    vector_chunks,
)
_COUNTED = ("in_progress", "completed", "failed", "cancelled")
_MATRIX_BYTES = 1 << 30  # of stores' vectors a replica keeps in memory, the least recent going
_VECTOR_TYPE_SQL = "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = 'vector_chunks'::regclass AND attname = 'embedding'"
_BUMP = {"chunks_version": VS.c.chunks_version + 1}


@dataclass(frozen=True)
class _Matrix:
    """A store's vectors as numpy compares them: a row a chunk, with its id and file."""

    version: int
    ids: npt.NDArray[np.int64]
    files: npt.NDArray[np.str_]
    rows: npt.NDArray[np.float32]


def _embedded_by(row: Any) -> EmbeddedBy | None:
    """The model a store's row records (`embedding_model`, `dimensions`), if any."""
    if row is None or row.embedding_model is None:
        return None
    return EmbeddedBy(row.embedding_model, int(row.dimensions))


def _pgvector(row: bytes | None) -> str | None:
    """A vector's float32 bytes in pgvector's text form (each float32 exactly, as it reads
    back)."""
    if row is None:
        return None
    return "[" + ",".join(map(repr, np.frombuffer(row, "<f4").tolist())) + "]"


def _expires_at(days: int | None, last_active_at: int) -> int | None:
    return None if days is None else last_active_at + days * _DAY


def _store_wire(row: Any, counts: Mapping[str, int], usage: int, now: float) -> Json:
    expired = row.expired or (row.expires_at is not None and row.expires_at <= now)
    status = "expired" if expired else "in_progress" if counts.get("in_progress") else "completed"
    file_counts = {s: counts.get(s, 0) for s in _COUNTED}
    return {
        "id": row.id,
        "object": "vector_store",
        "created_at": row.created_ns // 1_000_000_000,
        "name": row.name,
        "usage_bytes": usage,
        "status": status,
        "file_counts": {**file_counts, "total": sum(file_counts.values())},
        "last_active_at": row.last_active_at,
        "metadata": json.loads(row.metadata),
        "expires_after": None
        if row.expires_days is None
        else {"anchor": "last_active_at", "days": row.expires_days},
        "expires_at": row.expires_at,
    }


def _file_wire(row: Any) -> Json:
    return {
        "id": row.file_id,
        "object": "vector_store.file",
        "created_at": row.created_ns // 1_000_000_000,
        "vector_store_id": row.vector_store_id,
        "usage_bytes": row.usage_bytes,
        "status": row.status,
        "last_error": None if row.last_error is None else json.loads(row.last_error),
        "attributes": json.loads(row.attributes),
        "chunking_strategy": json.loads(row.chunking),
    }


async def _page(
    conn: AsyncConnection,
    table: Table,
    key: ColumnElement[Any],
    where: list[ColumnElement[bool]],
    query: ListQuery,
) -> tuple[list[Any], bool] | None:
    """A page of `table`'s rows in (created_ns, key) order; None when a cursor is unknown."""
    order = (table.c.created_ns, key)
    asc = query.order == "asc"
    where = list(where)
    for cursor, later in ((query.after, True), (query.before, False)):
        if cursor is None:
            continue
        mark = (await conn.execute(select(*order).where(key == cursor, *where))).first()
        if mark is None:
            return None
        after = asc == later
        where.append(tuple_(*order) > tuple_(*mark) if after else tuple_(*order) < tuple_(*mark))
    backwards = query.before is not None and query.after is None
    ascending = asc != backwards
    by = order if ascending else tuple(c.desc() for c in order)
    rows = (
        await conn.execute(select(table).where(*where).order_by(*by).limit(query.limit + 1))
    ).all()
    more = len(rows) > query.limit
    kept = list(rows[: query.limit])
    return (kept[::-1] if backwards else kept), more


class VectorRows:
    """`Vectors`, for `SqlStore` (whose `engine` it uses)."""

    engine: AsyncEngine

    # ---- stores -----------------------------------------------------------------------

    @guarded
    async def create_vector_store(
        self, store: NewVectorStore, files: Sequence[NewVectorFile], *, tenant: str
    ) -> None:
        now = store.created_ns // 1_000_000_000
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(VS).values(
                    id=store.id,
                    tenant=tenant,
                    created_ns=store.created_ns,
                    name=store.name,
                    description=store.description,
                    metadata=dumps(dict(store.metadata)),
                    expires_days=store.expires_days,
                    expires_at=_expires_at(store.expires_days, now),
                    last_active_at=now,
                    expired=False,
                )
            )
            await _add_files(conn, store.id, files, tenant, None)

    async def _wires(self, conn: AsyncConnection, rows: Sequence[Any]) -> list[Json]:
        ids = [row.id for row in rows]
        counts: dict[str, dict[str, int]] = {i: {} for i in ids}
        usage = dict.fromkeys(ids, 0)
        if ids:
            grouped = await conn.execute(
                select(VF.c.vector_store_id, VF.c.status, func.count(), func.sum(VF.c.usage_bytes))
                .where(VF.c.vector_store_id.in_(ids))
                .group_by(VF.c.vector_store_id, VF.c.status)
            )
            for vs_id, status, count, used in grouped:
                counts[vs_id][status] = int(count)
                usage[vs_id] += int(used or 0)
        now = time.time()
        return [_store_wire(row, counts[row.id], usage[row.id], now) for row in rows]

    @guarded
    async def get_vector_store(self, vector_store_id: str, *, tenant: str) -> Json | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(VS).where(VS.c.id == vector_store_id, VS.c.tenant == tenant)
                )
            ).first()
            return None if row is None else (await self._wires(conn, [row]))[0]

    @guarded
    async def list_vector_stores(self, query: ListQuery, *, tenant: str) -> Page | None:
        async with self.engine.connect() as conn:
            found = await _page(conn, VS, VS.c.id, [VS.c.tenant == tenant], query)
            if found is None:
                return None
            return Page(await self._wires(conn, found[0]), found[1])

    @guarded
    async def update_vector_store(
        self, vector_store_id: str, changes: Mapping[str, Any], *, tenant: str
    ) -> bool:
        mine = and_(VS.c.id == vector_store_id, VS.c.tenant == tenant)
        async with self.engine.begin() as conn:
            row = (await conn.execute(select(VS).where(mine))).first()
            if row is None:
                return False
            values = dict(changes)
            if "metadata" in values:
                values["metadata"] = dumps(dict(values["metadata"]))
            if "expires_days" in values:
                values["expires_at"] = _expires_at(values["expires_days"], row.last_active_at)
            if values:
                await conn.execute(update(VS).where(mine).values(**values))
        return True

    @guarded
    async def delete_vector_store(self, vector_store_id: str, *, tenant: str) -> bool:
        async with self.engine.begin() as conn:
            gone = await conn.execute(
                delete(VS).where(VS.c.id == vector_store_id, VS.c.tenant == tenant)
            )
            if not gone.rowcount:
                return False
            for table in (CHUNKS, VF, BATCHES):
                await conn.execute(delete(table).where(table.c.vector_store_id == vector_store_id))
        return True

    @guarded
    async def touch_vector_store(self, vector_store_id: str, now: int) -> None:
        async with self.engine.begin() as conn:
            row = (await conn.execute(select(VS).where(VS.c.id == vector_store_id))).first()
            if row is not None and not row.expired:
                await conn.execute(
                    update(VS)
                    .where(VS.c.id == vector_store_id)
                    .values(last_active_at=now, expires_at=_expires_at(row.expires_days, now))
                )

    # ---- files ------------------------------------------------------------------------

    @guarded
    async def add_vector_files(
        self,
        vector_store_id: str,
        files: Sequence[NewVectorFile],
        *,
        tenant: str,
        batch_id: str | None = None,
    ) -> None:
        async with self.engine.begin() as conn:
            await _add_files(conn, vector_store_id, files, tenant, batch_id)

    def _file_where(self, vector_store_id: str, file_id: str, tenant: str) -> ColumnElement[bool]:
        return and_(
            VF.c.vector_store_id == vector_store_id, VF.c.file_id == file_id, VF.c.tenant == tenant
        )

    @guarded
    async def get_vector_file(
        self, vector_store_id: str, file_id: str, *, tenant: str
    ) -> Json | None:
        where = self._file_where(vector_store_id, file_id, tenant)
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(VF).where(where))).first()
        return None if row is None else _file_wire(row)

    @guarded
    async def list_vector_files(
        self,
        vector_store_id: str,
        query: ListQuery,
        *,
        tenant: str,
        status: str | None = None,
        batch_id: str | None = None,
    ) -> Page | None:
        where = [VF.c.vector_store_id == vector_store_id, VF.c.tenant == tenant]
        if status is not None:
            where.append(VF.c.status == status)
        if batch_id is not None:
            where.append(VF.c.batch_id == batch_id)
        async with self.engine.connect() as conn:
            found = await _page(conn, VF, VF.c.file_id, where, query)
        if found is None:
            return None
        return Page([_file_wire(row) for row in found[0]], found[1])

    @guarded
    async def update_vector_file(
        self, vector_store_id: str, file_id: str, attributes: Json, *, tenant: str
    ) -> Json | None:
        where = self._file_where(vector_store_id, file_id, tenant)
        async with self.engine.begin() as conn:
            await conn.execute(update(VF).where(where).values(attributes=dumps(attributes)))
            row = (await conn.execute(select(VF).where(where))).first()
        return None if row is None else _file_wire(row)

    @guarded
    async def delete_vector_file(self, vector_store_id: str, file_id: str, *, tenant: str) -> bool:
        async with self.engine.begin() as conn:
            gone = await conn.execute(
                delete(VF).where(self._file_where(vector_store_id, file_id, tenant))
            )
            if not gone.rowcount:
                return False
            await conn.execute(
                delete(CHUNKS).where(
                    CHUNKS.c.vector_store_id == vector_store_id, CHUNKS.c.file_id == file_id
                )
            )
            await conn.execute(update(VS).where(VS.c.id == vector_store_id).values(**_BUMP))
        return True

    @guarded
    async def vector_file_chunks(self, vector_store_id: str, file_id: str) -> list[str]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(CHUNKS.c.text)
                .where(CHUNKS.c.vector_store_id == vector_store_id, CHUNKS.c.file_id == file_id)
                .order_by(CHUNKS.c.position)
            )
            return [row.text for row in rows]

    # ---- batches ----------------------------------------------------------------------

    @guarded
    async def create_file_batch(
        self, vector_store_id: str, batch_id: str, created_at: int, *, tenant: str
    ) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(BATCHES).values(
                    id=batch_id,
                    vector_store_id=vector_store_id,
                    tenant=tenant,
                    created_at=created_at,
                    cancelled=False,
                )
            )

    @guarded
    async def get_file_batch(
        self, vector_store_id: str, batch_id: str, *, tenant: str
    ) -> Json | None:
        mine = and_(
            BATCHES.c.id == batch_id,
            BATCHES.c.vector_store_id == vector_store_id,
            BATCHES.c.tenant == tenant,
        )
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(BATCHES).where(mine))).first()
            if row is None:
                return None
            grouped = await conn.execute(
                select(VF.c.status, func.count())
                .where(VF.c.batch_id == batch_id)
                .group_by(VF.c.status)
            )
            counts = {status: int(count) for status, count in grouped}
        file_counts = {s: counts.get(s, 0) for s in _COUNTED}
        status = (
            "cancelled"
            if row.cancelled
            else "in_progress"
            if file_counts["in_progress"]
            else "completed"
        )
        return {
            "id": row.id,
            "object": "vector_store.files_batch",
            "created_at": row.created_at,
            "vector_store_id": row.vector_store_id,
            "status": status,
            "file_counts": {**file_counts, "total": sum(file_counts.values())},
        }

    @guarded
    async def cancel_file_batch(self, vector_store_id: str, batch_id: str, *, tenant: str) -> bool:
        mine = and_(
            BATCHES.c.id == batch_id,
            BATCHES.c.vector_store_id == vector_store_id,
            BATCHES.c.tenant == tenant,
        )
        async with self.engine.begin() as conn:
            done = await conn.execute(update(BATCHES).where(mine).values(cancelled=True))
            if not done.rowcount:
                return False
            await conn.execute(
                update(VF)
                .where(VF.c.batch_id == batch_id, VF.c.status == "in_progress")
                .values(status="cancelled")
            )
        return True

    # ---- search -----------------------------------------------------------------------

    @guarded
    async def searchable_files(self, vector_store_id: str) -> dict[str, tuple[str, Json]]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(VF.c.file_id, VF.c.attributes, files.c.filename)
                .join(files, files.c.id == VF.c.file_id)
                .where(VF.c.vector_store_id == vector_store_id, VF.c.status == "completed")
            )
            return {row.file_id: (row.filename, json.loads(row.attributes)) for row in rows}

    @guarded
    async def search_chunks(
        self, vector_store_id: str, words: Sequence[str], file_ids: Sequence[str] | None, limit: int
    ) -> list[Hit]:
        if not words or (file_ids is not None and not file_ids):
            return []
        only = "" if file_ids is None else " AND c.file_id IN :ids"
        if self.engine.dialect.name == "postgresql":
            statement = text(
                "SELECT c.id, c.file_id, c.text, ts_rank_cd(c.tsv, q) AS rank "
                "FROM vector_chunks c, websearch_to_tsquery('simple', :q) q "
                f"WHERE c.tsv @@ q AND c.vector_store_id = :vs{only} "
                "ORDER BY rank DESC, c.id LIMIT :n"
            )
            match = " or ".join(words)
        else:
            statement = text(
                "SELECT c.id, c.file_id, c.text, -bm25(vector_chunks_fts) AS rank "
                "FROM vector_chunks_fts JOIN vector_chunks c ON c.id = vector_chunks_fts.rowid "
                f"WHERE vector_chunks_fts MATCH :q AND c.vector_store_id = :vs{only} "
                "ORDER BY rank DESC, c.id LIMIT :n"
            )
            match = " OR ".join(f'"{w}"' for w in words)
        params: dict[str, Any] = {"q": match, "vs": vector_store_id, "n": limit}
        return await self._hits(statement, params, file_ids)

    @guarded
    async def vector_store_embedding(self, vector_store_id: str) -> EmbeddedBy | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(VS.c.embedding_model, VS.c.dimensions).where(VS.c.id == vector_store_id)
                )
            ).first()
        return _embedded_by(row)

    @guarded
    async def search_vectors(
        self, vector_store_id: str, query: bytes, file_ids: Sequence[str] | None, limit: int
    ) -> list[Hit]:
        if file_ids is not None and not file_ids:
            return []
        if await self._compared_in_database():
            return await self._nearest_in_database(vector_store_id, query, file_ids, limit)
        matrix = await self._matrix(vector_store_id)
        if not len(matrix.ids):
            return []
        similar = matrix.rows @ np.frombuffer(query, "<f4")
        if file_ids is not None:
            similar = np.where(np.isin(matrix.files, list(file_ids)), similar, -np.inf)
        k = min(limit, len(similar))
        top = np.argpartition(-similar, k - 1)[:k]
        top = top[np.lexsort((matrix.ids[top], -similar[top]))]
        top = top[np.isfinite(similar[top])]
        ids = [int(i) for i in matrix.ids[top]]
        async with self.engine.connect() as conn:
            found = await conn.execute(
                select(CHUNKS.c.id, CHUNKS.c.text).where(CHUNKS.c.id.in_(ids))
            )
            texts = {row.id: row.text for row in found}
        return [
            Hit(i, str(matrix.files[t]), texts[i], float(similar[t]))
            for i, t in zip(ids, top, strict=True)
            if i in texts  # (a chunk deleted since the copy was read)
        ]

    async def _nearest_in_database(
        self, vector_store_id: str, query: bytes, file_ids: Sequence[str] | None, limit: int
    ) -> list[Hit]:
        only = "" if file_ids is None else " AND file_id IN :ids"
        # the query's vector made once: a prepared statement's generic plan cast it again for
        # every row (10 times slower, from a statement's sixth run)
        statement = text(
            "WITH q AS MATERIALIZED (SELECT CAST(CAST(:q AS text) AS vector) AS v) "
            "SELECT id, file_id, text, 1 - (embedding <=> q.v) AS rank FROM vector_chunks, q "
            f"WHERE vector_store_id = :vs AND embedding IS NOT NULL{only} "
            "ORDER BY embedding <=> q.v, id LIMIT :n"
        )
        params: dict[str, Any] = {"q": _pgvector(query), "vs": vector_store_id, "n": limit}
        return await self._hits(statement, params, file_ids)

    async def _hits(
        self, statement: Any, params: dict[str, Any], file_ids: Sequence[str] | None
    ) -> list[Hit]:
        """The chunks a ranking statement finds (`id, file_id, text, rank`), of `file_ids`
        only (its `:ids`) if given."""
        if file_ids is not None:
            statement = statement.bindparams(bindparam("ids", expanding=True))
            params["ids"] = list(file_ids)
        async with self.engine.connect() as conn:
            rows = await conn.execute(statement, params)
            return [Hit(row.id, row.file_id, row.text, float(row.rank)) for row in rows]

    async def _compared_in_database(self) -> bool:
        """Whether the chunks' vectors are pgvector's (else float32 bytes, for numpy)."""
        known: bool | None = getattr(self, "_in_database", None)
        if known is None:
            known = False
            if self.engine.dialect.name == "postgresql":
                async with self.engine.connect() as conn:
                    kind = (await conn.execute(text(_VECTOR_TYPE_SQL))).scalar()
                known = kind == "vector"
            self._in_database = known
        return known

    async def _matrix(self, vector_store_id: str) -> _Matrix:
        """The store's vectors, read again only when its chunks changed since."""
        kept: OrderedDict[str, _Matrix] = self.__dict__.setdefault("_matrices", OrderedDict())
        async with self.engine.connect() as conn:
            version = (
                await conn.execute(select(VS.c.chunks_version).where(VS.c.id == vector_store_id))
            ).scalar()
            held = kept.get(vector_store_id)
            if held is not None and held.version == version:
                kept.move_to_end(vector_store_id)
                return held
            rows = (
                await conn.execute(
                    text(
                        "SELECT id, file_id, embedding FROM vector_chunks WHERE "
                        "vector_store_id = :vs AND embedding IS NOT NULL ORDER BY id"
                    ),
                    {"vs": vector_store_id},
                )
            ).all()
        matrix = _Matrix(
            int(version or 0),
            np.array([row.id for row in rows], dtype=np.int64),
            np.array([row.file_id for row in rows], dtype=np.str_),
            np.frombuffer(b"".join(bytes(row.embedding) for row in rows), "<f4")
            .reshape(len(rows), -1)
            .astype(np.float32)
            if rows
            else np.zeros((0, 0), np.float32),
        )
        kept[vector_store_id] = matrix
        while sum(m.rows.nbytes for m in kept.values()) > _MATRIX_BYTES and len(kept) > 1:
            kept.popitem(last=False)
        return matrix

    # ---- upkeep -----------------------------------------------------------------------

    @guarded
    async def pending_vector_files(self, *, limit: int) -> list[Pending]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(VF, files.c.filename)
                .join(files, files.c.id == VF.c.file_id)
                .where(VF.c.status == "in_progress")
                .order_by(VF.c.created_ns)
                .limit(limit)
            )
            return [
                Pending(
                    row.vector_store_id,
                    row.file_id,
                    row.created_ns,
                    row.filename,
                    json.loads(row.chunking),
                )
                for row in rows
            ]

    def _pending_where(self, pending: Pending) -> ColumnElement[bool]:
        return and_(
            VF.c.vector_store_id == pending.vector_store_id,
            VF.c.file_id == pending.file_id,
            VF.c.created_ns == pending.created_ns,
            VF.c.status == "in_progress",
        )

    @guarded
    async def index_vector_file(
        self,
        pending: Pending,
        chunks: Sequence[tuple[str, int]],
        tokenizer: str,
        vectors: ChunkVectors | None = None,
    ) -> bool:
        of_file = and_(
            CHUNKS.c.vector_store_id == pending.vector_store_id,
            CHUNKS.c.file_id == pending.file_id,
        )
        usage = sum(len(chunk.encode()) for chunk, _ in chunks)
        pgvector = await self._compared_in_database()
        async with self.engine.begin() as conn:
            marked = await conn.execute(
                update(VF)
                .where(self._pending_where(pending))
                .values(status="completed", usage_bytes=usage, tokenizer=tokenizer)
            )
            if not marked.rowcount:
                return False
            await conn.execute(delete(CHUNKS).where(of_file))  # a crashed attempt's, if any
            store = VS.c.id == pending.vector_store_id
            await conn.execute(update(VS).where(store).values(**_BUMP))
            if vectors is not None:
                by = vectors.by
                empty = (
                    ~select(CHUNKS.c.id)
                    .where(CHUNKS.c.vector_store_id == pending.vector_store_id)
                    .exists()
                )
                await conn.execute(
                    update(VS)
                    .where(store, VS.c.embedding_model.is_(None), empty)
                    .values(embedding_model=by.model, dimensions=by.dimensions)
                )
            held = (
                await conn.execute(select(VS.c.embedding_model, VS.c.dimensions).where(store))
            ).first()
            model = _embedded_by(held)
            if model is None:
                vectors = None  # (a store of keywords alone stays so)
            elif vectors is None or vectors.by != model:
                raise WrongEmbedding(model, None if vectors is None else vectors.by)
            rows: list[dict[str, Any]] = [
                {
                    "vs": pending.vector_store_id,
                    "file": pending.file_id,
                    "position": i,
                    "text": chunk,
                    "tokens": tokens,
                    "embedding": None if vectors is None else vectors.rows[i],
                }
                for i, (chunk, tokens) in enumerate(chunks)
            ]
            if pgvector:
                for row in rows:
                    row["embedding"] = _pgvector(row["embedding"])
            embedding = "CAST(CAST(:embedding AS text) AS vector)" if pgvector else ":embedding"
            if rows:
                await conn.execute(
                    text(
                        "INSERT INTO vector_chunks "
                        "(vector_store_id, file_id, position, text, tokens, embedding) "
                        f"VALUES (:vs, :file, :position, :text, :tokens, {embedding})"
                    ),
                    rows,
                )
        return True

    @guarded
    async def fail_vector_file(self, pending: Pending, code: str, message: str) -> None:
        error = dumps({"code": code, "message": message})
        async with self.engine.begin() as conn:
            await conn.execute(
                update(VF)
                .where(self._pending_where(pending))
                .values(status="failed", last_error=error)
            )

    @guarded
    async def expire_vector_stores(self, now: float) -> int:
        past = and_(VS.c.expired.is_(False), VS.c.expires_at.is_not(None), VS.c.expires_at <= now)
        async with self.engine.begin() as conn:
            ids = [row.id for row in await conn.execute(select(VS.c.id).where(past))]
            if ids:
                await conn.execute(update(VS).where(VS.c.id.in_(ids)).values(expired=True, **_BUMP))
                await conn.execute(delete(CHUNKS).where(CHUNKS.c.vector_store_id.in_(ids)))
        return len(ids)


async def _add_files(
    conn: AsyncConnection,
    vector_store_id: str,
    added: Sequence[NewVectorFile],
    tenant: str,
    batch_id: str | None,
) -> None:
    """Add (or add again) files as `in_progress`: a file added again loses its chunks."""
    if not added:
        return
    ids = [f.file_id for f in added]
    here = and_(VF.c.vector_store_id == vector_store_id, VF.c.file_id.in_(ids))
    await conn.execute(delete(VF).where(here))
    await conn.execute(
        delete(CHUNKS).where(CHUNKS.c.vector_store_id == vector_store_id, CHUNKS.c.file_id.in_(ids))
    )
    await conn.execute(update(VS).where(VS.c.id == vector_store_id).values(**_BUMP))
    now = time.time_ns()
    await conn.execute(
        insert(VF),
        [
            {
                "vector_store_id": vector_store_id,
                "file_id": f.file_id,
                "tenant": tenant,
                "created_ns": now + i,
                "batch_id": batch_id,
                "status": "in_progress",
                "last_error": None,
                "attributes": dumps(f.attributes),
                "chunking": dumps(f.chunking),
                "usage_bytes": 0,
                "tokenizer": None,
            }
            for i, f in enumerate(added)
        ],
    )


async def forget_file(conn: AsyncConnection, file_id: str) -> None:
    """Take a deleted file out of every vector store, in the order indexing takes its locks
    (the file's rows, its chunks, then the stores), so that the two never wait on each
    other."""
    holding = select(VF.c.vector_store_id).where(VF.c.file_id == file_id)
    stores = [row.vector_store_id for row in await conn.execute(holding)]
    await conn.execute(delete(VF).where(VF.c.file_id == file_id))
    await conn.execute(delete(CHUNKS).where(CHUNKS.c.file_id == file_id))
    if stores:
        await conn.execute(update(VS).where(VS.c.id.in_(stores)).values(**_BUMP))
