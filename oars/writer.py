"""One writer for every run of a replica: what they keep goes to the store a transaction at a time.

A response is kept when it starts (before its first byte is sent), its event log while it runs,
and its ending. Written by each run on its own, 64 streams made 640 transactions a second and a
new response's first write queued behind them. The writer instead gathers whatever is due into
one transaction (a group commit), in two lines that write side by side (two connections):
- the rows: new responses and endings are due at once, so a transaction starts as soon as the
  one before has landed;
- the logs: the running responses' new events are due every `interval` seconds, all of them in
  the same transaction, a row per response, or as soon as the transaction before has landed
  when a reader waits for them (`hurry`): a held event log (`oars.eventlog`) shows its readers
  only what the store has, so these are on every streamed token's way. In one line with the
  rows, they waited behind endings (64 streams ending together took 15-25 ms on PostgreSQL,
  their logs 2-3 ms) and a stream's last delta waited for its ending.
A response's first write carries the events it has made by then, and those made meanwhile
follow it in the rows' line before a stream that reads it is told it is kept; its other logs
start once that write has landed, and its ending waits for the transaction that carries its
events (or is about to, a reader waiting): its last tokens reach the client after a write of
logs, its ending after that.

A transaction that fails fails everything in it: each waiter gets the `StoreUnavailable`, and a
run whose events were in it fails too (its log could not be kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Container, Iterable, Sequence
from typing import Any, Protocol

from oars.errors import StoreUnavailable
from oars.events import Event
from oars.store import TERMINAL_STATUSES, Finished, Logged, NewResponse, Store, Writes

log = logging.getLogger("oars.writer")


class _Log(Protocol):
    @property
    def events(self) -> Sequence[Event]: ...

    def release(self, upto: int) -> None: ...

    @property
    def waited(self) -> bool: ...


class Running(Protocol):
    """What the writer reads of a running response (a `RunHandle`)."""

    @property
    def id(self) -> str: ...

    @property
    def status(self) -> str: ...

    @property
    def snapshot(self) -> dict[str, Any]: ...

    @property
    def log(self) -> _Log: ...


class Kept:
    """One response's share of the writer: how much of its log is written, and whether a write
    of it failed. Its events are written with its first write (`begun`) or after it."""

    def __init__(
        self, running: Running, begun: asyncio.Future[None], *, logged: bool, followed: bool
    ) -> None:
        self.running, self.begun, self.logged, self.followed = running, begun, logged, followed
        self.written = 0
        self.status = running.status
        self.error: StoreUnavailable | None = None

    @property
    def ready(self) -> bool:
        """Its first write landed."""
        return self.begun.done() and not self.begun.cancelled() and self.begun.exception() is None

    def check(self) -> None:
        """Raise what a write of its log met (the run then fails)."""
        if self.error is not None:
            raise self.error

    def pending_count(self) -> int:
        """How many of its events are not written yet."""
        return len(self.running.log.events) - self.written

    def pending(self) -> tuple[Logged, int] | None:
        """Its events not written yet (with its snapshot if its status moved), and how far."""
        events = self.running.log.events[self.written :]
        if not events:
            return None
        status = self.running.status
        # A terminal status is written with the ending: written here, ahead of the held-back
        # ending, a reader on another replica would see it finished with its log unended.
        moved = status != self.status and status not in TERMINAL_STATUSES
        if moved:
            self.status = status
        snapshot = self.running.snapshot if moved else None
        return Logged(self.running.id, list(events), snapshot), self.written + len(events)


class Writer:
    """The group commit of one replica's runs (see the module's docstring): two tasks, one for
    the logs and one for the rows (new responses and endings), each writing a transaction at a
    time; they start with the first write asked and live until `close`."""

    def __init__(self, store: Store, *, interval: float = 0.1) -> None:
        self.store, self.interval = store, interval
        self._begins: list[tuple[NewResponse, asyncio.Future[None]]] = []
        self._ends: list[tuple[Kept, Finished, asyncio.Future[None]]] = []
        self._running: dict[Kept, None] = {}  # responses whose log is written as it grows
        self._logging: set[Kept] = set()  # those whose events are in a transaction in flight
        self._next_log = 0.0
        self._hurried = False  # a reader waits for events that no transaction has taken yet
        self._logs = _Task(self._write_logs, "store writer: logs", self._log_wait)
        self._rows = _Task(self._write_rows, "store writer: rows")

    def begin(self, new: NewResponse) -> asyncio.Future[None]:
        """Keep a response that starts now: the future is done once it is kept (the caller
        goes on meanwhile, to open its engine)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._begins.append((new, future))
        self._rows.wake()
        return future

    def withdraw(self, begun: asyncio.Future[None]) -> bool:
        """Take back a first write that no transaction has taken yet (its future is cancelled);
        False: it is being written, or was."""
        for i, (_, future) in enumerate(self._begins):
            if future is begun:
                del self._begins[i]
                future.cancel()
                return True
        return False

    def track(
        self, running: Running, begun: asyncio.Future[None], *, logged: bool, followed: bool = False
    ) -> Kept:
        """Follow a response whose first write is `begun`; with `logged`, write its events as
        they come; `followed`: a stream reads them from the moment it is kept."""
        kept = Kept(running, begun, logged=logged, followed=followed)
        if logged:
            self._running[kept] = None
            self._logs.wake()
        return kept

    def hurry(self) -> None:
        """A reader waits for events not written yet: write the logs in the next transaction,
        which starts as soon as the one in flight has landed."""
        self._next_log = 0.0
        self._hurried = True
        self._logs.wake()

    async def finish(self, kept: Kept, done: Finished) -> None:
        """The response ended: keep `done`, after the rest of its log (nothing if its first
        write never landed). Return once it is kept."""
        await asyncio.wait([kept.begun])
        if not kept.ready:
            self._running.pop(kept, None)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ends.append((kept, done, future))
        self._rows.wake()
        await future

    async def close(self) -> None:
        await self._logs.close()
        await self._rows.close()

    def _log_wait(self) -> float | None:
        """How long the logs' task may wait before its next transaction."""
        return max(0.0, self._next_log - time.monotonic()) if self._running else None

    async def _write_rows(self) -> None:
        # Endings go after the logs a reader waits for: 64 streams ending together made
        # transactions of 4-25 endings, 2-4 ms each on SQLite (whose lines both run on the
        # loop), and the last deltas of the streams still running waited behind them.
        if self._ends and self._hurried:
            await self._write_due_logs()
        # An ending waits while its response's events are in the logs' transaction (its tail
        # follows them), or are due there at once: a reader waits for them, and they reach it
        # sooner in a write of logs than in one of endings.
        logs_now = time.monotonic() >= self._next_log
        begins = [(new, f) for new, f in self._begins if not f.cancelled()]
        ends: list[tuple[Kept, Finished, asyncio.Future[None]]] = []
        waiting: list[tuple[Kept, Finished, asyncio.Future[None]]] = []
        for end in self._ends:
            kept = end[0]
            unwritten = kept.logged and kept.error is None and kept.pending_count() > 0
            wait = kept in self._logging or (logs_now and unwritten)
            (waiting if wait else ends).append(end)
        self._begins, self._ends = [], waiting
        for kept, _, _ in ends:
            self._running.pop(kept, None)
        finished = [_with_tail(kept, done) for kept, done, _ in ends]
        # The events a new response has made while its first write waited go with that write:
        # under load, a stream's first token waited for its row, then for a write of logs.
        landing = {id(f) for _, f in begins}
        first = self._take_logs((k for k in self._running if id(k.begun) in landing), landing)
        if not (begins or finished or first):
            return
        try:
            await self._write_logs_with(Writes([n for n, _ in begins], (), finished), first)
        except StoreUnavailable as error:  # its waiters get the error
            for future in [f for _, f in begins] + [f for _, _, f in ends]:
                if not future.done():
                    future.set_exception(error)
            return
        for _, _, future in ends:
            if not future.done():
                future.set_result(None)
        # Those made while it was in flight are written before their stream is told the
        # response is kept (it starts reading then): it reads them with the first. They used
        # to follow in a write of their own, with the loop busy starting every stream whose
        # response was in the same transaction, and each stream then read twice.
        late = [
            kept
            for kept in self._running
            if id(kept.begun) in landing and (kept.followed or kept.running.log.waited)
        ]
        late_logs = self._take_logs(late, landing)
        if late_logs:
            with contextlib.suppress(StoreUnavailable):  # its runs fail (`Kept.check`)
                await self._write_logs_with(Writes(), late_logs)
        for _, future in begins:
            if not future.done():
                future.set_result(None)

    async def _write_logs(self) -> None:
        try:
            await self._write_due_logs()
        finally:
            if self._ends:
                self._rows.wake()  # endings that waited for these events

    async def _write_due_logs(self) -> None:
        if not self._running or time.monotonic() < self._next_log:
            return
        self._next_log = time.monotonic() + self.interval
        self._hurried = False
        logs = self._take_logs(self._running)
        if logs:
            with contextlib.suppress(StoreUnavailable):  # its runs fail (`Kept.check`)
                await self._write_logs_with(Writes(), logs)

    def _take_logs(
        self, kepts: Iterable[Kept], landing: Container[int] = ()
    ) -> list[tuple[Kept, Logged, int]]:
        """The events not written yet of those of `kepts` that no transaction in flight
        carries, now in flight: of responses whose first write landed, or is in the same
        transaction (`landing`: the ids of their `begun` futures)."""
        logs: list[tuple[Kept, Logged, int]] = []
        for kept in kepts:
            # most have nothing new (64 streams, a write every 2-4 ms): asked first, a scan of
            # 64 with 5 to write took 18 us, not 57
            if len(kept.running.log.events) <= kept.written or kept in self._logging:
                continue
            if kept.error is None and (kept.ready or id(kept.begun) in landing):
                due = kept.pending()
                if due is not None:
                    logs.append((kept, *due))
        self._logging.update(kept for kept, _, _ in logs)
        return logs

    async def _write_logs_with(self, writes: Writes, logs: list[tuple[Kept, Logged, int]]) -> None:
        """`writes` with `logs` in one transaction; their events released once it lands, their
        runs failed (and `StoreUnavailable` raised) if it does not."""
        try:
            logged = [entry for _, entry, _ in logs]
            await self.store.write(Writes(writes.begun, logged, writes.finished))
        except Exception as exc:  # the tasks must outlive any one write
            error = _unavailable(exc)
            for kept, _, _ in logs:
                kept.error = error
            if error is exc:
                raise
            raise error from exc
        finally:
            self._logging.difference_update(kept for kept, _, _ in logs)
        for kept, _, upto in logs:
            kept.written = upto
            kept.running.log.release(upto)


