"""One writer for every run of a replica: what they keep goes to the store a transaction at a time.

A response is kept when it starts (before its first byte is sent), its event log while it runs,
and its ending. Written by each run on its own, 64 streams made 640 transactions a second and a
new response's first write queued behind them. The writer instead gathers whatever is due into
one transaction (a group commit): new responses and endings are due at once, so a transaction
starts as soon as the one before has landed; the running responses' new events are due every
`interval` seconds, all of them in the same transaction, a row per response, or as soon as the
transaction before has landed when a reader waits for them (`hurry`): a held event log
(`oars.eventlog`) shows its readers only what the store has. Events a reader waits for go in a
transaction of their own, ahead of the new responses and endings due with them (whose rows are
the heavier writes: 64 streams ending together took 15-25 ms on PostgreSQL, their logs 2-3 ms),
but never twice in a row while those wait. So a stream's last tokens reach its client after a
write of logs, and its ending after that.

A transaction that fails fails everything in it: each waiter gets the `StoreUnavailable`, and a
run whose events were in it fails too (its log could not be kept).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Sequence
from typing import Any, Protocol

from oars.errors import StoreUnavailable
from oars.events import Event
from oars.store import TERMINAL_STATUSES, Finished, Logged, NewResponse, Store, Writes

log = logging.getLogger("oars.writer")


class _Log(Protocol):
    @property
    def events(self) -> Sequence[Event]: ...

    def release(self, upto: int) -> None: ...


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
    of it failed. Its events are written only once its first write (`begun`) has landed."""

    def __init__(self, running: Running, begun: asyncio.Future[None], *, logged: bool) -> None:
        self.running, self.begun, self.logged = running, begun, logged
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
    """The group commit of one replica's runs (see the module's docstring). Its task starts with
    the first write asked of it and lives until `close`."""

    def __init__(self, store: Store, *, interval: float = 0.1) -> None:
        self.store, self.interval = store, interval
        self._begins: list[tuple[NewResponse, asyncio.Future[None]]] = []
        self._ends: list[tuple[Kept, Finished, asyncio.Future[None]]] = []
        self._running: dict[Kept, None] = {}  # responses whose log is written as it grows
        self._next_log = 0.0
        self._hurried = False  # a reader waits for events not written yet
        self._alone = False  # the last transaction was logs alone, rows waiting
        self._due: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None

    def begin(self, new: NewResponse) -> asyncio.Future[None]:
        """Keep a response that starts now: the future is done once it is kept (the caller
        goes on meanwhile, to open its engine)."""
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._begins.append((new, future))
        self._wake()
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

    def track(self, running: Running, begun: asyncio.Future[None], *, logged: bool) -> Kept:
        """Follow a response whose first write is `begun`; with `logged`, write its events as
        they come."""
        kept = Kept(running, begun, logged=logged)
        if logged:
            self._running[kept] = None
            self._wake()
        return kept

    def hurry(self) -> None:
        """A reader waits for events not written yet: write the logs in the next transaction,
        which starts as soon as the one in flight has landed."""
        self._hurried = True
        self._next_log = 0.0
        self._wake()

    async def finish(self, kept: Kept, done: Finished) -> None:
        """The response ended: keep `done`, after the rest of its log (nothing if its first
        write never landed). Return once it is kept. Until a transaction takes the ending, the
        log's events still go with the others' (a reader may wait for its last ones)."""
        await asyncio.wait([kept.begun])
        if not kept.ready:
            self._running.pop(kept, None)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._ends.append((kept, done, future))
        self._wake()
        await future

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _wake(self) -> None:
        if self._due is None:
            self._due = asyncio.Event()
        self._due.set()
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._run(), name="store writer")

    async def _run(self) -> None:
        assert self._due is not None
        while True:
            if not (self._begins or self._ends):
                wait = max(0.0, self._next_log - time.monotonic()) if self._running else None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._due.wait(), wait)
            self._due.clear()
            await self._write()

    async def _write(self) -> None:
        logs_due = bool(self._running) and time.monotonic() >= self._next_log
        alone = logs_due and self._hurried and not self._alone and bool(self._begins or self._ends)
        self._alone, self._hurried = alone, False
        begins: list[tuple[NewResponse, asyncio.Future[None]]] = []
        ends: list[tuple[Kept, Finished, asyncio.Future[None]]] = []
        if not alone:
            begins = [(new, f) for new, f in self._begins if not f.cancelled()]
            ends, self._begins, self._ends = self._ends, [], []
        for kept, _, _ in ends:
            self._running.pop(kept, None)
        logs: list[tuple[Kept, Logged, int]] = []
        if logs_due:
            self._next_log = time.monotonic() + self.interval
            for kept in self._running:
                due = kept.pending() if kept.ready and kept.error is None else None
                if due is not None:
                    logs.append((kept, *due))
        finished = [_with_tail(kept, done) for kept, done, _ in ends]
        if not (begins or logs or finished):
            return
        writes = Writes([new for new, _ in begins], [entry for _, entry, _ in logs], finished)
        try:
            await self.store.write(writes)
        except Exception as exc:  # the loop must outlive any one write; its waiters get the error
            if not isinstance(exc, StoreUnavailable):
                log.exception("a write to the store failed")
                exc = StoreUnavailable(f"The response store failed a write: {exc}")
            for kept, _, _ in logs:
                kept.error = exc
            for future in [f for _, f in begins] + [f for _, _, f in ends]:
                if not future.done():
                    future.set_exception(exc)
            return
        for kept, _, upto in logs:
            kept.written = upto
            kept.running.log.release(upto)
        for future in [f for _, f in begins] + [f for _, _, f in ends]:
            if not future.done():
                future.set_result(None)


def _with_tail(kept: Kept, done: Finished) -> Finished:
    """`done` with the events of its log not written yet ahead of its own (a log is written
    only for a response that keeps one)."""
    if not kept.logged:
        return done
    tail = [*kept.running.log.events[kept.written :], *done.events]
    return Finished(done.response_id, done.snapshot, tail, done.conversation_items, done.served_by)
