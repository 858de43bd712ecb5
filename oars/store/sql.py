"""The store on SQL: SQLite (the default, a file) or PostgreSQL (several replicas), one code path.

JSON is kept as compact UTF-8 text (`oars.jsonfast`), read back as it was written. Every database
failure becomes `StoreUnavailable` (503).

`write` (the writer's group commit, `oars.writer`) runs in a lane: a thread of its own, with an
engine of its own. On the serving loop each statement of a transaction was a round trip to the
driver that waited its turn behind every stream's chunks (at 64 paced streams, 4-6 statements per
ending made transactions of 180-220 ms, and a new response waited behind them); there the loop
waits for one answer per transaction. SQLite's lane is a plain blocking connection (aiosqlite
would add a thread hop per statement), PostgreSQL's an event loop running asyncpg. What a
transaction writes is plain functions of a `_Tx`, the same for both lanes and for the serving
loop's engine (through `run_sync`): statements built once with SQLAlchemy, compiled once per
dialect, and run on the driver's cursor. Run through SQLAlchemy's connection, the writer's
transactions cost 3-5 times the CPU (`bench.store_writes`), all of it holding the GIL beside
the serving loop.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import (
    ClauseElement,
    Connection,
    Dialect,
    and_,
    bindparam,
    delete,
    event,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.sql.compiler import SQLCompiler

from oars.errors import StoreUnavailable
from oars.events.orphan import orphan_ending
from oars.jsonfast import dumps as _dumps
from oars.jsonfast import loads
from oars.store.base import (
    Chain,
    Conversation,
    Finished,
    Json,
    Logged,
    NewResponse,
    Page,
    StoredResponse,
    Writes,
)
from oars.store.schema import (
    conversation_items,
    conversations,
    response_items,
    response_logs,
    responses,
    upgrade,
)

log = logging.getLogger("oars.store")

P = ParamSpec("P")
T = TypeVar("T")

_UNFINISHED = ("queued", "in_progress")


def dumps(value: Any) -> str:
    return _dumps(value)


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


def _guard(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    @functools.wraps(method)
    async def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except (SQLAlchemyError, OSError, TimeoutError, ConnectionError) as exc:
            raise _unavailable(exc) from exc

    return guarded


def _unavailable(exc: Exception) -> StoreUnavailable:
    return StoreUnavailable(f"The response store is unavailable: {type(exc).__name__}")


def _item_rows(response_id: str, kind: str, items: Sequence[Json]) -> list[dict[str, Any]]:
    return [
        {
            "response_id": response_id,
            "kind": kind,
            "position": i,
            "item_id": item["id"],
            "item": dumps(item),
        }
        for i, item in enumerate(items)
    ]


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


class SqlStore:
    """`Store` on SQLAlchemy's async engine (aiosqlite or asyncpg)."""

    def __init__(self, spec: str) -> None:
        """Nothing connects until `open()` (which must run on the loop that serves)."""
        self.url = database_url(spec)
        if _is_sqlite(self.url):
            Path(str(make_url(self.url).database)).parent.mkdir(parents=True, exist_ok=True)
        self.engine = _engine(self.url)
        self._lane: _SqliteLane | _LoopLane | None = None  # where `write` runs, from the first

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

    @_guard
    async def write(self, writes: Writes) -> None:
        if self._lane is None:
            self._lane = _SqliteLane(self.url) if _is_sqlite(self.url) else _LoopLane(self.url)
        await self._lane.transaction(_write, writes)

    @_guard
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

    @_guard
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

    @_guard
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

    @_guard
    async def input_items(
        self, response_id: str, *, after: str | None, limit: int, order: str
    ) -> Page | None:
        if await self.get(response_id) is None:
            return None
        page = _page(await self._items(response_id, "input"), after=after, limit=limit, order=order)
        return page if page is not None else Page([], False)

    @_guard
    async def context(self, response_id: str) -> Chain | None:
        stored = await self.get(response_id)
        if stored is None:
            return None
        items = await self._items(response_id, "input") + await self._items(response_id, "output")
        return Chain(items, stored.served_by)

    @_guard
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

    @_guard
    async def events(self, response_id: str, *, after: int) -> list[Json]:
        async with self.engine.connect() as conn:
            return await conn.run_sync(_events, response_id, after)

    @_guard
    async def request_cancel(self, response_id: str) -> StoredResponse | None:
        async with self.engine.begin() as conn:
            await conn.execute(
                update(responses)
                .where(and_(responses.c.id == response_id, responses.c.status.in_(_UNFINISHED)))
                .values(cancel_requested=True)
            )
        return await self.get(response_id)

    @_guard
    async def heartbeat(
        self, owner: str, response_ids: Sequence[str], *, lease_seconds: float
    ) -> list[str]:
        if not response_ids:
            return []
        mine = and_(responses.c.id.in_(list(response_ids)), responses.c.owner == owner)
        async with self.engine.begin() as conn:
            await conn.execute(
                update(responses).where(mine).values(lease_until=time.time() + lease_seconds)
            )
            rows = await conn.execute(
                select(responses.c.id).where(and_(mine, responses.c.cancel_requested))
            )
            return [r.id for r in rows]

    @_guard
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
                await conn.run_sync(_fail_orphan, row.id, json.loads(row.snapshot))
                failed.append(row.id)
        return failed

    # ---- conversations ------------------------------------------------------------------

    @_guard
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
            await conn.run_sync(_on_tx(_add_items), conversation.id, items)

    @_guard
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

    @_guard
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

    @_guard
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

    @_guard
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

    @_guard
    async def add_conversation_items(self, conversation_id: str, items: Sequence[Json]) -> bool:
        async with self.engine.begin() as conn:
            exists = (
                await conn.execute(
                    select(conversations.c.id).where(conversations.c.id == conversation_id)
                )
            ).first()
            if exists is None:
                return False
            await conn.run_sync(_on_tx(_add_items), conversation_id, items)
        return True

    @_guard
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

    @_guard
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