class _Task:
    """A task that runs `write` again whenever woken, one at a time: what is asked while a
    transaction is in flight goes in the next, which starts as soon as it has landed.

    A wake of the logs' task, whose wait has a timeout while responses run, reaches `write`
    three turns of the loop later (`asyncio.wait_for` wraps the wait in a task), after the
    other streams' work of those turns: their events go in the same commit. Woken in one turn
    (a future of its own), 64 paced streams on PostgreSQL made more, smaller commits, and a
    held delta's p99 in the server went from 6.9 to 9.8 ms (on SQLite from 3.0 to 2.2)."""

    def __init__(
        self,
        write: Callable[[], Awaitable[None]],
        name: str,
        wait: Callable[[], float | None] = lambda: None,
    ) -> None:
        """`wait()`: how long to wait for a wake before `write` runs anyway (None: until woken)."""
        self.write, self.name, self._wait = write, name, wait
        self._due: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def wake(self) -> None:
        """Run `write` once more."""
        if self._due is None:
            self._due = asyncio.Event()
        self._due.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def _run(self) -> None:
        assert self._due is not None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._due.wait(), self._wait())
            self._due.clear()
            await self.write()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _unavailable(exc: Exception) -> StoreUnavailable:
    if isinstance(exc, StoreUnavailable):
        return exc
    log.exception("a write to the store failed")
    return StoreUnavailable(f"The response store failed a write: {exc}")


def _with_tail(kept: Kept, done: Finished) -> Finished:
    """`done` with the events of its log not written yet ahead of its own (a log is written
    only for a response that keeps one)."""
    if not kept.logged:
        return done
    tail = [*kept.running.log.events[kept.written :], *done.events]
    return Finished(done.response_id, done.snapshot, tail, done.conversation_items, done.served_by)
