"""Where the store's writes run: a lane, with connections of its own, that keeps the serving loop
from waiting for the database.

On the serving loop each statement of a transaction was a round trip to the driver that waited
its turn behind every stream's chunks (at 64 paced streams, 4-6 statements per ending made
transactions of 180-220 ms, and a new response waited behind them); in a lane the loop waits for
one answer per transaction. SQLite's lane is a plain blocking connection (aiosqlite would add a
thread hop per statement) that keeps the WAL checkpoints off the loop, PostgreSQL's an event loop
driving asyncpg's connection itself. This module also makes the engines the store reads with (pragmas and timeouts).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import asyncpg
from sqlalchemy import event
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql import asyncpg as postgresql_asyncpg
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import await_only, greenlet_spawn

from oars.errors import StoreUnavailable
from oars.store.transactions import Tx, unavailable

log = logging.getLogger("oars.store")

T = TypeVar("T")


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def sql_engine(url: str) -> AsyncEngine:
    """SQLAlchemy's async engine for `url`: SQLite in WAL mode, PostgreSQL with a pool."""
    if is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": _BUSY_MS / 1000})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(
        url,
        pool_pre_ping=True,
        pool_size=10,
        connect_args={"timeout": 10, "command_timeout": 30},
    )


_SQLITE = sqlite.dialect()