# ---- what is written in one transaction: plain functions of a connection, run in a lane (the
# writer's transactions) or through `run_sync` on the serving loop's engine ----------------------


def _write(tx: _Tx, writes: Writes) -> None:
    """One transaction in a few statements, however many responses it carries."""
    if writes.begun:
        _begin(tx, writes.begun)
    _log(tx, writes.logged)
    moved = [(m.response_id, m.snapshot) for m in writes.logged if m.snapshot is not None]
    if moved:
        tx.execute(
            _SET_SNAPSHOT,
            [
                {"_id": response_id, "_status": snapshot["status"], "_snapshot": dumps(snapshot)}
                for response_id, snapshot in moved
            ],
        )
    if writes.finished:
        _end(tx, writes.finished)


def _begin(tx: _Tx, begun: Sequence[NewResponse]) -> None:
    now = time.time()
    tx.execute(
        _INSERT_RESPONSES,
        [
            {
                "id": new.response.id,
                "status": new.response.status,
                "background": new.response.background,
                "streamed": new.response.streamed,
                "owner": new.response.owner,
                "lease_until": now + new.lease_seconds,
                "cancel_requested": False,
                "conversation_id": new.conversation_id,
                "created_at": int(new.response.snapshot["created_at"]),
                "snapshot": dumps(new.response.snapshot),
                "tenant": new.response.tenant,
            }
            for new in begun
        ],
    )
    rows = [row for new in begun for row in _item_rows(new.response.id, "input", new.input_items)]
    if rows:
        tx.execute(_INSERT_ITEMS, rows)


def _log(tx: _Tx, logged: Sequence[Logged]) -> None:
    """Each batch of events one row."""
    rows = [
        {
            "response_id": batch.response_id,
            "first_sequence": batch.events[0]["sequence_number"],
            "last_sequence": batch.events[-1]["sequence_number"],
            "events": dumps(list(batch.events)),
        }
        for batch in logged
        if batch.events
    ]
    if rows:
        tx.execute(_INSERT_LOGS, rows)


def _end(tx: _Tx, finished: Sequence[Finished]) -> None:
    # The update comes first: it takes the rows' locks (SQLite's write lock), so that the
    # responses the select then finds stay until this commits, whoever deletes meanwhile.
    tx.execute(
        _SET_ENDING,
        [
            {
                "_id": done.response_id,
                "_status": done.snapshot["status"],
                "_snapshot": dumps(done.snapshot),
                "_served_by": done.served_by,
            }
            for done in finished
        ],
    )
    conversation_of: dict[str, str | None] = {
        row[0]: row[1] for done in finished for row in tx.execute(_KEPT, {"_id": done.response_id})
    }
    # one deleted while it ran (from another replica): leave nothing of it behind
    finished = [done for done in finished if done.response_id in conversation_of]
    if not finished:
        return
    _log(tx, [Logged(done.response_id, done.events) for done in finished])
    tx.execute(_DELETE_OUTPUTS, [{"_id": done.response_id} for done in finished])
    outputs = [
        row
        for done in finished
        for row in _item_rows(done.response_id, "output", done.snapshot["output"])
    ]
    if outputs:
        tx.execute(_INSERT_ITEMS, outputs)
    for done in finished:
        conversation_id = conversation_of[done.response_id]
        if done.conversation_items and conversation_id is not None:
            _add_items(tx, conversation_id, done.conversation_items)
            tx.execute(
                _SET_CONVERSATION_SERVER, {"_id": conversation_id, "_served_by": done.served_by}
            )


