"""A timeout on silence that costs nothing per wait: for loops that wait for the next chunk of a
stream thousands of times a second and give up only after seconds of nothing.

`asyncio.timeout` around each wait schedules a timer and cancels it again, and `asyncio.wait_for`
also makes a task: at 64 paced streams these were a twentieth of the gateway's CPU (py-spy,
2026-11-25). A `Silence` keeps one timer, left armed across waits: each wait only moves the
deadline, and the timer, when it fires early, moves itself to the deadline.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class Silence:
    """`await silence.wait(awaitable)` is `awaitable`'s result, or `TimeoutError` once it has
    waited `seconds` for it. Only a wait is ever cancelled: what the task does between two waits
    is never interrupted. For one task at a time; `close()` when done with it."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._waiting: asyncio.Task[object] | None = None  # the task inside `wait`
        self._expired = False

    async def wait(self, awaitable: Awaitable[T], seconds: float | None = None) -> T:
        """`seconds`: this wait's allowance, and every later one's (default: as before)."""
        if seconds is not None:
            self.seconds = seconds
        loop = asyncio.get_running_loop()
        self._deadline = loop.time() + self.seconds
        if self._timer is None or self._timer.when() > self._deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer = loop.call_at(self._deadline, self._check)
        task = asyncio.current_task()
        assert task is not None
        self._waiting, self._expired = task, False
        cancelling = task.cancelling()  # cancels asked before this wait are not its own
        try:
            return await awaitable
        except asyncio.CancelledError:
            if self._expired and task.uncancel() <= cancelling:
                raise TimeoutError(f"nothing came for {self.seconds:g} s") from None
            raise
        finally:
            self._waiting = None

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _check(self) -> None:
        self._timer = None
        if self._waiting is None:
            return  # between waits: the next one arms it again
        loop = asyncio.get_running_loop()
        if loop.time() < self._deadline:
            self._timer = loop.call_at(self._deadline, self._check)
            return
        self._expired = True
        self._waiting.cancel()
