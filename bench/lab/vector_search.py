"""What file_search's vector stores cost: ingestion with the embedding model, and a search's
latency at 10k and 100k chunks, on SQLite (numpy) and PostgreSQL (pgvector).

The questions (hybrid search: chunks keep a vector from the server's embedding model):

1. Ingestion. How many chunks a second does the ingester index when it embeds each chunk,
   against the same ingestion without a model (keyword only)? The real path: files' bytes in
   `oars.blobs.Blobs`, their rows and a vector store in a real `SqlStore`, one
   `oars.ingest.Ingester.round()` with `LlamaEmbedder` on the default embedding model (as
   `oars serve` runs it: one thread a core), and the same round with `embedder=None` on a
   fresh store beside it. The files are English-like text, generated (a fixed word list, a
   seeded random), cut by `static` chunking of 200 tokens with an overlap of 50.

2. Search. How long does a search take over a store of 10k and of 100k chunks, and how does
   that compare with a brute force in numpy over the same vectors held in memory (`matrix @ q`,
   argpartition to the top 50, sorted)? The stores are filled through
   `SqlStore.index_vector_file` directly, files of 1,000 chunks with short generated texts and
   random unit float32 vectors (seeded) recorded as the default model's (384 dimensions): the
   model is too slow to embed 100k chunks here. Timed, after one warm-up, over `--queries`
   queries: `search_vectors` (top 50; numpy over the store's copy on SQLite, pgvector in the
   database on PostgreSQL), and the whole hybrid `oars.ranking.search_store` as `/search`
   runs it (a short text query embedded by the real model, keyword and vector lists, fusion;
   top 10); beside them its parts, the query's embedding and the keyword list. On SQLite the
   first `search_vectors` reads the store's vectors into memory: that first call is reported
   apart. The top 50 of `search_vectors` is checked against numpy's (the share found by both).

PostgreSQL is a throwaway server started here as the tests start theirs (Debian's binaries,
`initdb -A trust`, loopback, fsync off; as the `postgres` user when root), a database per
store, stopped at the end. Figures are noisy on a shared machine: the ratio against the
reference measured in the same run is what counts. Two things move them a lot when other work
holds a core: llama.cpp's batch threads (one a core) and numpy's BLAS threads stall at their
barriers while one of them waits for a core (`OPENBLAS_NUM_THREADS=1` in the environment pins
numpy to one); and PostgreSQL plans a prepared statement for its parameters only in its first
five runs, then generically (the first call's figure is given apart).

    python -m bench.lab.vector_search [--sizes 10000,100000] [--ingest-chunks 100]
        [--queries 50] [--backends sqlite,postgresql]
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from sqlalchemy import func, select

from oars.blobs import Blobs
from oars.embeddings import Embedder, LlamaEmbedder
from oars.ingest import Ingester
from oars.ranking import search_store
from oars.store import (
    ChunkVectors,
    EmbeddedBy,
    NewVectorFile,
    NewVectorStore,
    SqlStore,
    StoredFile,
)
from oars.store.schema import vector_chunks
from oars.vector_stores import Ranking
from oars.weights import DEFAULT_EMBEDDING, pull_embedding

Matrix = npt.NDArray[np.float32]
MAX_TOKENS, OVERLAP = 200, 50  # the ingestion's static chunking
CHUNKING = {
    "type": "static",
    "static": {"max_chunk_size_tokens": MAX_TOKENS, "chunk_overlap_tokens": OVERLAP},
}
CHUNKS_A_FILE = 20  # of the ingestion's files
FILL_FILE = 1_000  # chunks a file of the search's stores
FILL_WORDS = 30  # words a chunk of the search's stores
TOP = 50  # the vector list's depth, as the hybrid search asks (`ranking.CANDIDATES`)
RESULTS = 10  # a search's `max_num_results` (the API's default)
SEED = 20261129

_VOCABULARY = """
the of and to in is was for that with as on by at from it his her they this which be are
were had have not but all one their there an or been has more when who will would out so up
what about into than them can only other new some could time these two may then do first
any like now my such make over our even most made after also did many before must through
back years where much your way well down should because each just those people how too
little state good very world still own see men work long get here between both life being
under never day same another know while last might us great old year off come since against
go came right used take three river stone light garden music paper window city water market
field winter summer bridge forest letter engine harbour valley station mountain island
kitchen library village morning evening doctor teacher farmer soldier captain student
journey country weather history science language question answer reason number family
house table chair door road street wall floor ship train horse bread salt iron glass silver
copper cotton wool coal grain fruit flower tree leaf seed root branch cloud storm rain snow
wind fire smoke ash sand clay rock hill lake shore coast sea ocean wave tide moon star sun
north south east west quiet bright dark heavy narrow broad ancient modern careful simple
strange gentle sudden slow quick warm cold dry wet deep shallow early late open closed
build carry follow gather measure mend plant press raise repair settle signal travel visit
"""
WORDS = _VOCABULARY.split()


# ---- text ---------------------------------------------------------------------------------


def _weights() -> list[float]:
    """Zipf-like: the list's first words (the, of, and) far more often than its last."""
    return [1.0 / (rank + 8) for rank in range(len(WORDS))]