def _events(conn: Connection, response_id: str, after: int) -> list[Json]:
    rows = conn.execute(
        select(response_logs.c.events)
        .where(
            and_(
                response_logs.c.response_id == response_id,
                response_logs.c.last_sequence > after,
            )
        )
        .order_by(response_logs.c.first_sequence)
    )
    return [e for row in rows for e in loads(row.events) if e["sequence_number"] > after]


def _fail_orphan(conn: Connection, response_id: str, snapshot: Json) -> None:
    """The replica running it died: whatever it logged stays; the response ends `failed`, its
    log closed into a valid stream."""
    events = _events(conn, response_id, -1)
    streamed = conn.execute(
        select(responses.c.streamed).where(responses.c.id == response_id)
    ).scalar()
    ending, final = orphan_ending(events, snapshot, streamed=bool(streamed))
    _end(_Tx.of(conn), [Finished(response_id, final, ending)])


def _add_items(tx: _Tx, conversation_id: str, items: Sequence[Json]) -> None:
    if not items:
        return
    # Turns of one conversation may end together on several replicas: the conversation's row
    # lock orders their appends (SQLite serializes writers anyway).
    tx.execute(_LOCK_CONVERSATION, {"_conversation": conversation_id})
    [(last,)] = tx.execute(_LAST_POSITION, {"_conversation": conversation_id})
    start = 0 if last is None else int(last) + 1
    rows = [
        {
            "conversation_id": conversation_id,
            "position": start + i,
            "item_id": item["id"],
            "item": dumps(item),
        }
        for i, item in enumerate(items)
    ]
    tx.execute(_INSERT_CONVERSATION_ITEMS, rows)


# The statements of the writer's transactions, built once: a statement built per call costs more
# of SQLAlchemy's time (coercion, a cache key) than SQLite's own.
_INSERT_RESPONSES = insert(responses)
_INSERT_ITEMS = insert(response_items)
_INSERT_LOGS = insert(response_logs)
_KEPT = select(responses.c.id, responses.c.conversation_id).where(
    responses.c.id == bindparam("_id")
)
_DELETE_OUTPUTS = delete(response_items).where(
    and_(
        response_items.c.response_id == bindparam("_id"),
        response_items.c.kind == literal_column("'output'"),
    )
)
_LOCK_CONVERSATION = (
    select(conversations.c.id)
    .where(conversations.c.id == bindparam("_conversation"))
    .with_for_update()
)
_LAST_POSITION = select(func.max(conversation_items.c.position)).where(
    conversation_items.c.conversation_id == bindparam("_conversation")
)
_INSERT_CONVERSATION_ITEMS = insert(conversation_items)
_SET_CONVERSATION_SERVER = (
    update(conversations)
    .where(conversations.c.id == bindparam("_id"))
    .values(served_by=bindparam("_served_by"))
)
_SET_SNAPSHOT = (
    update(responses)
    .where(responses.c.id == bindparam("_id"))
    .values(status=bindparam("_status"), snapshot=bindparam("_snapshot"))
)
_SET_ENDING = (
    update(responses)
    .where(responses.c.id == bindparam("_id"))
    .values(
        status=bindparam("_status"),
        snapshot=bindparam("_snapshot"),
        served_by=bindparam("_served_by"),
    )
)


# ---- engines and lanes ----------------------------------------------------------------------


def _is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def _engine(url: str, pool_size: int = 10) -> AsyncEngine:
    if _is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": _BUSY_MS / 1000})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(
        url,
        pool_pre_ping=True,
        pool_size=pool_size,
        connect_args={"timeout": 10, "command_timeout": 30},
    )