class SqliteLane:
    """SQLite's lane. A transaction runs on the serving loop itself, on a connection of the
    driver's that never waits for SQLite's lock: a new response's row, a round of logs or an
    ending is 0.1-1 ms of CPU there (`bench.lab.store_writes`), where a thread of its own made each of
    its statements wait for the GIL behind the loop (at 64 paced streams, 6-19 ms at p99 for a
    new response's 0.3 ms of work). When another connection holds the lock (the thread's, the
    serving engine's, or another process's), the loop tries again a few turns later
    (`_BUSY_PAUSES`, 14 ms in all), and only then sends the transaction to the lane's thread,
    which waits for the lock: the loop never does. A transaction sent there at once held the
    lock across its statements' waits for the GIL, 10-25 ms under load, while every held log
    waited (`oars.eventlog`). Each takes the lock as it begins (`BEGIN IMMEDIATE`): what it
    reads, no other connection changes before it commits.

    The loop does not wait for the disk either. Its connection never checkpoints the WAL (a
    checkpoint writes and syncs the database file); the thread does, at most every
    `_CHECKPOINT_SECONDS`, in passive passes that never hold the writers back, and starts the
    WAL over itself once every frame is copied (the write that does so syncs the WAL's
    header), each step one statement: the lock is held inside SQLite alone, never across a wait
    for the GIL. Under load, when no pass catches up, the writers are held back only once the
    WAL holds more than `_WAL_FRAMES`, while the frames left are copied; a reader that keeps
    the WAL from starting over is then waited for at most `_RESTART_WAIT_MS`, and not again
    for `_RESTART_SECONDS` (a reader that lasts, a backup say, must not hold the writes back
    again and again)."""

    def __init__(self, url: str) -> None:
        self.path = str(make_url(url).database)
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="store writes")
        self._loop_conn: sqlite3.Connection | None = None
        self._thread_conn: sqlite3.Connection | None = None  # opened and used on the thread
        self._in_thread = 0  # transactions sent to the thread, not done yet
        self._checkpointed = time.monotonic()
        self._restarted = 0.0

    async def transaction(self, work: Callable[..., T], *args: Any) -> T:
        for pause in (*_BUSY_PAUSES, None):
            if self._in_thread:  # after transactions on the thread: they land in the order asked
                break
            if self._loop_conn is None:
                self._loop_conn = _sqlite_connect(self.path, on_loop=True)
            done = _sqlite_transaction(self._loop_conn, work, args, wait=False)
            if done is not None:
                if time.monotonic() - self._checkpointed >= _CHECKPOINT_SECONDS:
                    self._checkpointed = time.monotonic()
                    self.thread.submit(self._checkpoint)
                return done[0]
            if pause is not None:
                await asyncio.sleep(pause)
        loop = asyncio.get_running_loop()
        sent = self.thread.submit(self.run, work, *args)
        self._in_thread += 1  # until it has run, even if its caller stops waiting
        sent.add_done_callback(lambda _: loop.call_soon_threadsafe(self._left_thread))
        return await asyncio.wrap_future(sent)

    async def statement(self, work: Callable[..., T], *args: Any) -> T:
        """`work` that runs one statement: here a transaction like any other."""
        return await self.transaction(work, *args)

    def _left_thread(self) -> None:
        self._in_thread -= 1

    def run(self, work: Callable[..., T], *args: Any) -> T:
        """A transaction of `work`'s on the lane's thread, waiting for SQLite's lock."""
        done = _sqlite_transaction(self._on_thread(), work, args, wait=True)
        assert done is not None
        return done[0]

    def _on_thread(self) -> sqlite3.Connection:
        if self._thread_conn is None:
            self._thread_conn = _sqlite_connect(self.path, on_loop=False)
        return self._thread_conn

    def _checkpoint(self) -> None:
        # each statement read to its end: one left open would keep the WAL from starting over
        try:
            conn = self._on_thread()
            # The WAL is copied by passive checkpoints, writers going on. A pass copies what
            # the WAL held as it began, and writers add more meanwhile (at 64 streams a first
            # pass took 40-70 ms, with 3,000-5,000 new frames a second): passes follow, each
            # shorter than the one before, until one finds nothing new (every frame is copied:
            # the WAL may start over) or after `_PASSES`.
            # (A pass that finds another connection checkpointing is busy, and copies nothing.)
            [(busy, frames, _)] = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
            if busy or frames <= 0:
                return
            for _ in range(_PASSES - 1):
                [(busy, now, done)] = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
                if busy:
                    return
                new, frames = now - frames, now
                if new <= 0 and done >= now:  # (new < 0: the WAL started over meanwhile)
                    break
            else:
                # Under load no pass finds nothing new. Past `_WAL_FRAMES` the rest is copied
                # holding the writers back (SQLite's RESTART), and only if no reader keeps it
                # (waiting for readers at most `_RESTART_WAIT_MS`, not again for
                # `_RESTART_SECONDS`; no wait otherwise). That held every held log
                # (`oars.eventlog`) 1-22 ms, whatever was left to copy (the thread is
                # descheduled with the lock); done each second at 64 streams, it made the p99
                # between their deltas. Below, the WAL grows (it is kept, not truncated).
                if frames <= _WAL_FRAMES:
                    return
                wait = 0
                if time.monotonic() - self._restarted >= _RESTART_SECONDS:
                    self._restarted, wait = time.monotonic(), _RESTART_WAIT_MS
                conn.execute(f"PRAGMA busy_timeout={wait}").fetchall()
                try:
                    [(busy, _, _)] = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
                finally:
                    conn.execute(f"PRAGMA busy_timeout={_BUSY_MS}").fetchall()
                if busy:
                    return
            # The next write starts the WAL over (and syncs its header): this one, of the user
            # version, which oars uses for nothing else (writing what a page holds already
            # writes nothing). One statement: the lock is held in SQLite alone.
            [(version,)] = conn.execute("PRAGMA user_version").fetchall()
            conn.execute(f"PRAGMA user_version = {(version + 1) % 2**31}").fetchall()
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
# seconds the loop waits before trying the lock again: short, as the checkpoint holds it for a
# few ms (with 1, 2, 4 and 8, a lock held 2.5 ms kept every held log waiting 7)
_BUSY_PAUSES = (0.0005,) * 4 + (0.001,) * 4 + (0.002, 0.002, 0.004)
_WAL_FRAMES = 16_384  # pages: 64 MB of 4 KB ones
_PASSES = 4  # passive checkpoints in a row at most
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
        raise unavailable(exc) from exc
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
            result = work(Tx(cursor, _SQLITE, sqlite3.Error), *args)
            cursor.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.rollback()
            raise
    except sqlite3.Error as exc:
        raise unavailable(exc) from exc
    return (result,)


