"""Tokens from the engine thread to the event loops, one wake-up per forward pass.

`loop.call_soon_threadsafe` wakes the loop by writing to a socket, and CPython gives up the
GIL around that write. On 2 cores the woken loop thread took it there and kept it while it
turned the token into events and sent them (about half a millisecond), and the engine thread,
between two passes, waited: 0.59 ms of a 21 ms step (measured in an in-process server, one
stream, median). With several streams that happened once per stream per step.

Here the engine thread only queues what it has for a loop (`post`) and wakes each loop once,
when it is about to leave the GIL anyway: just before the next forward pass, or before it
goes idle (`flush`). The wake-up is written without giving up the GIL, so the loop thread
runs while llama.cpp computes, not before it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any

Deliver = Callable[[Any], object]


def _gil_held_write() -> Callable[[int], object]:
    """Write one byte to a file descriptor. Through `ctypes.PyDLL` the call keeps the GIL
    (`os.write` and every `ctypes.CDLL` function release it); elsewhere `os.write`."""
    try:
        libc = ctypes.PyDLL(None)
        write = libc.write
    except (OSError, AttributeError):  # no C library symbols in this process (Windows)
        return lambda fd: os.write(fd, b"\1")
    write.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t
    return lambda fd: write(fd, b"\1", 1)


_write_byte = _gil_held_write()


class Mailbox:
    """What the engine has for one event loop, delivered on that loop in posting order."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)
        self._items: deque[tuple[Deliver, object]] = deque()
        self._woken = False
        self._read, self._write = os.pipe()
        os.set_blocking(self._read, False)
        os.set_blocking(self._write, False)
        loop.add_reader(self._read, self._drain)
        weakref.finalize(loop, _close, self._read, self._write)

    def put(self, deliver: Deliver, item: object) -> None:
        """Any thread: `deliver(item)` will run on the loop after the next `wake`."""
        self._items.append((deliver, item))

    def wake(self) -> None:
        """Any thread: have the loop deliver what was put (one byte, however many items)."""
        loop = self._loop()
        if self._woken or loop is None or loop.is_closed():
            return
        self._woken = True
        with contextlib.suppress(OSError):  # full pipe: the loop has a byte to read already
            _write_byte(self._write)

    def _drain(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 4096)
        self._woken = False  # before taking items: one put after this gets its own wake
        items = self._items
        while items:
            deliver, item = items.popleft()
            deliver(item)


class Inbox:
    """One generation's items on its loop, for the one task that reads them: a mailbox
    delivers each with `put`, and `take` returns all that came, waiting for the first. It is
    on every token's path, in fewer calls than an `asyncio.Queue` makes there."""

    def __init__(self) -> None:
        self._items: list[Any] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: object) -> None:
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[Any]:
        if not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


def _close(*fds: int) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


class Handover:
    """Items posted by the engine thread during a step, sent to their loops by `flush`."""

    def __init__(self) -> None:
        self._boxes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Mailbox] = (
            weakref.WeakKeyDictionary()
        )
        self._dirty: set[Mailbox] = set()

    def mailbox(self, loop: asyncio.AbstractEventLoop) -> Mailbox:
        """The loop's mailbox; on that loop's thread (it registers a reader)."""
        box = self._boxes.get(loop)
        if box is None:
            box = self._boxes[loop] = Mailbox(loop)
        return box

    def post(self, box: Mailbox, deliver: Deliver, item: object) -> None:
        """Engine thread: queue `deliver(item)` for the box's loop, to go at the next flush."""
        box.put(deliver, item)
        self._dirty.add(box)

    def flush(self) -> None:
        """Engine thread: wake every loop that has something."""
        if self._dirty:
            dirty, self._dirty = self._dirty, set()
            for box in dirty:
                box.wake()