class _Tx:
    """A transaction at the driver's level: `execute` runs a statement built with SQLAlchemy
    (compiled once per dialect and set of parameters) on the driver's own cursor, with rows of
    plain values. The driver's errors become `StoreUnavailable`."""

    def __init__(self, cursor: Any, dialect: Dialect, errors: type[Exception]) -> None:
        self.cursor, self.dialect, self.errors = cursor, dialect, errors

    @classmethod
    def of(cls, conn: Connection) -> _Tx:
        """The transaction `conn` (a connection of SQLAlchemy's) is in."""
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        return cls(cursor, conn.dialect, conn.dialect.loaded_dbapi.Error)

    def execute(
        self, statement: ClauseElement, params: Mapping[str, Any] | Sequence[Mapping[str, Any]]
    ) -> list[Any]:
        """Run `statement` with `params` (its rows are returned), or once for each mapping of a
        non-empty list (nothing is returned)."""
        first = params if isinstance(params, Mapping) else params[0]
        sql, names = _compiled(statement, self.dialect, tuple(first))
        try:
            if isinstance(params, Mapping):
                self.cursor.execute(sql, tuple([params[name] for name in names]))
                return list(self.cursor.fetchall()) if self.cursor.description else []
            self.cursor.executemany(sql, [tuple([row[name] for name in names]) for row in params])
            return []
        except self.errors as exc:
            raise _unavailable(exc) from exc


_COMPILED: dict[tuple[int, str, str, tuple[str, ...]], tuple[str, tuple[str, ...]]] = {}


def _compiled(
    statement: ClauseElement, dialect: Dialect, keys: tuple[str, ...]
) -> tuple[str, tuple[str, ...]]:
    """`statement`'s text for `dialect` (only the columns in `keys`, for an insert) and the names
    of its parameters, in the order the driver takes them."""
    key = (id(statement), dialect.name, dialect.paramstyle, keys)
    found = _COMPILED.get(key)
    if found is None:
        compiled = statement.compile(dialect=dialect, column_keys=list(keys))
        # every dialect here takes positional parameters
        assert isinstance(compiled, SQLCompiler) and compiled.positiontup is not None
        found = _COMPILED[key] = (str(compiled), tuple(compiled.positiontup))
    return found


def _on_tx(work: Callable[..., T]) -> Callable[..., T]:
    """`work` of a `_Tx`, run on a connection of SQLAlchemy's (through `run_sync`)."""
    return lambda conn, *args: work(_Tx.of(conn), *args)


_SQLITE = sqlite.dialect()


class _SqliteLane:
    """SQLite's lane. A transaction runs on the serving loop itself, on a connection of the
    driver's that never waits for SQLite's lock: a new response's row, a round of logs or an
    ending is 0.1-1 ms of CPU there (`bench.store_writes`), where a thread of its own made each of
    its statements wait for the GIL behind the loop (at 64 paced streams, 6-19 ms at p99 for a
    new response's 0.3 ms of work). When another connection holds the lock (the serving
    engine's, whose transactions the loop itself drives, or another process's), the transaction
    goes to the lane's thread instead, which waits for the lock: the loop never does. Each takes
    the lock as it begins (`BEGIN IMMEDIATE`): what it reads, no other connection changes
    before it commits.

    The loop does not wait for the disk either. Its connection never checkpoints the WAL (a
    checkpoint writes and syncs the database file); the thread does, at most every
    `_CHECKPOINT_SECONDS`, without holding writers back, and the transaction after a complete
    checkpoint (the one that starts the WAL over, and syncs its header) runs on the thread too.
    If the WAL still holds more than `_WAL_FRAMES` after a checkpoint (a reader or a writer
    kept it from starting over), the thread waits for it to start over, writers held back, for
    at most `_RESTART_WAIT_MS`, and not again for `_RESTART_SECONDS` (a reader that lasts, a
    backup say, must not hold the writes back again and again)."""

    def __init__(self, url: str) -> None:
        self.path = str(make_url(url).database)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="store writes")
        self._loop_conn: sqlite3.Connection | None = None
        self._thread_conn: sqlite3.Connection | None = None  # opened and used on the thread
        self._in_thread = 0  # transactions sent to the thread, not done yet
        self._checkpointed = time.monotonic()
        self._restarted = 0.0
        self._starts_over = False  # set on the thread: the next transaction starts the WAL over

    async def transaction(self, work: Callable[..., T], *args: Any) -> T:
        # after transactions on the thread: they land in the order asked
        if not self._in_thread and not self._starts_over:
            if self._loop_conn is None:
                self._loop_conn = _sqlite_connect(self.path, on_loop=True)
            done = _sqlite_transaction(self._loop_conn, work, args, wait=False)
            if done is not None:
                if time.monotonic() - self._checkpointed >= _CHECKPOINT_SECONDS:
                    self._checkpointed = time.monotonic()
                    self.thread.submit(self._checkpoint)
                return done[0]
        loop = asyncio.get_running_loop()
        sent = self.thread.submit(self.run, work, *args)
        self._in_thread += 1  # until it has run, even if its caller stops waiting
        sent.add_done_callback(lambda _: loop.call_soon_threadsafe(self._left_thread))
        return await asyncio.wrap_future(sent)

    def _left_thread(self) -> None:
        self._in_thread -= 1

    def run(self, work: Callable[..., T], *args: Any) -> T:
        """A transaction of `work`'s on the lane's thread, waiting for SQLite's lock."""
        done = _sqlite_transaction(self._on_thread(), work, args, wait=True)
        assert done is not None
        self._starts_over = False
        return done[0]

    def _on_thread(self) -> sqlite3.Connection:
        if self._thread_conn is None:
            self._thread_conn = _sqlite_connect(self.path, on_loop=False)
        return self._thread_conn

    def _checkpoint(self) -> None:
        # each statement read to its end: one left open would keep the WAL from starting over
        try:
            conn = self._on_thread()
            [(_, frames, copied)] = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            wait = time.monotonic() - self._restarted >= _RESTART_SECONDS
            if frames > _WAL_FRAMES and wait:
                self._restarted = time.monotonic()
                conn.execute(f"PRAGMA busy_timeout={_RESTART_WAIT_MS}").fetchall()
                try:
                    [(_, frames, copied)] = conn.execute(
                        "PRAGMA wal_checkpoint(RESTART)"
                    ).fetchall()
                finally:
                    conn.execute(f"PRAGMA busy_timeout={_BUSY_MS}").fetchall()
            if frames and copied == frames:
                self._starts_over = True
        except (sqlite3.Error, StoreUnavailable) as exc:  # the next may do; writes go on
            log.warning("could not checkpoint the store's WAL: %s", exc)

    async def close(self) -> None:
        if self._loop_conn is not None:
            self._loop_conn.close()
        # after whatever the thread has still to do, a checkpoint that opened its connection too
        await asyncio.get_running_loop().run_in_executor(self.thread, self._close_on_thread)
        self.thread.shutdown()

    def _close_on_thread(self) -> None:
        if self._thread_conn is not None:
            self._thread_conn.close()


