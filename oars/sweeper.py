"""One sweeper for what expires, run by every replica: stored responses and conversations
older than the operator's `--retention` (none by default), vector stores past their
`expires_at` (marked `expired`, their chunks dropped), uploaded files past their `expires_at`
(the row, then the bytes: a row always names bytes that are there), and what an upload cut off
by a crash left in the files' folder (a `.part-…` nothing has written to for `STALE_PART`
seconds; a live upload writes at least every minute, or is cut off as stalled).

Until it runs, an expired file is already gone for every route (`oars.http.files`); the sweeper
frees its room. Replicas sweep side by side: a file two of them find is deleted by one, and
removing bytes that are gone is nothing.
"""

from __future__ import annotations

import asyncio
import logging
import time

from oars.background import Background
from oars.blobs import Blobs
from oars.errors import StoreUnavailable
from oars.store import Store

log = logging.getLogger("oars.sweeper")

STALE_PART = 3600.0
_BATCH = 500  # files a round deletes at most (the next round takes the rest)


class Sweeper(Background):
    name = "sweeper"

    def __init__(
        self, store: Store, blobs: Blobs, *, every: float = 60.0, retention: float = 0.0
    ) -> None:
        """`retention`: seconds a stored response or conversation is kept (0: until deleted)."""
        self.store, self.blobs, self.every, self.retention = store, blobs, every, retention

    async def sweep(self, now: float) -> int:
        """One round at `now` (a time.time()): how many files went."""
        gone = 0
        for file_id in await self.store.expired_files(now, limit=_BATCH):
            if await self.store.delete_file(file_id):
                gone += 1
            await asyncio.to_thread(self.blobs.remove, file_id)
        await asyncio.to_thread(self.blobs.drop_parts, now - STALE_PART)
        expired = await self.store.expire_vector_stores(now)
        if expired:
            log.info("the sweeper expired %d vector stores", expired)
        if self.retention:
            while forgotten := await self.store.forget_before(
                int(now - self.retention), limit=_BATCH
            ):
                log.info("the sweeper deleted %d responses and conversations past retention",
                         forgotten)  # fmt: skip
                if forgotten < _BATCH:
                    break
        return gone

    async def _run(self) -> None:
        while True:
            try:
                gone = await self.sweep(time.time())
            except StoreUnavailable as exc:  # the next round tries again
                log.warning("the sweeper could not read the store: %s", exc)
            except OSError as exc:
                log.warning("the sweeper could not clear the files' folder: %s", exc)
            else:
                if gone:
                    log.info("the sweeper removed %d expired files", gone)
            await asyncio.sleep(self.every)
