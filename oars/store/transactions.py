"""What one transaction of the store writes: plain functions of a `Tx`, the same whichever lane
runs them (`oars.store.lanes`) and on the serving loop's engine (through `run_sync`).

A `Tx` runs statements built once with SQLAlchemy, compiled once per dialect, on the driver's own
cursor. Run through SQLAlchemy's connection, the writer's transactions cost 3-5 times the CPU
(`bench.lab.store_writes`), all of it holding the GIL beside the serving loop. `write_transaction` is
the writer's group commit (`oars.writer`) as one transaction.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any, ParamSpec, TypeVar

from sqlalchemy import (
    ClauseElement,
    Connection,
    Dialect,
    Select,
    and_,
    bindparam,
    delete,
    func,
    insert,
    literal_column,
    select,
    update,
)
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter

from oars.errors import StoreUnavailable
from oars.events.orphan import orphan_ending
from oars.jsonfast import dumps, loads
from oars.store.base import Finished, Json, Logged, NewResponse, Writes
from oars.store.schema import (
    conversation_items,
    conversations,
    response_items,
    response_logs,
    responses,
)

P = ParamSpec("P")
T = TypeVar("T")


def unavailable(exc: Exception) -> StoreUnavailable:
    """What a database failure becomes: the store is unavailable (503)."""
    return StoreUnavailable(f"The response store is unavailable: {type(exc).__name__}")


def guarded(method: Callable[P, Coroutine[Any, Any, T]]) -> Callable[P, Coroutine[Any, Any, T]]:
    """A store method whose database failures are `unavailable`."""

    @functools.wraps(method)
    async def guard(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await method(*args, **kwargs)
        except (SQLAlchemyError, OSError, TimeoutError, ConnectionError) as exc:
            raise unavailable(exc) from exc

    return guard


class Tx:
    """A transaction at the driver's level: `execute` runs a statement built with SQLAlchemy
    (compiled once per dialect and set of parameters) on the driver's own cursor, with rows of
    plain values. The driver's errors become `StoreUnavailable`."""

    def __init__(
        self,
        cursor: Any,
        dialect: Dialect,
        errors: type[Exception] | tuple[type[Exception], ...],
    ) -> None:
        self.cursor, self.dialect, self.errors = cursor, dialect, errors

    @classmethod
    def of(cls, conn: Connection) -> Tx:
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
            raise unavailable(exc) from exc


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


def on_tx(work: Callable[..., T]) -> Callable[..., T]:
    """`work` of a `Tx`, run on a connection of SQLAlchemy's (through `run_sync`)."""
    return lambda conn, *args: work(Tx.of(conn), *args)


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


def write_transaction(tx: Tx, writes: Writes) -> None:
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


def one_statement(writes: Writes) -> bool:
    """`write_transaction(writes)` runs a single statement: new events alone."""
    return not (writes.begun or writes.finished) and all(m.snapshot is None for m in writes.logged)


def _begin(tx: Tx, begun: Sequence[NewResponse]) -> None:
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


def _log(tx: Tx, logged: Sequence[Logged]) -> None:
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


def _end(tx: Tx, finished: Sequence[Finished]) -> None:
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
    conversation_of = _kept(tx, [done.response_id for done in finished])
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
            add_items(tx, conversation_id, done.conversation_items)
            tx.execute(
                _SET_CONVERSATION_SERVER, {"_id": conversation_id, "_served_by": done.served_by}
            )


def _kept(tx: Tx, ids: Sequence[str]) -> dict[str, str | None]:
    """Which of `ids` are still stored, each with its conversation: a statement for up to
    `_KEPT_BATCH` of them at once, not a round trip each (an ending of 64 responses paid 64)."""
    found: dict[str, str | None] = {}
    for start in range(0, len(ids), _KEPT_BATCH):
        batch = _padded(ids[start : start + _KEPT_BATCH])
        params = {f"_id{i}": response_id for i, response_id in enumerate(batch)}
        found.update((row[0], row[1]) for row in tx.execute(_kept_statement(len(batch)), params))
    return found


def _padded(ids: Sequence[str]) -> list[str]:
    """`ids` (one or more) to a power of two, the last repeated (the same id again finds the
    same row): a few statements' shapes, each compiled once."""
    size = 1 << (len(ids) - 1).bit_length()
    return [*ids, *[ids[-1]] * (size - len(ids))]


@functools.cache
def _kept_statement(size: int) -> Select[tuple[str, str | None]]:
    ids: list[BindParameter[str]] = [bindparam(f"_id{i}") for i in range(size)]
    return select(responses.c.id, responses.c.conversation_id).where(responses.c.id.in_(ids))


_KEPT_BATCH = 64


def renew_leases(tx: Tx, owner: str, ids: Sequence[str], until: float) -> list[str]:
    """Renew `owner`'s leases on `ids` (to `until`); those of them a client asked to cancel."""
    if not ids:
        return []
    tx.execute(
        _RENEW, [{"_id": response_id, "_owner": owner, "_until": until} for response_id in ids]
    )
    wanted: list[str] = []
    for start in range(0, len(ids), _KEPT_BATCH):
        batch = _padded(ids[start : start + _KEPT_BATCH])
        params = {f"_id{i}": response_id for i, response_id in enumerate(batch)}
        params["_owner"] = owner
        wanted += [row[0] for row in tx.execute(_cancel_statement(len(batch)), params)]
    return list(dict.fromkeys(wanted))


@functools.cache
def _cancel_statement(size: int) -> Select[tuple[str]]:
    ids: list[BindParameter[str]] = [bindparam(f"_id{i}") for i in range(size)]
    return select(responses.c.id).where(
        and_(
            responses.c.id.in_(ids),
            responses.c.owner == bindparam("_owner"),
            responses.c.cancel_requested,
        )
    )


def read_events(conn: Connection, response_id: str, after: int) -> list[Json]:
    """The events of `response_id`'s log numbered past `after`, in order."""
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


def fail_orphan(conn: Connection, response_id: str, snapshot: Json) -> None:
    """The replica running it died: whatever it logged stays; the response ends `failed`, its
    log closed into a valid stream."""
    events = read_events(conn, response_id, -1)
    streamed = conn.execute(
        select(responses.c.streamed).where(responses.c.id == response_id)
    ).scalar()
    ending, final = orphan_ending(events, snapshot, streamed=bool(streamed))
    _end(Tx.of(conn), [Finished(response_id, final, ending)])


def add_items(tx: Tx, conversation_id: str, items: Sequence[Json]) -> None:
    """Append `items` to the conversation's, after its last."""
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
_RENEW = (
    update(responses)
    .where(and_(responses.c.id == bindparam("_id"), responses.c.owner == bindparam("_owner")))
    .values(lease_until=bindparam("_until"))
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