_CHECKPOINT_SECONDS = 1.0
_WAL_FRAMES = 4000  # pages: 16 MB of 4 KB ones
_RESTART_WAIT_MS = 20
_RESTART_SECONDS = 10.0
_BUSY_MS = 30_000  # how long a connection waits for SQLite's lock (its driver's `timeout`)


def _sqlite_connect(path: str, *, on_loop: bool) -> sqlite3.Connection:
    """A connection of the lane's: on the loop, one that never waits for the lock and never
    checkpoints."""
    try:
        timeout = 0.0 if on_loop else _BUSY_MS / 1000
        conn = sqlite3.connect(path, timeout=timeout, isolation_level=None)
        try:
            _sqlite_pragmas(conn, None)
            if on_loop:
                conn.execute("PRAGMA wal_autocheckpoint=0")
        except sqlite3.Error:
            conn.close()
            raise
    except sqlite3.Error as exc:
        raise _unavailable(exc) from exc
    return conn


def _sqlite_transaction(
    conn: sqlite3.Connection, work: Callable[..., T], args: tuple[Any, ...], *, wait: bool
) -> tuple[T] | None:
    """`work` in a transaction on `conn` (its result, in a tuple); None if another connection
    holds the lock and `wait` is false (nothing was done)."""
    cursor = conn.cursor()
    try:
        try:
            cursor.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as exc:
            busy = exc.sqlite_errorcode & 0xFF in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)
            if busy and not wait:  # the primary code: SQLITE_BUSY_RECOVERY is busy too
                return None
            raise
        try:
            result = work(_Tx(cursor, _SQLITE, sqlite3.Error), *args)
            cursor.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
    except sqlite3.Error as exc:
        raise _unavailable(exc) from exc
    return (result,)


class _LoopLane:
    """PostgreSQL's lane: a thread running an event loop of its own, with an engine on it (the
    driver, asyncpg, is asynchronous): the serving loop waits for one answer per transaction,
    not one per statement."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.engine = _engine(url, pool_size=1)  # a transaction at a time
        self.thread = threading.Thread(target=self.loop.run_forever, name="store writes")
        self.thread.daemon = True
        self.thread.start()

    async def transaction(self, work: Callable[..., T], *args: Any) -> T:
        async def run() -> T:
            async with self.engine.begin() as conn:
                return await conn.run_sync(_on_tx(work), *args)

        return await self._on_lane(run())

    async def _on_lane(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the lane (cancelled there if its caller is cancelled)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    async def close(self) -> None:
        await self._on_lane(self.engine.dispose())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join)
        self.loop.close()


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()
