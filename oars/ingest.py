"""The ingester: files added to vector stores become chunks, in the background, on the loop
that serves (one task a replica, started with the app like the sweeper).

It takes up every file `in_progress` (so at startup, what a restart cut off), reads its bytes
(`oars.blobs`), extracts and chunks the text (`oars.chunking`) in a thread, embeds the chunks
with the server's embedding model (when it runs one), and keeps its chunks and their vectors
with its `completed` in one transaction, or marks it `failed` with `last_error`. A store's
vectors are all of one model: a file of a store embedded by another model, or added while the
server runs none, fails saying so. Replicas may
index the same file side by side: the store keeps the first and ignores the other
(`index_vector_file`), and a file added again meanwhile is left for its new adding.
"""

from __future__ import annotations

import asyncio
import logging

from oars.background import Background
from oars.blobs import Blobs
from oars.chunking import Tokenizer, Unsupported, chunks, extract, word_tokens
from oars.embeddings import Embedder, embedded_by
from oars.errors import StoreUnavailable, UpstreamError
from oars.store import ChunkVectors, EmbeddedBy, Pending, Store, WrongEmbedding
from oars.vector_stores import MAX_FILE_CHUNKS

log = logging.getLogger("oars.ingest")

_BATCH = 16  # files a round takes up
_EMBED_BATCH = 32  # chunks a call of the embedding model takes (a search's query waits less)


def _cut(data: bytes, pending: Pending, tokenizer: Tokenizer) -> list[tuple[str, int]]:
    static = pending.chunking["static"]
    text = extract(data, pending.filename)
    found = chunks(text, tokenizer, static["max_chunk_size_tokens"], static["chunk_overlap_tokens"])
    if len(found) > MAX_FILE_CHUNKS:
        raise Unsupported(
            f"The file makes {len(found)} chunks; at most {MAX_FILE_CHUNKS} are kept of one "
            "file (split it, or use larger chunks).",
            "invalid_file",
        )
    return [(chunk.text, chunk.tokens) for chunk in found]


class Postponed(Exception):
    """The round stops: what it needs (the embedding server) cannot be reached now."""


async def _embedded(embedder: Embedder, by: EmbeddedBy, texts: list[str]) -> ChunkVectors:
    rows: list[bytes] = []
    for start in range(0, len(texts), _EMBED_BATCH):
        found = await embedder.embed(texts[start : start + _EMBED_BATCH])
        rows += [row.astype("<f4").tobytes() for row in found.vectors]
    return ChunkVectors(by, rows)


class Ingester(Background):
    name = "ingester"

    def __init__(
        self,
        store: Store,
        blobs: Blobs,
        *,
        embedder: Embedder | None = None,
        tokenizer: Tokenizer = word_tokens,
        every: float = 5.0,
    ) -> None:
        self.store, self.blobs, self.embedder = store, blobs, embedder
        self.tokenizer, self.every = tokenizer, every
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
            await self.store.fail_vector_file(pending, exc.code, str(exc))
            return False
        except Exception as exc:  # a file that breaks the reader fails alone, not the loop
            log.exception("file %s could not be indexed", pending.file_id)
            await self.store.fail_vector_file(pending, "server_error", f"Cannot read it: {exc}")
            return False
        if not cut:
            await self.store.fail_vector_file(pending, "invalid_file", "The file holds no text.")
            return False
        embedder = self.embedder
        held = await self.store.vector_store_embedding(pending.vector_store_id)
        given = embedded_by(embedder)
        if held is not None and held != given:
            await self.store.fail_vector_file(
                pending, "server_error", str(WrongEmbedding(held, given))
            )
            return False
        vectors = None
        if embedder is not None and given is not None:
            try:
                vectors = await _embedded(embedder, given, [c for c, _ in cut])
            except UpstreamError as exc:
                if exc.retryable:  # the embedding server is down: the file waits for it
                    raise Postponed(str(exc)) from exc
                await self.store.fail_vector_file(
                    pending, "server_error", f"Cannot embed it: {exc}"
                )
                return False
            except Exception as exc:  # the model failed this file: it fails, the loop goes on
                log.exception("file %s could not be embedded", pending.file_id)
                await self.store.fail_vector_file(
                    pending, "server_error", f"Cannot embed it: {exc}"
                )
                return False
        try:
            return await self.store.index_vector_file(pending, cut, self.tokenizer.name, vectors)
        except WrongEmbedding as exc:  # (another replica's model came first)
            await self.store.fail_vector_file(pending, "server_error", str(exc))
        except StoreUnavailable:
            raise
        except Exception as exc:  # what this file's text did to the database: it fails alone
            log.exception("file %s could not be kept", pending.file_id)
            await self.store.fail_vector_file(pending, "server_error", f"Cannot keep it: {exc}")
        return False

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
            except Postponed as exc:
                log.warning("the ingester waits for the embedding model: %s", exc)
            try:
                async with asyncio.timeout(self.every):
                    await self._wake.wait()
            except TimeoutError:
                pass
