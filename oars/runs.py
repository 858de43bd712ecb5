"""Runs that outlive their readers.

`Runs.submit(request)` opens the request's turn (its history, from the store), keeps the new
response, and starts one producer task that drives the generation and appends every event to an
`EventLog`. Readers (the SSE response, the non-streamed response, a resumed `GET`) follow the log
from any sequence number; none of them owns the generation. The log of a kept response is
released to them as the store keeps it (see `oars.eventlog`). A streamed response that is not in
the background is cancelled when its reader goes away; a background one runs on.

The replica's one `Writer` keeps the response before its first byte, the log as it grows, and
the final snapshot, output items and last events at the end. A heartbeat keeps this replica's
leases alive, carries cancels asked for on other replicas, and fails the runs of dead replicas.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from functools import partial
from typing import Any

from oars.errors import RateLimited, StoreUnavailable
from oars.eventlog import EventLog
from oars.events import Event
from oars.metrics import Metrics, TokenClock
from oars.normalize import ResponseRequest
from oars.service import Generation, ResponsesService
from oars.store import (
    Chain,
    Finished,
    NewResponse,
    Reads,
    Store,
    StoredResponse,
)
from oars.turn import Turn
from oars.writer import Kept, Writer

log = logging.getLogger("oars.runs")

TERMINAL_EVENTS = frozenset(
    {"response.completed", "response.incomplete", "response.failed", "response.cancelled"}
)
FLUSH_SECONDS = 0.1  # how often a running response's log is written when no one waits


class RunHandle:
    """One response being produced: its log, its final snapshot, and a way to stop it."""

    def __init__(self, request: ResponseRequest, generation: Generation, turn: Turn) -> None:
        self.request, self.generation, self.turn = request, generation, turn
        self.id: str = generation.id
        self.model = generation.engine.info.id  # the model serving it (any name may ask for it)
        self.clock: TokenClock | None = None
        self.log = EventLog()
        self.initial = generation.builder.response  # what a background create answers, and is kept
        self.task: asyncio.Task[None] | None = None
        self.unkept = False  # the store failed it: the response is not kept
        self.generating = False  # the producer is in the generation (where a cancel can stop it)
        self.cancel_requested = False

    @property
    def snapshot(self) -> dict[str, Any]:
        return self.generation.builder.response

    @property
    def status(self) -> str:
        """The snapshot's status (without building the snapshot)."""
        return self.generation.builder.status

    @property
    def done(self) -> bool:
        return self.log.closed

    @property
    def streamed(self) -> bool:
        """It keeps an event log (streamed, or in the background)."""
        return self.request.stream or self.request.background

    def stored(self, snapshot: dict[str, Any], owner: str) -> StoredResponse:
        return StoredResponse(
            snapshot,
            background=self.request.background,
            streamed=self.streamed,
            owner=owner,
            tenant=self.request.tenant,
        )

    async def events(self, after: int = -1) -> AsyncIterator[Event]:
        async for batch in self.log.follow(after):
            for event in batch:
                yield event

    def batches(
        self, after: int = -1, keepalive: float | None = None
    ) -> AsyncIterator[list[Event]]:
        """The events in batches (see `EventLog.follow`)."""
        return self.log.follow(after, keepalive)

    async def result(self) -> dict[str, Any]:
        """The final snapshot, once the producer has ended (and stored it)."""
        assert self.task is not None
        await asyncio.shield(self.task)
        return self.snapshot

    def steer(self) -> bool:
        """Ask the generation to stop at its next safe boundary (`Generation.steer`); False
        once the response has ended."""
        if self.done or self.cancel_requested:
            return False
        self.generation.steer()
        return True

    def cancel(self) -> None:
        """Stop the generation; the run ends `cancelled`. Only the generation is interrupted: a
        producer not started yet sees the flag when it starts, and one that is already writing
        its ending finishes as it was."""
        if self.cancel_requested or self.done:
            return
        self.cancel_requested = True
        if self.generating and self.task is not None:
            self.task.cancel()


