"""A replica's background work: a task started with the app and cancelled at its end."""

from __future__ import annotations

import asyncio


class Background:
    """Subclasses say what runs (`_run`, a loop that never returns) and under which name."""

    name = "background"
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=self.name)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        raise NotImplementedError