class PostgresLane:
    """PostgreSQL's lane: a thread running an event loop of its own, with connections of the
    driver's (asyncpg) on it, one a transaction in flight (the writer has two lines,
    `oars.writer`): the serving loop waits for one answer per transaction, not one per
    statement. A write of one statement (the logs alone) needs no lane: it goes from the
    serving loop (`statement`).

    A transaction's work runs on the driver itself (in a greenlet, the way SQLAlchemy runs
    synchronous code on an asynchronous driver), not through SQLAlchemy's engine, whose pool
    checkout, ping, transaction and cursor took a write of 20 responses' logs from 1.9 to 3.0 ms
    (p50, idle), all of it Python holding the GIL beside the serving loop. A connection is
    checked as each transaction begins: one that died while idle (the server restarted, a proxy
    closed it) is replaced before any of the work is sent, and one that fails during a
    transaction is dropped (the writer fails what that transaction carried).
    """

    def __init__(self, url: str) -> None:
        self.dsn = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="store writes")
        self.thread.daemon = True
        self.thread.start()
        self._idle: list[asyncpg.Connection] = []  # opened and used on the lane's loop
        # the serving loop's own, for writes of one statement
        self._serving: tuple[asyncio.AbstractEventLoop, list[asyncpg.Connection]] | None = None
        self._closed = False

    async def transaction(self, work: Callable[..., T], *args: Any) -> T:
        return await self._on_lane(self._run(work, args))

    async def statement(self, work: Callable[..., T], *args: Any) -> T:
        """`work` that runs one statement (the driver's `executemany` is atomic: its rows are
        one implicit transaction), sent without a transaction block: a write of logs alone
        took three round trips (begin, insert, commit), 0.9-1.2 ms of CPU for 16 responses'
        logs, now one, 0.6-0.7 ms. It is sent from the serving loop itself, on a connection of
        its own: one round trip has no statements to wait between, and through the lane each
        write took the GIL from the loop twice more (64 held streams: the server's CPU 3.4-3.6 s
        against 3.8-3.9 s through the lane, `bench.lab.durable_release`'s load, by hand)."""
        if self._closed:
            raise RuntimeError("the store's lane is closed")
        loop = asyncio.get_running_loop()
        if self._serving is None or self._serving[0] is not loop:
            self._serving = (loop, [])  # (a store serves one loop: a test's may end first)
        return await self._one(work, args, self._serving[1])

    async def _run(self, work: Callable[..., T], args: tuple[Any, ...]) -> T:
        try:
            conn, transaction = await self._begin()
        except _POSTGRES_ERRORS as exc:
            raise unavailable(exc) from exc
        try:
            tx = Tx(_PostgresCursor(conn), _POSTGRES, _POSTGRES_ERRORS)
            result = await greenlet_spawn(work, tx, *args)
            await transaction.commit()
        except BaseException as exc:
            refused = isinstance(_cause(), asyncpg.PostgresError)  # the server's no
            if refused and await _undone(conn, transaction):
                self._idle.append(conn)
            else:
                conn.terminate()
            if isinstance(exc, _POSTGRES_ERRORS):
                raise unavailable(exc) from exc
            raise
        self._idle.append(conn)
        return result

    async def _one(
        self, work: Callable[..., T], args: tuple[Any, ...], idle: list[asyncpg.Connection]
    ) -> T:
        for attempt in (1, 2):
            conn = idle.pop() if idle else None
            try:
                if conn is None or conn.is_closed():
                    conn = await asyncpg.connect(self.dsn, timeout=10, command_timeout=30)
                tx = Tx(_PostgresCursor(conn), _POSTGRES, _POSTGRES_ERRORS)
                result = await greenlet_spawn(work, tx, *args)
            except BaseException as exc:
                cause = _cause()
                lost = isinstance(cause, asyncpg.PostgresConnectionError)
                if conn is not None and isinstance(cause, asyncpg.PostgresError) and not lost:
                    lost = conn.is_closed()
                refused = isinstance(cause, asyncpg.PostgresError) and not lost
                if conn is not None and refused:
                    idle.append(conn)  # (the statement was undone on its own)
                elif conn is not None:
                    conn.terminate()
                # A connection the server closed while it was idle (a restart, an
                # administrator) fails the statement before it ran: once more, on a new one.
                # (Had it run, its rows are there and the second is refused for their keys:
                # the write fails, as a commit whose answer was lost does.)
                if attempt == 1 and not refused and isinstance(cause, _POSTGRES_ERRORS):
                    continue
                if isinstance(exc, _POSTGRES_ERRORS):
                    raise unavailable(exc) from exc
                raise
            idle.append(conn)
            return result
        raise AssertionError("unreachable")

    async def _begin(self) -> tuple[asyncpg.Connection, Any]:
        """An idle connection (or a new one), in a transaction begun. One that died while idle
        (the server restarted, a proxy closed it) fails here, before anything of the work was
        sent: then once more, on a new one."""
        for attempt in (1, 2):
            conn = self._idle.pop() if self._idle else None
            if conn is None or conn.is_closed():
                conn = await asyncpg.connect(self.dsn, timeout=10, command_timeout=30)
            transaction = conn.transaction()
            try:
                await transaction.start()
            except _POSTGRES_ERRORS:
                conn.terminate()
                if attempt == 2:
                    raise
                continue
            return conn, transaction
        raise AssertionError("unreachable")

    async def _on_lane(self, work: Coroutine[Any, Any, T]) -> T:
        """Run `work` on the lane (cancelled there if its caller is cancelled)."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))

    async def close(self) -> None:
        self._closed = True
        serving, self._serving = self._serving, None
        if serving is not None and serving[0] is asyncio.get_running_loop():
            await _close_all(serving[1])
        await self._on_lane(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join)
        self.loop.close()

    async def _close(self) -> None:
        idle, self._idle = self._idle, []
        await _close_all(idle)


async def _close_all(idle: list[asyncpg.Connection]) -> None:
    """Close each connection; one that fails to, or a close that is cancelled, ends the rest
    at once (and a cancelled close is cancelled still)."""
    for i, conn in enumerate(idle):
        try:
            await conn.close(timeout=5)
        except (*_POSTGRES_ERRORS, asyncio.CancelledError):
            conn.terminate()
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                for rest in idle[i + 1 :]:
                    rest.terminate()
                raise


async def _undone(conn: asyncpg.Connection, transaction: Any) -> bool:
    """Roll back a transaction the server refused a statement of; False: the connection is no
    longer of use."""
    if conn.is_closed():
        return False
    try:
        await transaction.rollback()
    except _POSTGRES_ERRORS:
        return False
    return True


def _cause() -> BaseException | None:
    """The exception being handled, or the driver's error a `StoreUnavailable` stands for."""
    exc = sys.exc_info()[1]
    return exc.__cause__ if isinstance(exc, StoreUnavailable) else exc


class _PostgresCursor:
    """asyncpg's connection as the cursor a `Tx` drives, from the greenlet its work runs in."""

    description = True  # `fetchall` answers every statement (no rows for a write)

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self._rows: list[Any] = []

    def execute(self, sql: str, params: Sequence[Any]) -> None:
        self._rows = await_only(self.conn.fetch(sql, *params))

    def executemany(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        self._rows = []
        await_only(self.conn.executemany(sql, rows))

    def fetchall(self) -> list[Any]:
        return self._rows


_POSTGRES = postgresql_asyncpg.dialect()  # type: ignore[no-untyped-call]
_POSTGRES_ERRORS = (
    asyncpg.PostgresError,
    asyncpg.InterfaceError,
    asyncpg.InternalClientError,
    OSError,
    TimeoutError,
)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    cursor = dbapi_conn.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


Lane = SqliteLane | PostgresLane


def lane_for(url: str) -> Lane:
    """The lane that runs `url`'s write transactions."""
    return SqliteLane(url) if is_sqlite(url) else PostgresLane(url)
