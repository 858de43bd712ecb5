"""The ingester: files added to vector stores become chunks, in the background, on the loop
that serves (one task a replica, started with the app like the sweeper).

It takes up every file `in_progress` (so at startup, what a restart cut off), reads its bytes
(`oars.blobs`), extracts and chunks the text (`oars.chunking`) in a thread, and keeps its chunks
with its `completed` in one transaction, or marks it `failed` with `last_error`. Replicas may
index the same file side by side: the store keeps the first and ignores the other
(`index_vector_file`), and a file added again meanwhile is left for its new adding.
"""

from __future__ import annotations

import asyncio
import logging

from oars.background import Background
from oars.blobs import Blobs
from oars.chunking import Tokenizer, Unsupported, chunks, extract, word_tokens
from oars.errors import StoreUnavailable
from oars.store import Pending, Store

log = logging.getLogger("oars.ingest")

_BATCH = 16  # files a round takes up


def _cut(data: bytes, pending: Pending, tokenizer: Tokenizer) -> list[tuple[str, int]]:
    static = pending.chunking["static"]
    text = extract(data, pending.filename)
    found = chunks(text, tokenizer, static["max_chunk_size_tokens"], static["chunk_overlap_tokens"])
    return [(chunk.text, chunk.tokens) for chunk in found]


class Ingester(Background):
    name = "ingester"

    def __init__(
        self, store: Store, blobs: Blobs, *, tokenizer: Tokenizer = word_tokens, every: float = 5.0
    ) -> None:
        self.store, self.blobs, self.tokenizer, self.every = store, blobs, tokenizer, every
        self._wake = asyncio.Event()

    def nudge(self) -> None:
        """Files were added: take them up now rather than at the next round."""
        self._wake.set()

    async def ingest(self, pending: Pending) -> bool:
        """Index one file (or fail it): whether it is now indexed."""
        handle = self.blobs.open(pending.file_id)
        if handle is None:  # (a row without its bytes: a deleted file's are gone with it)
            await self.store.fail_vector_file(pending, "server_error", "Its bytes are gone.")
            return False
        try:
            with handle:
                data = await asyncio.to_thread(handle.read)
            cut = await asyncio.to_thread(_cut, data, pending, self.tokenizer)
        except Unsupported as exc:
            await self.store.fail_vector_file(pending, "unsupported_file", str(exc))
            return False
        except Exception as exc:  # a file that breaks the reader fails alone, not the loop
            log.exception("file %s could not be indexed", pending.file_id)
            await self.store.fail_vector_file(pending, "server_error", f"Cannot read it: {exc}")
            return False
        if not cut:
            await self.store.fail_vector_file(pending, "invalid_file", "The file holds no text.")
            return False
        return await self.store.index_vector_file(pending, cut, self.tokenizer.name)

    async def round(self) -> int:
        """Index what is pending, until nothing is: how many files were indexed."""
        done = 0
        while pending := await self.store.pending_vector_files(limit=_BATCH):
            for one in pending:
                done += await self.ingest(one)
            if len(pending) < _BATCH:
                break
        return done

    async def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                await self.round()
            except StoreUnavailable as exc:  # the next round tries again
                log.warning("the ingester could not reach the store: %s", exc)
            try:
                async with asyncio.timeout(self.every):
                    await self._wake.wait()
            except TimeoutError:
                pass
