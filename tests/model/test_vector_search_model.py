"""Hybrid search on the real default embedding model, through the openai SDK, on a real SQLite
file and a real PostgreSQL (with pgvector, which `make postgres` builds): paraphrases that share
no word with any file of the corpus find their file by its vector, where keywords find nothing;
the hybrid weights decide between the two lists; a store is searched only with the model that
embedded it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import openai
import pytest
from sqlalchemy import text

from oars.embeddings import LlamaEmbedder
from oars.store import SqlStore
from oars.weights import DEFAULT_EMBEDDING, pull_embedding
from tests.conftest import files_server, sdk

pytestmark = pytest.mark.model

CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
DOCS = ("volcanoes.md", "sourdough.txt", "orbits.json", "chess.html", "calc.js")
PARAPHRASES = {
    "mountains spitting molten rock": "volcanoes.md",
    "homemade loaves leavened naturally": "sourdough.txt",
    "rocket trajectories circling our world": "orbits.json",
    "board game tactics": "chess.html",
    "splitting math formulas into pieces": "calc.js",
}


@pytest.fixture
def embedder() -> LlamaEmbedder:
    """The default embedding model, for one server (which closes it)."""
    return LlamaEmbedder(pull_embedding(), DEFAULT_EMBEDDING.name)


def _words(value: str) -> set[str]:
    return set(re.findall(r"\w+", value.lower()))


def _store(client: openai.OpenAI) -> str:
    ids = [client.files.create(file=CORPUS / name, purpose="assistants").id for name in DOCS]
    vs = client.vector_stores.create(name="corpus")
    batch = client.vector_stores.file_batches.create_and_poll(
        vs.id, file_ids=ids, poll_interval_ms=20
    )
    assert (batch.status, batch.file_counts.completed) == ("completed", len(DOCS))
    return vs.id


def _first(client: openai.OpenAI, vs_id: str, query: str, **more: object) -> list[str]:
    page = client.vector_stores.search(vs_id, query=query, **more)  # type: ignore[arg-type]
    assert all(0 < hit.score <= 1 for hit in page.data)
    return [hit.filename for hit in page.data]


def _vector_column(url: str) -> str:
    async def read() -> str:
        store = SqlStore(url)
        await store.open()
        try:
            async with store.engine.connect() as conn:
                if store.engine.dialect.name != "postgresql":
                    return "blob"
                kind = await conn.execute(
                    text(
                        "SELECT format_type(atttypid, atttypmod) FROM pg_attribute WHERE "
                        "attrelid = 'vector_chunks'::regclass AND attname = 'embedding'"
                    )
                )
                return str(kind.scalar())
        finally:
            await store.close()

    return asyncio.run(read())


def test_paraphrases_find_their_file_by_vectors_where_keywords_find_nothing(
    store_url: str, tmp_path: Path, embedder: LlamaEmbedder
) -> None:
    corpus = set().union(*(_words((CORPUS / name).read_text()) for name in DOCS))
    for query in PARAPHRASES:
        assert not _words(query) & corpus, query  # no word to find it by
    files = tmp_path / "files"
    with files_server(store_url, files) as base, sdk(base) as client:
        keyword_only = _store(client)
        for query in PARAPHRASES:
            assert _first(client, keyword_only, query) == []
    with files_server(store_url, files, embedder=embedder) as base, sdk(base) as client:
        hybrid = _store(client)
        for query, expected in PARAPHRASES.items():
            assert _first(client, hybrid, query)[0] == expected, query
        # a keyword query still finds its file first
        assert _first(client, hybrid, "basaltic lava Mauna Loa")[0] == "volcanoes.md"
        # a store without vectors is searched by keyword, with a model running or not, and
        # stays so: a file added to it now is not embedded
        assert _first(client, keyword_only, "sourdough starter")[0] == "sourdough.txt"
        note = client.files.create(
            file=("note.txt", b"Glaciers carve fjords."), purpose="assistants"
        )
        added = client.vector_stores.files.create_and_poll(
            file_id=note.id, vector_store_id=keyword_only, poll_interval_ms=20
        )
        assert added.status == "completed"
        # a file taken out is out of the vectors too (numpy's copy is read again)
        volcanoes = next(f.id for f in client.files.list() if f.filename == "volcanoes.md")
        client.vector_stores.files.delete(volcanoes, vector_store_id=hybrid)
        assert "volcanoes.md" not in _first(client, hybrid, "mountains spitting molten rock")
    if "postgresql" in store_url:
        assert _vector_column(store_url) == "vector"  # compared by pgvector, in the database
    with files_server(store_url, files) as base, sdk(base) as client:
        assert _first(client, keyword_only, "glaciers fjords") == ["note.txt"]
        with pytest.raises(openai.BadRequestError) as refused:
            client.vector_stores.search(hybrid, query="lava")
        assert refused.value.code == "embedding_model_mismatch"
        assert DEFAULT_EMBEDDING.name in refused.value.message


def test_the_hybrid_weights_choose_between_keywords_and_vectors(
    tmp_path: Path, embedder: LlamaEmbedder
) -> None:
    query = "mountains spitting molten rock bread"  # one keyword, of the bread's file
    url = f"sqlite:///{tmp_path}/oars.db"
    with files_server(url, tmp_path / "files", embedder=embedder) as base, sdk(base) as client:
        vs = _store(client)
        by_words = {"embedding_weight": 0, "text_weight": 1}
        by_meaning = {"embedding_weight": 1, "text_weight": 0}
        words = _first(client, vs, query, ranking_options={"hybrid_search": by_words})
        meaning = _first(client, vs, query, ranking_options={"hybrid_search": by_meaning})
        assert words[0] == "sourdough.txt" and meaning[0] == "volcanoes.md"
        with pytest.raises(openai.BadRequestError) as refused:
            _first(client, vs, query, ranking_options={"hybrid_search": dict.fromkeys(by_words, 0)})
        assert refused.value.status_code == 400