class Runs:
    """Every run of this replica, and the store they are kept in (None: nothing is kept)."""

    def __init__(
        self,
        service: ResponsesService,
        store: Store | None,
        *,
        replica: str,
        lease_seconds: float,
        metrics: Metrics | None = None,
        concurrent_per_key: int | None,
        request_timeout: float | None,
    ) -> None:
        self.service, self.store, self.replica = service, store, replica
        self.concurrent_per_key, self.request_timeout = concurrent_per_key, request_timeout
        self._running: Counter[str] = Counter()  # unfinished runs by tenant
        self.metrics = metrics or Metrics()
        self.lease_seconds = lease_seconds
        self.active: dict[str, RunHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._heartbeat: asyncio.Task[None] | None = None
        self.writer = Writer(store, interval=FLUSH_SECONDS) if store is not None else None

    # ---- lifecycle ------------------------------------------------------------------------

    async def open(self) -> None:
        """Fail what this replica left unfinished when it last stopped; start the heartbeat."""
        if self.store is None:
            return
        await self.store.open()
        orphans = await self.store.fail_orphans(owner=self.replica)
        if orphans:
            log.warning(
                "failed %d responses left unfinished by the last run: %s",
                len(orphans),
                ", ".join(orphans),
            )
        self._heartbeat = asyncio.create_task(self._beat())

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        for handle in list(self.active.values()):
            handle.cancel()
        if self._tasks:
            await asyncio.wait(self._tasks, timeout=10)
        if self.writer is not None:
            await self.writer.close()

    async def _beat(self) -> None:
        assert self.store is not None
        while True:
            await asyncio.sleep(self.lease_seconds / 4)
            try:
                ids = [h.id for h in self.active.values() if h.request.store]
                wanted = await self.store.heartbeat(
                    self.replica, ids, lease_seconds=self.lease_seconds
                )
                for response_id in wanted:
                    if response_id in self.active:
                        self.active[response_id].cancel()
                orphans = await self.store.fail_orphans(owner=None)
                if orphans:
                    log.warning("failed responses of a replica that stopped: %s", orphans)
            except StoreUnavailable as exc:
                log.warning("heartbeat: %s", exc)

    # ---- submitting ---------------------------------------------------------------------

    async def submit(
        self, request: ResponseRequest, *, store: Reads | None, previous: Chain | None = None
    ) -> RunHandle:
        """Resolve history, keep the response, start producing. Errors here come before any
        byte of the response: client errors are 4xx (429 past the key's concurrent runs), a
        store that is down is a 503. `store`: the store as the request's tenant sees it (its
        `oars.tenancy.Tenant`'s), where its history is read. `previous`: the previous
        response's context, when the caller holds it (see `Turn.open`)."""
        tenant = request.tenant
        if self.concurrent_per_key is not None and self._running[tenant] >= self.concurrent_per_key:
            raise RateLimited(
                f"This key already has {self._running[tenant]} responses running, "
                f"the most it may; retry when one has ended.",
                retry_after=1,
            )
        self._running[tenant] += 1
        try:
            handle = await self._submit(request, store, previous)
        except BaseException:
            self._running[tenant] -= 1
            raise
        assert handle.task is not None
        handle.task.add_done_callback(lambda _: self._running.subtract([tenant]))
        return handle

    async def _submit(
        self, request: ResponseRequest, store: Reads | None, previous: Chain | None
    ) -> RunHandle:
        turn = await Turn.open(request, store, self.service.unseal, previous)
        generation = await self.service.prepare(turn)
        handle = RunHandle(request, generation, turn)
        handle.clock = TokenClock(self.metrics, handle.model)
        # The first write overlaps the engine's answer (an upstream's status line) and then the
        # prefill; no byte is sent before it has landed.
        begun = self._begin(handle) if request.store else None
        try:
            await generation.open()
        except BaseException:
            if begun is not None:
                await self._unbegin(handle, begun)
            raise
        handle.task = asyncio.create_task(self._produce(handle, begun), name=f"run {handle.id}")
        self._tasks.add(handle.task)
        handle.task.add_done_callback(self._tasks.discard)
        if begun is not None:
            try:
                await begun
            except StoreUnavailable:
                handle.cancel()
                await handle.result()
                raise
        self.active[handle.id] = handle
        return handle

    def _begin(self, handle: RunHandle) -> asyncio.Future[None]:
        assert self.writer is not None
        turn = handle.turn
        stored = handle.stored(handle.initial, self.replica)
        new = NewResponse(
            stored, turn.stored_input, turn.request.conversation_id, self.lease_seconds
        )
        return self.writer.begin(new)

    async def _unbegin(self, handle: RunHandle, begun: asyncio.Future[None]) -> None:
        """The engine refused the response (its error is the request's status): what its first
        write kept, if it was written already, goes."""
        assert self.writer is not None and self.store is not None
        if self.writer.withdraw(begun):
            return
        await asyncio.wait([begun])
        if begun.cancelled() or begun.exception() is not None:
            return
        try:
            await self.store.delete(handle.id)
        except StoreUnavailable as exc:  # its lease lapses: a heartbeat fails it as an orphan
            log.warning("response %s was refused and could not be deleted: %s", handle.id, exc)

    async def _produce(self, handle: RunHandle, begun: asyncio.Future[None] | None) -> None:
        kept: Kept | None = None
        if begun is not None and self.writer is not None:
            followed = handle.request.stream
            kept = self.writer.track(handle, begun, logged=handle.streamed, followed=followed)
            if kept.logged:
                handle.log.hold(self.writer.hurry)
        generation = handle.generation
        events = generation.batches(handle.clock)
        ending: list[Event] = []  # held back until the response is kept
        try:
            if handle.cancel_requested:
                raise asyncio.CancelledError  # asked for before this task first ran
            handle.generating = True
            async with asyncio.timeout(self.request_timeout):
                async for batch in events:
                    ending = _publish(handle, batch, ending)
                    if kept is not None:
                        kept.check()
            handle.generating = False
        except asyncio.CancelledError:
            # Only `RunHandle.cancel` cancels this task, only while it generates, and the
            # cancel is answered here in full: taken back, the awaits keeping the ending run.
            _uncancel()
            ending = await _end(handle, events, ending, generation.cancel)
        except TimeoutError:
            message = (
                f"The response took longer than this server allows ({self.request_timeout} s)."
            )
            timed_out = partial(generation.fail, message, code="request_timeout")
            ending = await _end(handle, events, ending, timed_out)
        except StoreUnavailable as exc:
            log.error("response %s: %s", handle.id, exc)
            handle.unkept = True
            unkept = partial(generation.fail, str(exc), code="store_unavailable")
            ending = await _end(handle, events, ending, unkept)
        try:
            if kept is not None:
                await self._finish(kept, handle, ending)
        except StoreUnavailable as exc:
            log.error("response %s could not be stored: %s", handle.id, exc)
            handle.unkept = True
            ending = generation.fail_instead(ending, str(exc), "store_unavailable")
        finally:
            # Readers see the ending only now: a client told `completed` can chain from it.
            handle.log.append(ending)
            handle.log.close()
            self.active.pop(handle.id, None)
            self._ended(handle)

    async def _finish(self, kept: Kept, handle: RunHandle, ending: list[Event]) -> None:
        assert self.writer is not None
        snapshot = handle.snapshot
        done = Finished(
            handle.id,
            snapshot,
            ending if handle.streamed else [],
            handle.turn.conversation_items(snapshot),
            handle.generation.served_by,
        )
        await self.writer.finish(kept, done)

    def _ended(self, handle: RunHandle) -> None:
        snapshot, clock = handle.snapshot, handle.clock
        usage = snapshot.get("usage") or {}
        self.metrics.response_done(handle.model, snapshot["status"], usage)
        planned = handle.generation.compaction
        if planned is not None and handle.generation.turn.compacted is not None:
            self.metrics.compacted(handle.request.model, planned.how)
        cached = (usage.get("input_tokens_details") or {}).get("cached_tokens")
        ttft = None if clock is None or clock.first else (clock.first_at - clock.started) * 1000
        duration = None if clock is None else (time.monotonic() - clock.started) * 1000
        log.info(
            "%s %s: %s input (%s cached), %s output tokens; output %s",
            handle.id,
            snapshot["status"],
            usage.get("input_tokens"),
            cached,
            usage.get("output_tokens"),
            [item["type"] for item in snapshot["output"]],
            extra={
                "response_id": handle.id,
                "model": handle.model,
                "status": snapshot["status"],
                "input_tokens": usage.get("input_tokens"),
                "cached_tokens": cached,
                "output_tokens": usage.get("output_tokens"),
                "ttft_ms": None if ttft is None else round(ttft, 1),
                "duration_ms": None if duration is None else round(duration, 1),
            },
        )

    def load(self) -> dict[str, tuple[int, int]]:
        """Per model: generations producing tokens, and those waiting for their first (in the
        engine's queue or its prefill)."""
        load = {model: (0, 0) for model in self.service.engines}
        for handle in self.active.values():
            if handle.generating and handle.clock is not None:
                running, waiting = load.get(handle.model, (0, 0))
                first = handle.clock.first
                load[handle.model] = (running + (not first), waiting + first)
        return load


def _publish(handle: RunHandle, events: list[Event], ending: list[Event]) -> list[Event]:
    """Append events to the log up to the response's ending (an `error` or a terminal event),
    which is held back and returned."""
    for event in events:
        if ending or event["type"] in TERMINAL_EVENTS or event["type"] == "error":
            ending = [*ending, event]
        else:
            handle.log.append([event])
    return ending


async def _end(
    handle: RunHandle,
    events: AsyncGenerator[list[Event], None],
    ending: list[Event],
    outcome: Callable[[], list[Event]],
) -> list[Event]:
    """Stop generating, then end the response as an outside cause asks (`outcome`: cancelled,
    or failed): the generation is closed first, so its ending comes after all it made."""
    handle.generating = False
    await events.aclose()
    return _publish(handle, outcome(), ending)


def _uncancel() -> None:
    task = asyncio.current_task()
    if task is not None:
        task.uncancel()
