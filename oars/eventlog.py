"""The ordered events of one response, which readers follow from any sequence number.

**A sequence number, once any reader has seen it, names one event forever.** A reader may be
this response's own stream, a second client following it, or a client that resumes it on
another replica after this one died. When a replica dies, a live one ends its responses from
what the store holds: their ending is numbered after the last stored event. So the events of a
response whose log is kept in the store are *held*: readers see an event only once the store
has it (`release`), and a client that resumes after any number it received gets exactly the
events after it, whichever replica ends the response. A held log that a reader waits on asks
for a write at once (`wanted`), so a stream waits one transaction a token, not the writer's
interval. A log that is not kept (`store: false`, or not streamed) has no one to contradict it,
and releases each event as it is appended.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from oars.events import Event
from oars.silence import Silence


class EventLog:
    """The events of one response; readers wait for more until it is closed. Sequence numbers
    are the log's positions."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self.released = 0  # readers see `events[:released]`
        self.closed = False
        self._wanted: Callable[[], None] | None = None  # set while held
        self._waiting: list[asyncio.Future[None]] = []  # a future for each reader waiting

    def hold(self, wanted: Callable[[], None]) -> None:
        """From now on release events only through `release` (or `close`); `wanted()` is
        called when a reader waits for events appended but not released yet."""
        self._wanted = wanted

    def append(self, events: list[Event]) -> None:
        self.events.extend(events)
        if self._wanted is None:
            self.released = len(self.events)
            self._wake()
        elif self._waiting:
            self._wanted()

    @property
    def waited(self) -> bool:
        """A reader waits for events not released yet."""
        return any(not waiter.done() for waiter in self._waiting)

    def release(self, upto: int) -> None:
        """The first `upto` events are kept: readers may see them."""
        if upto > self.released:
            self.released = upto
            self._wake()

    def close(self) -> None:
        """The response ended: its last events were appended once it was kept (or could not be),
        and the log is released whole."""
        self.closed = True
        self.released = len(self.events)
        self._wake()

    def _wake(self) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            if not waiter.done():  # (a reader whose wait was cancelled)
                waiter.set_result(None)

    def _changed(self) -> asyncio.Future[None]:
        """Done at the next release or close."""
        waiter = asyncio.get_running_loop().create_future()
        self._waiting.append(waiter)
        if self._wanted is not None and self.released < len(self.events):
            self._wanted()
        return waiter

    async def follow(
        self, after: int = -1, keepalive: float | None = None
    ) -> AsyncIterator[list[Event]]:
        """Events with `sequence_number > after`, live until the log closes: each time, all
        that were released since the last (one write for a reader that fell behind). With
        `keepalive`, an empty batch after that many seconds without an event."""
        position = after + 1
        silence = Silence(keepalive) if keepalive is not None else None
        try:
            while True:
                if position < self.released:
                    batch = self.events[position : self.released]
                    position += len(batch)
                    yield batch
                if self.closed and position >= self.released:
                    return
                if position < self.released:
                    continue
                waiter = self._changed()
                if silence is None:
                    await waiter
                    continue
                try:
                    await silence.wait(waiter)
                except TimeoutError:
                    with contextlib.suppress(ValueError):  # (unless a wake took it meanwhile)
                        self._waiting.remove(waiter)  # a long silence leaves no futures behind
                    yield []
        finally:
            if silence is not None:
                silence.close()
