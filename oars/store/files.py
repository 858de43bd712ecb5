"""Files' rows on SQL (the `files` table): the part of `SqlStore` that keeps what `/v1/files`
uploaded. The bytes are not here but on disk (`oars.blobs`); a row is written after its bytes
and deleted before them, so a row always names bytes that are there."""

from __future__ import annotations

from typing import Any

from sqlalchemy import ColumnElement, and_, delete, insert, or_, select, true, tuple_
from sqlalchemy.ext.asyncio import AsyncEngine

from oars.store.base import FileQuery, Page, StoredFile
from oars.store.schema import files
from oars.store.transactions import guarded
from oars.store.vectors import forget_file


def _file(row: Any) -> StoredFile:
    return StoredFile(
        row.id,
        row.bytes,
        row.created_ns,
        row.filename,
        row.purpose,
        row.expires_at,
        row.tenant,
    )


_ORDER = (files.c.created_ns, files.c.id)  # upload order; the id breaks a tie


class FileRows:
    """`Reads`' files, for `SqlStore` (whose `engine` it uses)."""

    engine: AsyncEngine

    @guarded
    async def create_file(self, file: StoredFile) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(files).values(
                    id=file.id,
                    tenant=file.tenant,
                    created_ns=file.created_ns,
                    expires_at=file.expires_at,
                    bytes=file.bytes,
                    filename=file.filename,
                    purpose=file.purpose,
                )
            )

    @guarded
    async def get_file(self, file_id: str) -> StoredFile | None:
        async with self.engine.connect() as conn:
            row = (await conn.execute(select(files).where(files.c.id == file_id))).first()
        return None if row is None else _file(row)

    @guarded
    async def list_files(self, query: FileQuery, *, tenant: str | None = None) -> Page | None:
        mine = files.c.tenant == tenant if tenant is not None else true()
        # as `StoredFile.expired`: past its `expires_at`, a file is gone
        alive = or_(files.c.expires_at.is_(None), files.c.expires_at > query.now)
        where: list[ColumnElement[bool]] = [mine, alive]
        if query.purpose is not None:
            where.append(files.c.purpose == query.purpose)
        asc = query.order == "asc"
        async with self.engine.connect() as conn:
            if query.after is not None:
                cursor = (
                    await conn.execute(select(*_ORDER).where(and_(files.c.id == query.after, mine)))
                ).first()
                if cursor is None:
                    return None
                mark = tuple_(*cursor)
                where.append(tuple_(*_ORDER) > mark if asc else tuple_(*_ORDER) < mark)
            order = _ORDER if asc else tuple(column.desc() for column in _ORDER)
            statement = select(files).where(*where).order_by(*order).limit(query.limit + 1)
            rows = (await conn.execute(statement)).all()
        page = [_file(row).wire() for row in rows[: query.limit]]
        return Page(page, len(rows) > query.limit)

    @guarded
    async def expired_files(self, now: float, *, limit: int) -> list[str]:
        past = and_(files.c.expires_at.is_not(None), files.c.expires_at <= now)
        async with self.engine.connect() as conn:
            rows = await conn.execute(select(files.c.id).where(past).limit(limit))
        return [row.id for row in rows]

    @guarded
    async def delete_file(self, file_id: str) -> bool:
        async with self.engine.begin() as conn:
            gone = await conn.execute(delete(files).where(files.c.id == file_id))
            await forget_file(conn, file_id)  # and from every vector store
        return bool(gone.rowcount)
