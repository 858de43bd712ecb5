"""The lanes of one WebSocket, and what it keeps of its responses.

A lane (`stream_id` on `response.create`; none: the socket's default lane) runs its requests
one after another, in the order they came; lanes run at the same time. A socket has at most
`MAX_LANES` lanes with work, and a lane at most `MAX_QUEUED` requests waiting behind the one it
runs: past either, the request is refused (429) and nothing else changes.

The socket keeps the context (input and output) of its last `MAX_CONTEXTS` finished responses:
by `previous_response_id`, a request continues its lane's last response, or forks from one made
on another lane, with no store. An older response of its own lane is not its to continue.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from oars.errors import ClientError
from oars.store import Chain

MAX_LANES = 16  # lanes with work at once, on one socket
MAX_QUEUED = 8  # requests waiting on one lane behind the one it runs
MAX_CONTEXTS = 32  # finished responses the socket keeps the context of

Lane = str | None  # a `stream_id`; None: the default lane
Work = TypeVar("Work")


class LaneLimit(ClientError):
    """A request past a socket's limits: too many lanes, or too many requests on one."""

    status = 429

    def __init__(self, message: str, code: str) -> None:
        super().__init__(message, param="stream_id", code=code)

    @classmethod
    def lanes(cls) -> LaneLimit:
        return cls(
            f"This socket already has {MAX_LANES} lanes with work, the most it may; send on "
            "one of them, or wait for one to finish.",
            "too_many_lanes",
        )

    @classmethod
    def queued(cls, lane: Lane) -> LaneLimit:
        where = "The default lane" if lane is None else f"Lane {lane!r}"
        return cls(
            f"{where} already has {MAX_QUEUED} requests waiting, the most it may.",
            "too_many_queued_requests",
        )


@dataclass(frozen=True)
class Context:
    """A finished response's context, the create body it came from (what an automatic
    successor inherits), and its lane."""

    chain: Chain
    body: dict[str, Any]
    lane: Lane


class Contexts:
    """The socket's last `MAX_CONTEXTS` finished responses, and each lane's last of them.

    A lane continues its last response, or forks from a response made on another lane; an
    older response of its own lane is not its to continue (as on a socket without lanes)."""

    def __init__(self) -> None:
        self._by_id: OrderedDict[str, Context] = OrderedDict()
        self._last: dict[Lane, str] = {}

    def get(self, response_id: str | None, lane: Lane) -> Context | None:
        """The context a request on `lane` may continue (None: not this socket's to give)."""
        context = None if response_id is None else self._by_id.get(response_id)
        if context is None or (context.lane == lane and self._last.get(lane) != response_id):
            return None
        return context

    def keep(self, response_id: str, context: Context) -> None:
        """The lane's new last response."""
        self._by_id[response_id] = context
        self._last[context.lane] = response_id
        while len(self._by_id) > MAX_CONTEXTS:
            self.forget(next(iter(self._by_id)))

    def forget(self, response_id: str | None) -> None:
        context = self._by_id.pop(response_id, None) if response_id is not None else None
        if context is not None and self._last.get(context.lane) == response_id:
            del self._last[context.lane]


class Lanes(Generic[Work]):
    """The lanes with work: each a queue, and one task that runs its work in order (`run`)."""

    def __init__(self, run: Callable[[Lane, Work], Awaitable[None]]) -> None:
        self._run = run
        self._queues: dict[Lane, deque[Work]] = {}
        self._tasks: dict[Lane, asyncio.Task[None]] = {}

    def add(self, lane: Lane, work: Work) -> None:
        """Queue work on its lane (`LaneLimit` past the limits), starting the lane if idle."""
        queue = self._queues.get(lane)
        if queue is None:
            if len(self._queues) >= MAX_LANES:
                raise LaneLimit.lanes()
            queue = self._queues[lane] = deque()
            self._tasks[lane] = asyncio.create_task(self._work(lane, queue))
        elif len(queue) >= MAX_QUEUED:
            raise LaneLimit.queued(lane)
        queue.append(work)

    async def _work(self, lane: Lane, queue: deque[Work]) -> None:
        try:
            while queue:
                await self._run(lane, queue.popleft())
        finally:
            del self._queues[lane], self._tasks[lane]

    async def close(self) -> None:
        """Drop what waits; wait for the work running (the caller has stopped it)."""
        for queue in self._queues.values():
            queue.clear()
        tasks = list(self._tasks.values())
        if tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait(tasks, timeout=10)