def sentences(rng: random.Random, words: int) -> str:
    """About `words` words of English-like sentences (8 to 20 words each)."""
    drawn = rng.choices(WORDS, weights=_weights(), k=words)
    out, start = [], 0
    while start < len(drawn):
        end = start + rng.randint(8, 20)
        sentence = " ".join(drawn[start:end])
        out.append(sentence[0].upper() + sentence[1:] + ".")
        start = end
    return " ".join(out)


def query_text(rng: random.Random) -> str:
    """A short query: four words of the list, drawn evenly (so mostly the rarer ones)."""
    return " ".join(rng.sample(WORDS, 4))


def unit_rows(rng: np.random.Generator, n: int, dims: int) -> Matrix:
    rows = rng.standard_normal((n, dims), dtype=np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows


# ---- PostgreSQL -----------------------------------------------------------------------------


def _pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not found:
        raise SystemExit("PostgreSQL is not installed (Debian's postgresql): use --backends sqlite")
    return found[-1]


def _as_postgres(cmd: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else cmd


class Postgres:
    """A throwaway PostgreSQL on a free loopback port, its socket in its data folder."""

    def __init__(self) -> None:
        self.data = tempfile.mkdtemp(prefix="oars-bench-pg-")
        if os.geteuid() == 0:
            shutil.chown(self.data, "postgres", "postgres")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = int(s.getsockname()[1])
        self.url = f"postgresql://oars@127.0.0.1:{self.port}"

    def start(self) -> None:
        subprocess.run(
            _as_postgres([_pg_bin("initdb"), "-D", self.data, "-A", "trust", "-U", "oars"]),
            check=True,
            capture_output=True,
        )
        options = f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1 -c fsync=off"
        start = [_pg_bin("pg_ctl"), "-D", self.data, "-o", options, "-l", f"{self.data}/log"]
        subprocess.run(_as_postgres([*start, "-w", "start"]), check=True, capture_output=True)

    async def database(self) -> str:
        """A fresh, empty database: its URL."""
        import asyncpg

        name = f"b_{secrets.token_hex(6)}"
        conn = await asyncpg.connect(f"{self.url}/postgres")
        try:
            await conn.execute(f"CREATE DATABASE {name}")
        finally:
            await conn.close()
        return f"{self.url}/{name}"

    def stop(self) -> None:
        subprocess.run(
            _as_postgres([_pg_bin("pg_ctl"), "-D", self.data, "-m", "fast", "stop"]),
            check=False,
            capture_output=True,
        )
        shutil.rmtree(self.data, ignore_errors=True)


# ---- stores ---------------------------------------------------------------------------------


async def _store(url: str) -> SqlStore:
    store = SqlStore(url)
    await store.open()
    return store


async def _new_vector_store(store: SqlStore, name: str, files: list[NewVectorFile]) -> str:
    vs_id = f"vs_{secrets.token_hex(12)}"
    made = NewVectorStore(vs_id, time.time_ns(), name, None, {}, None)
    await store.create_vector_store(made, files, tenant="")
    return vs_id


async def _chunk_count(store: SqlStore, vs_id: str) -> int:
    query = select(func.count()).select_from(vector_chunks)
    async with store.engine.connect() as conn:
        counted = await conn.execute(query.where(vector_chunks.c.vector_store_id == vs_id))
        return int(counted.scalar_one())


# ---- 1. ingestion ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Ingested:
    chunks: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.chunks / self.seconds


async def ingest(url: str, folder: Path, embedder: Embedder | None, texts: list[str]) -> Ingested:
    """Upload `texts` as files, add them to a new vector store, and time one ingester round."""
    store, blobs = await _store(url), Blobs(folder)
    try:
        added = []
        for i, text in enumerate(texts):
            file_id = f"file-{secrets.token_hex(12)}"
            part = blobs.begin()
            part.write(text.encode())
            blobs.keep(part, file_id)
            await store.create_file(
                StoredFile(file_id, part.size, time.time_ns(), f"doc{i}.txt", "assistants")
            )
            added.append(NewVectorFile(file_id, {}, CHUNKING))
        vs_id = await _new_vector_store(store, "ingest", added)
        ingester = Ingester(store, blobs, embedder=embedder)
        started = time.perf_counter()
        indexed = await ingester.round()
        seconds = time.perf_counter() - started
        assert indexed == len(texts), f"{indexed} of {len(texts)} files indexed"
        return Ingested(await _chunk_count(store, vs_id), seconds)
    finally:
        await store.close()


# ---- 2. search ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Filled:
    vs_id: str
    matrix: Matrix  # row i: the chunk whose text starts "c{i} "
    seconds: float


async def fill(store: SqlStore, n: int, seed: int) -> Filled:
    """A store of `n` chunks (files of `FILL_FILE`), with random unit vectors recorded as the
    default embedding model's, through `index_vector_file` as the ingester keeps a file."""
    rng, vectors = random.Random(seed), np.random.default_rng(seed)
    by = EmbeddedBy(DEFAULT_EMBEDDING.name, 384)
    matrix = unit_rows(vectors, n, by.dimensions)
    sizes = [min(FILL_FILE, n - start) for start in range(0, n, FILL_FILE)]
    added = []
    for i in range(len(sizes)):
        file_id = f"file-{secrets.token_hex(12)}"
        await store.create_file(StoredFile(file_id, 0, time.time_ns(), f"f{i}.txt", "assistants"))
        added.append(NewVectorFile(file_id, {}, CHUNKING))
    vs_id = await _new_vector_store(store, f"fill{n}", added)
    pending = await store.pending_vector_files(limit=len(sizes))
    order = {f.file_id: i for i, f in enumerate(added)}
    pending.sort(key=lambda p: order[p.file_id])
    started = time.perf_counter()
    first = 0
    for one, size in zip(pending, sizes, strict=True):
        chunks = [
            (f"c{first + k} {sentences(rng, FILL_WORDS)}", FILL_WORDS + 4) for k in range(size)
        ]
        rows = [row.astype("<f4").tobytes() for row in matrix[first : first + size]]
        assert await store.index_vector_file(one, chunks, "words", ChunkVectors(by, rows))
        first += size
    return Filled(vs_id, matrix, time.perf_counter() - started)


def numpy_top(matrix: Matrix, query: Matrix, k: int = TOP) -> npt.NDArray[np.intp]:
    """The reference: brute force over vectors already in memory, the top `k` sorted."""
    similar = matrix @ query
    top = np.argpartition(-similar, k - 1)[:k]
    return top[np.argsort(-similar[top])]


@dataclass(frozen=True)
class Timed:
    p50: float  # ms
    p95: float

    @staticmethod
    def of(seconds: Sequence[float]) -> Timed:
        ms = sorted(s * 1e3 for s in seconds)
        return Timed(ms[len(ms) // 2], ms[min(len(ms) - 1, round(0.95 * (len(ms) - 1)))])


async def timed(run: Callable[[int], Awaitable[Any]], count: int) -> Timed:
    """`run(i)` for i in 0..count-1 after one warm-up run (of -1), each timed."""
    await run(-1)
    seconds = []
    for i in range(count):
        started = time.perf_counter()
        await run(i)
        seconds.append(time.perf_counter() - started)
    return Timed.of(seconds)


@dataclass
class Searched:
    backend: str
    size: int
    fill_seconds: float
    first_ms: float  # the first search_vectors (on SQLite: reads the store's vectors)
    agreement: float  # the share of numpy's top 50 that search_vectors found
    figures: dict[str, Timed]


async def search(
    store: SqlStore, backend: str, n: int, embedder: Embedder, queries: int
) -> Searched:
    filled = await fill(store, n, SEED + n)
    rng = np.random.default_rng(SEED)
    vectors = unit_rows(rng, queries + 1, filled.matrix.shape[1])
    texts = [query_text(random.Random(SEED + i)) for i in range(queries + 1)]

    def vector(i: int) -> Matrix:
        row: Matrix = vectors[i + 1]  # the warm-up is row 0
        return row

    started = time.perf_counter()
    first = await store.search_vectors(filled.vs_id, vector(0).tobytes(), None, TOP)
    first_ms = (time.perf_counter() - started) * 1e3
    found = {int(hit.text.split(" ", 1)[0][1:]) for hit in first}
    agreement = len(found & set(numpy_top(filled.matrix, vector(0)).tolist())) / TOP

    async def reference(i: int) -> None:
        numpy_top(filled.matrix, vector(i))

    async def vectors_only(i: int) -> None:
        await store.search_vectors(filled.vs_id, vector(i).tobytes(), None, TOP)

    async def embedding(i: int) -> None:
        await embedder.embed([texts[i + 1]])

    async def keyword(i: int) -> None:
        words = texts[i + 1].split()
        await store.search_chunks(filled.vs_id, words, None, TOP)

    async def hybrid(i: int) -> None:
        await search_store(
            store,
            filled.vs_id,
            [texts[i + 1]],
            embedder=embedder,
            filters=None,
            limit=RESULTS,
            ranking=Ranking(),
        )

    figures = {
        "numpy": await timed(reference, queries),
        "search_vectors": await timed(vectors_only, queries),
        "query embedding": await timed(embedding, queries),
        "search_chunks": await timed(keyword, queries),
        "search_store": await timed(hybrid, queries),
    }
    return Searched(backend, n, filled.seconds, first_ms, agreement, figures)


# ---- the run --------------------------------------------------------------------------------


async def run(args: argparse.Namespace, folder: Path) -> None:
    backends = args.backends.split(",")
    postgres = Postgres() if "postgresql" in backends else None

    async def url(name: str) -> str:
        if name == "postgresql":
            assert postgres is not None
            return await postgres.database()
        return f"sqlite:///{folder}/{secrets.token_hex(6)}.db"

    embedder = LlamaEmbedder(pull_embedding(), DEFAULT_EMBEDDING.name)
    try:
        if postgres is not None:
            postgres.start()
        rng = random.Random(SEED)
        files = max(1, -(-args.ingest_chunks // CHUNKS_A_FILE))
        tokens = (MAX_TOKENS - OVERLAP) * (CHUNKS_A_FILE - 1) + MAX_TOKENS
        # a word is a token and so is each sentence's full stop (about 1 in 14 tokens)
        texts = [sentences(rng, tokens * 13 // 14) for _ in range(files)]
        ingested: dict[str, tuple[Ingested, Ingested]] = {}
        for backend in backends:
            bare = await ingest(await url(backend), folder / f"b{backend}", None, texts)
            print(f"ingest {backend} keyword only: {bare.rate:.0f} chunks/s", file=sys.stderr)
            embedded = await ingest(await url(backend), folder / f"e{backend}", embedder, texts)
            print(f"ingest {backend} embedded: {embedded.rate:.1f} chunks/s", file=sys.stderr)
            ingested[backend] = (embedded, bare)
        searched = []
        for n in [int(s) for s in args.sizes.split(",")]:
            for backend in backends:
                store = await _store(await url(backend))
                try:
                    searched.append(await search(store, backend, n, embedder, args.queries))
                finally:
                    await store.close()
                print(f"searched {backend} {n}", file=sys.stderr)
    finally:
        embedder.close()
        if postgres is not None:
            postgres.stop()
    report(args, ingested, searched)


def report(
    args: argparse.Namespace,
    ingested: dict[str, tuple[Ingested, Ingested]],
    searched: list[Searched],
) -> None:
    print(f"\n    {' '.join([sys.executable, '-m', 'bench.lab.vector_search', *sys.argv[1:]])}\n")
    print(
        f"Ingestion: one Ingester round; static chunking {MAX_TOKENS} tokens, overlap "
        f"{OVERLAP}; files of ~{CHUNKS_A_FILE} chunks; model {DEFAULT_EMBEDDING.name}."
    )
    print("| backend | chunks | embedded chunks/s | keyword-only chunks/s | ratio |")
    print("|---|---|---|---|---|")
    for backend, (embedded, bare) in ingested.items():
        print(
            f"| {backend} | {embedded.chunks} | {embedded.rate:.1f} | {bare.rate:.0f} "
            f"| {embedded.rate / bare.rate:.4f} |"
        )
    print(
        f"\nSearch: ms a query, p50 / p95 of {args.queries} after one warm-up; reference: "
        f"numpy brute force (top {TOP}) over the same vectors in memory; ratio of the p50s."
    )
    print("| backend | chunks | what | p50 | p95 | numpy p50 | ratio |")
    print("|---|---|---|---|---|---|---|")
    for s in searched:
        ref = s.figures["numpy"]
        for what, t in s.figures.items():
            compared = what in ("search_vectors", "search_store")  # (the others: its parts)
            ratio = f"{t.p50 / ref.p50:.1f}" if compared else "-"
            cells = f"{t.p50:.2f} | {t.p95:.2f} | {ref.p50:.2f} | {ratio}"
            print(f"| {s.backend} | {s.size} | {what} | {cells} |")
    print(
        "\n| backend | chunks | fill (index_vector_file) s | first search_vectors ms | top-50 agreement |"
    )
    print("|---|---|---|---|---|")
    for s in searched:
        print(
            f"| {s.backend} | {s.size} | {s.fill_seconds:.1f} ({s.size / s.fill_seconds:.0f} "
            f"chunks/s) | {s.first_ms:.0f} | {s.agreement:.2f} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10000,100000", help="chunks of the searched stores")
    parser.add_argument(
        "--ingest-chunks", type=int, default=100, help="chunks the ingestion makes (about)"
    )
    parser.add_argument("--queries", type=int, default=50, help="timed queries a figure")
    parser.add_argument("--backends", default="sqlite,postgresql")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oars-bench-vs-") as folder:
        asyncio.run(run(args, Path(folder)))


if __name__ == "__main__":
    main()
