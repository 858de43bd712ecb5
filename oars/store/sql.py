"""The store on SQL: SQLite (the default, a file) or PostgreSQL (several replicas), one code path.

`SqlStore` holds the reads and the conversations' create, update and delete, and files' rows
(`oars.store.files`); what the writer's group commit writes is `oars.store.transactions`, and
where it runs is `oars.store.lanes`. JSON is kept as compact UTF-8 text (`oars.jsonfast`), read
back as it was written. Every database failure becomes `StoreUnavailable` (503).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sqlalchemy import and_, delete, insert, select, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError

from oars.errors import StoreUnavailable
from oars.jsonfast import dumps
from oars.store.base import (
    TERMINAL_STATUSES,
    Chain,
    Conversation,
    Json,
    Page,
    StoredResponse,
    Writes,
)
from oars.store.files import FileRows
from oars.store.lanes import Lane, is_sqlite, lane_for, sql_engine
from oars.store.schema import (
    conversation_items,
    conversations,
    response_items,
    response_logs,
    responses,
    upgrade,
)
from oars.store.transactions import (
    add_items,
    fail_orphan,
    guarded,
    on_tx,
    one_statement,
    read_events,
    renew_leases,
    write_transaction,
)
from oars.store.vectors import VectorRows

_UNFINISHED = ("queued", "in_progress")


def database_url(spec: str) -> str:
    """`postgresql://…`, `sqlite:///path` or a plain file path → an async SQLAlchemy URL."""
    for prefix, driver in (
        ("postgresql://", "postgresql+asyncpg://"),
        ("postgres://", "postgresql+asyncpg://"),
        ("sqlite://", "sqlite+aiosqlite://"),
    ):
        if spec.startswith(prefix):
            return driver + spec[len(prefix) :]
    if "://" in spec:
        return spec
    return f"sqlite+aiosqlite:///{Path(spec).expanduser().resolve()}"


def _page(items: list[Json], *, after: str | None, limit: int | None, order: str) -> Page | None:
    if order == "desc":
        items = items[::-1]
    if after is not None:
        ids = [i.get("id") for i in items]
        if after not in ids:
            return None
        items = items[ids.index(after) + 1 :]
    if limit is None:
        return Page(items, False)
    return Page(items[:limit], len(items) > limit)


class SqlStore(FileRows, VectorRows):
    """`Store` on SQLAlchemy's async engine (aiosqlite or asyncpg)."""

    def __init__(self, spec: str) -> None:
        """Nothing connects until `open()` (which must run on the loop that serves)."""
        self.url = database_url(spec)
        if is_sqlite(self.url):
            Path(str(make_url(self.url).database)).parent.mkdir(parents=True, exist_ok=True)
        self.engine = sql_engine(self.url)
        self._lane: Lane | None = None  # where `write` runs, from the first

    async def open(self) -> None:
        """Create or upgrade the schema."""
        try:
            await upgrade(self.engine)
        except (SQLAlchemyError, OSError, TimeoutError, ConnectionError) as exc:
            raise StoreUnavailable(f"Cannot open the response store: {exc}") from exc

    async def close(self) -> None:
        if self._lane is not None:
            await self._lane.close()
            self._lane = None
        await self.engine.dispose()

    # ---- responses ----------------------------------------------------------------------

    @guarded
    async def write(self, writes: Writes) -> None:
        lane = self._the_lane()
        run = lane.statement if one_statement(writes) else lane.transaction
        await run(write_transaction, writes)

    def _the_lane(self) -> Lane:
        if self._lane is None:
            self._lane = lane_for(self.url)
        return self._lane

    @guarded
    async def get(self, response_id: str) -> StoredResponse | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(select(responses).where(responses.c.id == response_id))
            ).first()
        if row is None:
            return None
        return StoredResponse(
            json.loads(row.snapshot),
            background=row.background,
            streamed=row.streamed,
            owner=row.owner,
            cancel_requested=row.cancel_requested,
            tenant=row.tenant,
            served_by=row.served_by,
        )

    @guarded
    async def recent(self, *, limit: int, tenant: str | None = None) -> list[Json]:
        query = (
            select(responses.c.snapshot)
            .order_by(responses.c.created_at.desc(), responses.c.id.desc())
            .limit(limit)
        )
        if tenant is not None:
            query = query.where(responses.c.tenant == tenant)
        async with self.engine.connect() as conn:
            rows = (await conn.execute(query)).all()
        return [json.loads(row.snapshot) for row in rows]

    @guarded
    async def forget_before(self, before: int, *, limit: int) -> int:
        finished = responses.c.status.in_(TERMINAL_STATUSES)
        old = select(responses.c.id).where(finished, responses.c.created_at < before)
        younger = select(responses.c.id).where(
            responses.c.conversation_id == conversations.c.id, responses.c.created_at >= before
        )
        stale = select(conversations.c.id).where(
            conversations.c.created_at < before, ~younger.exists()
        )
        async with self.engine.begin() as conn:
            ids = [row.id for row in await conn.execute(old.limit(limit))]
            if ids:
                for table in (response_items, response_logs):
                    await conn.execute(delete(table).where(table.c.response_id.in_(ids)))
                await conn.execute(delete(responses).where(responses.c.id.in_(ids)))
            talks = [row.id for row in await conn.execute(stale.limit(limit))]
            if talks:
                items = conversation_items.c.conversation_id
                await conn.execute(delete(conversation_items).where(items.in_(talks)))
                await conn.execute(delete(conversations).where(conversations.c.id.in_(talks)))
        return len(ids) + len(talks)

    @guarded
    async def delete(self, response_id: str) -> bool:
        async with self.engine.begin() as conn:
            gone = await conn.execute(delete(responses).where(responses.c.id == response_id))
            for table in (response_items, response_logs):
                await conn.execute(delete(table).where(table.c.response_id == response_id))
        return bool(gone.rowcount)

    async def _items(self, response_id: str, kind: str) -> list[Json]:
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(response_items.c.item)
                .where(
                    and_(response_items.c.response_id == response_id, response_items.c.kind == kind)
                )
                .order_by(response_items.c.position)
            )
            return [json.loads(r.item) for r in rows]

    @guarded
    async def input_items(
        self, response_id: str, *, after: str | None, limit: int, order: str
    ) -> Page | None:
        if await self.get(response_id) is None:
            return None
        page = _page(await self._items(response_id, "input"), after=after, limit=limit, order=order)
        return page if page is not None else Page([], False)

    @guarded
    async def context(self, response_id: str) -> Chain | None:
        stored = await self.get(response_id)
        if stored is None:
            return None
        items = await self._items(response_id, "input") + await self._items(response_id, "output")
        return Chain(items, stored.served_by)

    @guarded
    async def find_items(
        self, item_ids: Sequence[str], *, tenant: str | None = None
    ) -> dict[str, Json]:
        if not item_ids:
            return {}
        found: dict[str, Json] = {}
        owners = (
            (response_items, responses, response_items.c.response_id),
            (conversation_items, conversations, conversation_items.c.conversation_id),
        )
        async with self.engine.connect() as conn:
            for table, parent, parent_id in owners:
                query = select(table.c.item_id, table.c.item).where(
                    table.c.item_id.in_(list(item_ids))
                )
                if tenant is not None:
                    query = query.join(parent, parent.c.id == parent_id).where(
                        parent.c.tenant == tenant
                    )
                rows = await conn.execute(query)
                for row in rows:
                    found.setdefault(row.item_id, json.loads(row.item))
        return found

    @guarded
    async def events(self, response_id: str, *, after: int) -> list[Json]:
        async with self.engine.connect() as conn:
            return await conn.run_sync(read_events, response_id, after)

    @guarded
    async def request_cancel(self, response_id: str) -> StoredResponse | None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(responses)
                .where(and_(responses.c.id == response_id, responses.c.status.in_(_UNFINISHED)))
                .values(cancel_requested=True)
            )
        return await self.get(response_id)

    @guarded
    async def heartbeat(
        self, owner: str, response_ids: Sequence[str], *, lease_seconds: float
    ) -> list[str]:
        if not response_ids:
            return []
        until = time.time() + lease_seconds
        if is_sqlite(self.url):
            # In the writer's lane: through the engine it held SQLite's one lock across the
            # loop's turns (each statement a hop to its thread and back), and every held log
            # (`oars.eventlog`) waited meanwhile. PostgreSQL's lane would open a connection
            # for it beside the writer's two (at one stream, +7 ms at the p99 between deltas).
            return await self._the_lane().transaction(renew_leases, owner, response_ids, until)
        async with self.engine.begin() as conn:
            return await conn.run_sync(on_tx(renew_leases), owner, response_ids, until)

    @guarded
    async def fail_orphans(self, *, owner: str | None) -> list[str]:
        whose = (
            responses.c.owner == owner
            if owner is not None
            else responses.c.lease_until < time.time()
        )
        cond = and_(responses.c.status.in_(_UNFINISHED), whose)
        failed: list[str] = []
        async with self.engine.begin() as conn:
            rows = (
                await conn.execute(
                    select(responses.c.id, responses.c.snapshot)
                    .where(cond)
                    .with_for_update(skip_locked=True)
                )
            ).all()
            for row in rows:
                await conn.run_sync(fail_orphan, row.id, json.loads(row.snapshot))
                failed.append(row.id)
        return failed

    # ---- conversations ------------------------------------------------------------------

    @guarded
    async def create_conversation(self, conversation: Conversation, items: Sequence[Json]) -> None:
        async with self.engine.begin() as conn:
            await conn.execute(
                insert(conversations).values(
                    id=conversation.id,
                    created_at=conversation.created_at,
                    metadata=dumps(dict(conversation.metadata)),
                    tenant=conversation.tenant,
                )
            )
            await conn.run_sync(on_tx(add_items), conversation.id, items)

    @guarded
    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(conversations).where(conversations.c.id == conversation_id)
                )
            ).first()
        if row is None:
            return None
        return Conversation(
            row.id, row.created_at, json.loads(row.metadata), row.tenant, row.served_by
        )

    @guarded
    async def update_conversation(
        self, conversation_id: str, metadata: Mapping[str, str]
    ) -> Conversation | None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(conversations)
                .where(conversations.c.id == conversation_id)
                .values(metadata=dumps(dict(metadata)))
            )
        return await self.get_conversation(conversation_id)

    @guarded
    async def delete_conversation(self, conversation_id: str) -> bool:
        async with self.engine.begin() as conn:
            gone = await conn.execute(
                delete(conversations).where(conversations.c.id == conversation_id)
            )
            await conn.execute(
                delete(conversation_items).where(
                    conversation_items.c.conversation_id == conversation_id
                )
            )
        return bool(gone.rowcount)

    @guarded
    async def conversation_items(
        self,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int | None = None,
        order: str = "asc",
    ) -> Page | None:
        if await self.get_conversation(conversation_id) is None:
            return None
        async with self.engine.connect() as conn:
            rows = await conn.execute(
                select(conversation_items.c.item)
                .where(conversation_items.c.conversation_id == conversation_id)
                .order_by(conversation_items.c.position)
            )
            items = [json.loads(r.item) for r in rows]
        page = _page(items, after=after, limit=limit, order=order)
        return page if page is not None else Page([], False)

    @guarded
    async def add_conversation_items(self, conversation_id: str, items: Sequence[Json]) -> bool:
        async with self.engine.begin() as conn:
            exists = (
                await conn.execute(
                    select(conversations.c.id).where(conversations.c.id == conversation_id)
                )
            ).first()
            if exists is None:
                return False
            await conn.run_sync(on_tx(add_items), conversation_id, items)
        return True

    @guarded
    async def get_conversation_item(self, conversation_id: str, item_id: str) -> Json | None:
        async with self.engine.connect() as conn:
            row = (
                await conn.execute(
                    select(conversation_items.c.item).where(
                        and_(
                            conversation_items.c.conversation_id == conversation_id,
                            conversation_items.c.item_id == item_id,
                        )
                    )
                )
            ).first()
        return None if row is None else dict(json.loads(row.item))

    @guarded
    async def delete_conversation_item(self, conversation_id: str, item_id: str) -> bool:
        async with self.engine.begin() as conn:
            gone = await conn.execute(
                delete(conversation_items).where(
                    and_(
                        conversation_items.c.conversation_id == conversation_id,
                        conversation_items.c.item_id == item_id,
                    )
                )
            )
        return bool(gone.rowcount)
