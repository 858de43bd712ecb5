"""Where the store's writes run: a lane, with connections of its own, that keeps the serving loop
from waiting for the database.

On the serving loop each statement of a transaction was a round trip to the driver that waited
its turn behind every stream's chunks (at 64 paced streams, 4-6 statements per ending made
transactions of 180-220 ms, and a new response waited behind them); in a lane the loop waits for
one answer per transaction. SQLite's lane is a plain blocking connection (aiosqlite would add a
thread hop per statement) that keeps the WAL checkpoints off the loop, PostgreSQL's an event loop
running asyncpg. This module also makes the engines the store reads with (pragmas and timeouts).
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import event
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from oars.errors import StoreUnavailable
from oars.store.transactions import Tx, on_tx, unavailable

log = logging.getLogger("oars.store")

T = TypeVar("T")


def is_sqlite(url: str) -> bool:
    return url.startswith("sqlite")


def sql_engine(url: str, pool_size: int = 10) -> AsyncEngine:
    """SQLAlchemy's async engine for `url`: SQLite in WAL mode, PostgreSQL with a pool."""
    if is_sqlite(url):
        engine = create_async_engine(url, connect_args={"timeout": _BUSY_MS / 1000})
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    return create_async_engine(
        url,
        pool_pre_ping=True,
        pool_size=pool_size,
        connect_args={"timeout": 10, "command_timeout": 30},
    )


_SQLITE = sqlite.dialect()


class SqliteLane:
    """SQLite's lane. A transaction runs on the serving loop itself, on a connection of the
    driver's that never waits for SQLite's lock: a new response's row, a round of logs or an
    ending is 0.1-1 ms of CPU there (`bench.lab.store_writes`), where a thread of its own made each of
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


class LoopLane:
    """PostgreSQL's lane: a thread running an event loop of its own, with an engine on it (the
    driver, asyncpg, is asynchronous): the serving loop waits for one answer per transaction,
    not one per statement."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.engine = sql_engine(url, pool_size=1)  # a transaction at a time
        self.thread = threading.Thread(target=self.loop.run_forever, name="store writes")
        self.thread.daemon = True
        self.thread.start()

    async def transaction(self, work: Callable[..., T], *args: Any) -> T:
        async def run() -> T:
            async with self.engine.begin() as conn:
                return await conn.run_sync(on_tx(work), *args)

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


Lane = SqliteLane | LoopLane


def lane_for(url: str) -> Lane:
    """The lane that runs `url`'s write transactions."""
    return SqliteLane(url) if is_sqlite(url) else LoopLane(url)
