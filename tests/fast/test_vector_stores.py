"""`/v1/vector_stores` driven by the openai SDK over a real socket, on a real SQLite file and a
real PostgreSQL: stores, their files and batches, keyword search over a small corpus
(`tests/fixtures/corpus`), filters on attributes, each API key's own, bad inputs as 4xx, files
that cannot be read, a restart during ingestion, and expiry."""

from __future__ import annotations

import asyncio
import codecs
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import func, select, text, update

from oars.chunking import Unsupported, chunks, extract, html_text, word_tokens
from oars.errors import InvalidRequest
from oars.store import NewVectorFile, SqlStore
from oars.store.schema import vector_chunks, vector_stores
from oars.sweeper import Sweeper
from oars.vector_stores import MAX_STORE_FILES, Ranking, fused, matches, ranking, room, score
from tests.conftest import files_server, sdk

A, B = "key-a-0123456789", "key-b-9876543210"
CORPUS = Path(__file__).parents[1] / "fixtures" / "corpus"
DOCS = ("volcanoes.md", "sourdough.txt", "orbits.json", "chess.html", "calc.js")
POLL = 20  # ms between the SDK's polls


_server = files_server


_sdk = sdk


def _upload(client: openai.OpenAI, name: str) -> str:
    return client.files.create(file=CORPUS / name, purpose="assistants").id


def _until_completed(client: openai.OpenAI, vs_id: str) -> Any:
    deadline = time.monotonic() + 20
    while (store := client.vector_stores.retrieve(vs_id)).status == "in_progress":
        assert time.monotonic() < deadline, "the store never completed"
        time.sleep(POLL / 1000)
    return store


def _on_store(url: str, work: Any) -> Any:
    async def run() -> Any:
        store = SqlStore(url)
        await store.open()
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(run())


def _chunk_count(url: str, vs_id: str | None = None) -> int:
    async def count(store: SqlStore) -> int:
        query = select(func.count()).select_from(vector_chunks)
        if vs_id is not None:
            query = query.where(vector_chunks.c.vector_store_id == vs_id)
        async with store.engine.connect() as conn:
            return int((await conn.execute(query)).scalar_one())

    return int(_on_store(url, count))


def test_the_sdk_creates_lists_modifies_and_deletes_stores(store_url: str, tmp_path: Path) -> None:
    with _server(store_url, tmp_path / "files") as base, _sdk(base) as client:
        made = client.vector_stores.create(
            name="notes",
            metadata={"team": "a"},
            expires_after={"anchor": "last_active_at", "days": 7},
        )
        assert made.id.startswith("vs_") and made.object == "vector_store"
        assert (made.name, made.metadata, made.status, made.usage_bytes) == (
            "notes",
            {"team": "a"},
            "completed",
            0,
        )
        assert made.file_counts.total == 0 and made.expires_after is not None
        assert made.expires_at == made.last_active_at + 7 * 86_400  # type: ignore[operator]
        assert client.vector_stores.retrieve(made.id) == made

        more = [client.vector_stores.create(name=f"s{i}").id for i in range(4)]
        ids = [made.id, *more]
        assert [s.id for s in client.vector_stores.list()] == ids[::-1]
        assert [s.id for s in client.vector_stores.list(order="asc", limit=2)] == ids
        page = client.vector_stores.list(order="asc", limit=2, after=ids[0])
        assert [s.id for s in page.data] == ids[1:3] and page.has_more
        before = client.vector_stores.list(order="asc", limit=2, before=ids[3])
        assert [s.id for s in before.data] == ids[1:3]

        changed = client.vector_stores.update(
            made.id, name="renamed", metadata={"team": "b"}, expires_after=None
        )
        assert (changed.name, changed.metadata) == ("renamed", {"team": "b"})
        assert changed.expires_after is None and changed.expires_at is None

        deleted = client.vector_stores.delete(made.id)
        assert (deleted.id, deleted.object, deleted.deleted) == (
            made.id,
            "vector_store.deleted",
            True,
        )
        for use in (client.vector_stores.retrieve, client.vector_stores.delete):
            with pytest.raises(openai.NotFoundError):
                use(made.id)
        # the SDK sends `OpenAI-Beta: assistants=v2`; without it, the same
        assert httpx.get(f"{base}/v1/vector_stores/{more[0]}").json()["id"] == more[0]


def test_files_are_indexed_and_search_finds_the_right_one(store_url: str, tmp_path: Path) -> None:
    with _server(store_url, tmp_path / "files") as base, _sdk(base) as client:
        ids = {name: _upload(client, name) for name in DOCS}
        vs = client.vector_stores.create(name="corpus", file_ids=[ids[DOCS[0]], ids[DOCS[1]]])
        assert vs.file_counts.total == 2
        added = client.vector_stores.files.create_and_poll(
            file_id=ids[DOCS[2]],
            vector_store_id=vs.id,
            attributes={"kind": "json"},
            poll_interval_ms=POLL,
        )
        assert (added.status, added.last_error, added.attributes) == (
            "completed",
            None,
            {"kind": "json"},
        )
        batch = client.vector_stores.file_batches.create_and_poll(
            vs.id, file_ids=[ids[DOCS[3]], ids[DOCS[4]]], poll_interval_ms=POLL
        )
        assert batch.id.startswith("vsfb_") and batch.object == "vector_store.files_batch"
        assert (batch.status, batch.file_counts.completed, batch.file_counts.total) == (
            "completed",
            2,
            2,
        )
        listed = client.vector_stores.file_batches.list_files(batch.id, vector_store_id=vs.id)
        assert sorted(f.id for f in listed) == sorted([ids[DOCS[3]], ids[DOCS[4]]])
        store = _until_completed(client, vs.id)
        assert store.file_counts.completed == 5 and store.usage_bytes > 0

        for query, expected in (
            ("basaltic lava eruption", "volcanoes.md"),
            ("starter dough proof overnight", "sourdough.txt"),
            ("Hohmann transfer orbit", "orbits.json"),
            ("Sicilian Defence castling", "chess.html"),
            ("tokenize arithmetic expression", "calc.js"),
        ):
            found = client.vector_stores.search(vs.id, query=query)
            assert found.data[0].file_id == ids[expected], (query, found.data)
            assert found.data[0].filename == expected
            scores = [r.score for r in found.data]
            assert scores == sorted(scores, reverse=True) and all(0 < s < 1 for s in scores)
        page = client.vector_stores.with_raw_response.search(
            vs.id, query=["lava", "yeast"], max_num_results=1, rewrite_query=True
        ).parse()
        raw = httpx.post(f"{base}/v1/vector_stores/{vs.id}/search", json={"query": "lava"}).json()
        assert (
            raw["search_query"] == ["lava"] and raw["object"] == "vector_store.search_results.page"
        )
        assert len(page.data) == 1
        assert list(client.vector_stores.search(vs.id, query="zeppelin")) == []
        high = client.vector_stores.search(
            vs.id, query="lava", ranking_options={"score_threshold": 0.999}
        )
        assert list(high) == []

        [html] = client.vector_stores.files.content(ids["chess.html"], vector_store_id=vs.id)
        assert html.type == "text" and html.text and "Sicilian" in html.text
        assert "<p>" not in html.text and "castling = 1" not in html.text
        completed = client.vector_stores.files.list(vs.id, filter="completed")
        assert len(list(completed)) == 5
        assert list(client.vector_stores.files.list(vs.id, filter="failed")) == []
        file = client.vector_stores.files.retrieve(ids["orbits.json"], vector_store_id=vs.id)
        assert file.chunking_strategy is not None
        assert file.chunking_strategy.model_dump() == {
            "type": "static",
            "static": {"max_chunk_size_tokens": 800, "chunk_overlap_tokens": 400},
        }
        updated = client.vector_stores.files.update(
            ids["orbits.json"], vector_store_id=vs.id, attributes={"kind": "space"}
        )
        assert updated.attributes == {"kind": "space"}

        gone = client.vector_stores.files.delete(ids["volcanoes.md"], vector_store_id=vs.id)
        assert (gone.deleted, gone.object) == (True, "vector_store.file.deleted")
        assert client.files.retrieve(ids["volcanoes.md"]).id  # the file itself stays
        assert list(client.vector_stores.search(vs.id, query="basaltic lava")) == []
        client.files.delete(ids["sourdough.txt"])  # a file deleted leaves every store
        with pytest.raises(openai.NotFoundError):
            client.vector_stores.files.retrieve(ids["sourdough.txt"], vector_store_id=vs.id)
        assert client.vector_stores.retrieve(vs.id).file_counts.total == 3
        assert list(client.vector_stores.search(vs.id, query="sourdough starter")) == []
        client.vector_stores.delete(vs.id)
    assert _chunk_count(store_url) == 0


def test_filters_keep_files_by_attributes_before_ranking(store_url: str, tmp_path: Path) -> None:
    with _server(store_url, tmp_path / "files") as base, _sdk(base) as client:
        vs = client.vector_stores.create(name="f")
        labels: list[dict[str, str | float | bool]] = [
            {"lang": "en", "year": 2020, "draft": False},
            {"lang": "fr", "year": 2023, "draft": True},
            {"lang": "en", "year": 2024},
        ]
        ids = []
        for i, attributes in enumerate(labels):
            made = client.files.create(
                file=(f"d{i}.txt", b"shared words about rivers"), purpose="assistants"
            )
            client.vector_stores.files.create_and_poll(
                file_id=made.id, vector_store_id=vs.id, attributes=attributes, poll_interval_ms=POLL
            )
            ids.append(made.id)

        def found(filters: Any) -> list[str]:
            hits = client.vector_stores.search(vs.id, query="rivers", filters=filters)
            return sorted(hit.file_id for hit in hits)

        assert found(None) == sorted(ids)
        assert found({"key": "lang", "type": "eq", "value": "en"}) == sorted([ids[0], ids[2]])
        assert found({"key": "year", "type": "gte", "value": 2023}) == sorted(ids[1:])
        assert found({"key": "lang", "type": "in", "value": ["fr", "de"]}) == [ids[1]]
        assert found({"key": "draft", "type": "ne", "value": True}) == sorted([ids[0], ids[2]])
        either = {
            "type": "or",
            "filters": [
                {"key": "year", "type": "lt", "value": 2021},
                {
                    "type": "and",
                    "filters": [
                        {"key": "lang", "type": "eq", "value": "en"},
                        {"key": "year", "type": "gt", "value": 2023},
                    ],
                },
            ],
        }
        assert found(either) == sorted([ids[0], ids[2]])
        assert found({"key": "lang", "type": "eq", "value": "de"}) == []
        [hit] = client.vector_stores.search(
            vs.id, query="rivers", filters={"key": "year", "type": "eq", "value": 2020}
        )
        assert hit.attributes == labels[0]


def test_matches_compares_like_types_only() -> None:
    attributes = {"n": 3, "s": "b", "t": True}
    assert matches({"key": "n", "type": "gt", "value": 2}, attributes)
    assert not matches({"key": "n", "type": "gt", "value": "2"}, attributes)
    assert not matches({"key": "t", "type": "eq", "value": 1}, attributes)
    assert matches({"key": "s", "type": "lt", "value": "c"}, attributes)
    assert matches({"key": "missing", "type": "nin", "value": ["x"]}, attributes)
    assert not matches({"key": "missing", "type": "eq", "value": "x"}, attributes)
    assert [score(r) for r in (0.0, 1.0, 3.0)] == [0.0, 0.5, 0.75]


def test_chunks_overlap_as_the_static_strategy_says() -> None:
    words = " ".join(f"w{i}" for i in range(1000))
    cut = chunks(words, word_tokens, 100, 50)
    assert [c.tokens for c in cut] == [100] * 19
    assert cut[0].text.split()[-50:] == cut[1].text.split()[:50]
    assert " ".join(c.text for c in cut[::2]) + " " == " ".join(words.split()[:1000]) + " "
    assert chunks("", word_tokens, 100, 0) == []
    assert extract("hé".encode("utf-16"), "a.txt") == "hé"
    with pytest.raises(Unsupported):
        extract(codecs.BOM_UTF16_LE + b"\x00\xd8", "lone-surrogate.txt")
    assert html_text("<p>a &amp; b</p><script>x</script><p>c</p>") == "a & b\nc"


def test_another_key_s_stores_are_a_404(store_url: str, tmp_path: Path) -> None:
    with (
        _server(store_url, tmp_path / "files", api_keys=(A, B)) as base,
        _sdk(base, A) as a,
        _sdk(base, B) as b,
    ):
        file_id = a.files.create(file=("a.txt", b"alpha beta"), purpose="assistants").id
        vs = a.vector_stores.create(name="a's", file_ids=[file_id])
        _until_completed(a, vs.id)
        batch = a.vector_stores.file_batches.create(vs.id, file_ids=[file_id])
        vs_calls = (
            b.vector_stores.retrieve,
            b.vector_stores.delete,
            lambda i: b.vector_stores.update(i, name="x"),
            lambda i: b.vector_stores.search(i, query="alpha"),
            lambda i: b.vector_stores.files.list(i),
            lambda i: b.vector_stores.files.retrieve(file_id, vector_store_id=i),
            lambda i: b.vector_stores.files.delete(file_id, vector_store_id=i),
            lambda i: b.vector_stores.files.content(file_id, vector_store_id=i),
            lambda i: b.vector_stores.file_batches.retrieve(batch.id, vector_store_id=i),
            lambda i: b.vector_stores.file_batches.cancel(batch.id, vector_store_id=i),
        )
        for use in vs_calls:
            with pytest.raises(openai.NotFoundError):
                use(vs.id)
        mine = b.vector_stores.create(name="b's")
        with pytest.raises(openai.NotFoundError):  # a's file is no file of b's
            b.vector_stores.files.create(vector_store_id=mine.id, file_id=file_id)
        assert [s.id for s in b.vector_stores.list()] == [mine.id]
        assert a.vector_stores.retrieve(vs.id).file_counts.total == 1


def _is_error(r: httpx.Response, status: int, param: str | None = None) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error


def test_bad_inputs_are_4xx_in_openai_s_shape(tmp_path: Path) -> None:
    with _server(f"sqlite:///{tmp_path}/o.db", tmp_path / "files") as base:
        vs = httpx.post(f"{base}/v1/vector_stores", json={}).json()["id"]
        fid = httpx.post(
            f"{base}/v1/files", data={"purpose": "assistants"}, files={"file": ("a.txt", b"x y")}
        ).json()["id"]
        root, one = f"{base}/v1/vector_stores", f"{base}/v1/vector_stores/{vs}"
        static = {
            "type": "static",
            "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 51},
        }
        cases: list[tuple[str, str, Any, int, str | None]] = [
            ("POST", root, [], 400, None),
            ("POST", root, {"nope": 1}, 400, "nope"),
            ("POST", root, {"name": 5}, 400, "name"),
            ("POST", root, {"metadata": {f"k{i}": "v" for i in range(17)}}, 400, "metadata"),
            ("POST", root, {"expires_after": {"anchor": "created_at", "days": 1}}, 400, None),
            ("POST", root, {"expires_after": {"anchor": "last_active_at", "days": 0}}, 400, None),
            ("POST", root, {"file_ids": "file-x"}, 400, "file_ids"),
            ("POST", root, {"file_ids": ["file-missing"]}, 404, "file_ids[0]"),
            ("POST", root, {"chunking_strategy": {"type": "lines"}}, 400, None),
            ("POST", root, {"chunking_strategy": static}, 400, None),
            ("POST", f"{one}/files", {}, 400, "file_id"),
            ("POST", f"{one}/files", {"file_id": fid, "attributes": {"k": "v" * 513}}, 400, None),
            ("POST", f"{one}/files", {"file_id": fid, "attributes": {"k": [1]}}, 400, None),
            ("POST", f"{one}/files", {"file_id": "file-missing"}, 404, "file_id"),
            ("POST", f"{one}/file_batches", {}, 400, "file_ids"),
            ("POST", f"{one}/file_batches", {"file_ids": [fid], "files": []}, 400, "file_ids"),
            (
                "POST",
                f"{one}/file_batches",
                {"files": [{"attributes": {}}]},
                400,
                "files[0].file_id",
            ),
            ("POST", f"{one}/search", {}, 400, "query"),
            ("POST", f"{one}/search", {"query": ""}, 400, "query"),
            ("POST", f"{one}/search", {"query": "a" * 4097}, 400, "query"),
            (
                "POST",
                f"{one}/search",
                {"query": "a", "max_num_results": 51},
                400,
                "max_num_results",
            ),
            ("POST", f"{one}/search", {"query": "a", "filters": {"type": "xor"}}, 400, "filters"),
            (
                "POST",
                f"{one}/search",
                {"query": "a", "filters": {"key": "k", "type": "in", "value": 1}},
                400,
                "filters.value",
            ),
            (
                "POST",
                f"{one}/search",
                {"query": "a", "ranking_options": {"score_threshold": 2}},
                400,
                None,
            ),
            (
                "POST",
                f"{one}/search",
                {"query": "a", "ranking_options": {"hybrid_search": {"text_weight": -1}}},
                400,
                "ranking_options.hybrid_search.text_weight",
            ),
            (
                "POST",
                f"{one}/search",
                {
                    "query": "a",
                    "ranking_options": {"hybrid_search": {"text_weight": 0, "embedding_weight": 0}},
                },
                400,
                "ranking_options.hybrid_search",
            ),
            (
                "POST",
                f"{one}/search",
                {"query": "a", "ranking_options": {"ranker": "x"}},
                400,
                None,
            ),
            ("GET", f"{root}?limit=101", None, 400, "limit"),
            ("GET", f"{root}?after=vs_unknown", None, 400, "after"),
            ("GET", f"{one}/files?filter=done", None, 400, "filter"),
            ("GET", f"{root}/vs_unknown", None, 404, "vector_store_id"),
            ("GET", f"{one}/files/file-unknown", None, 404, "file_id"),
            ("GET", f"{one}/file_batches/vsfb_unknown", None, 404, "batch_id"),
            ("POST", f"{one}/files/file-unknown", {"attributes": {}}, 404, "file_id"),
        ]
        for method, url, body, status, param in cases:
            r = (
                httpx.request(method, url, json=body)
                if body is not None
                else httpx.request(method, url)
            )
            _is_error(r, status, param)
        bad = httpx.post(
            f"{one}/search", content=b"{", headers={"content-type": "application/json"}
        )
        _is_error(bad, 400)
        infinite = b'{"file_id": "%s", "attributes": {"n": Infinity}}' % fid.encode()
        _is_error(httpx.post(f"{one}/files", content=infinite), 400, "attributes.n")


def _pdf(*lines: str) -> bytes:
    """A real one-page PDF of `lines` in Helvetica, written object by object with its xref."""
    stream = "BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({line}) '" for line in lines) + " ET"
    objects = [
        "<< /Type /Catalog /Pages 2 0 R >>",
        "<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        "<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        "/Resources << /Font << /F1 5 0 R >> >> >>",
        f"<< /Length {len(stream)} >>\nstream\n{stream}\nendstream",
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = b"%PDF-1.4\n", []
    for number, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += f"{number} 0 obj\n{body}\nendobj\n".encode()
    table = "".join(f"{offset:010d} 00000 n \n" for offset in offsets)
    out += (
        f"xref\n0 {len(objects) + 1}\n0000000000 65535 f \n{table}"
        f"trailer\n<< /Size {len(objects) + 1} /Root 1 0 R >>\nstartxref\n{len(out)}\n%%EOF\n"
    ).encode()
    return out


def test_a_pdf_is_indexed_by_its_text(tmp_path: Path) -> None:
    assert extract(_pdf("Glaciers carve fjords.", "Moraines mark their end."), "x.pdf") == (
        "Glaciers carve fjords.\nMoraines mark their end."
    )
    # a NUL a PDF's string holds (which PostgreSQL's text cannot) is left out
    assert extract(_pdf("ice\\000sheet"), "x.pdf") == "icesheet"
    url = f"sqlite:///{tmp_path}/oars.db"
    with _server(url, tmp_path / "files") as base, _sdk(base) as client:
        pdf = _pdf("Glaciers carve fjords.", "Moraines mark where they ended.")
        made = client.files.create(file=("ice.pdf", pdf), purpose="assistants")
        other = client.files.create(file=("b.txt", b"Deserts hold dunes."), purpose="assistants")
        vs = client.vector_stores.create(file_ids=[made.id, other.id])
        assert _until_completed(client, vs.id).file_counts.completed == 2
        hits = client.vector_stores.search(vs.id, query="moraines fjords").data
        assert [h.filename for h in hits] == ["ice.pdf"]
        assert "Moraines mark where they ended." in hits[0].content[0].text
        content = client.vector_stores.files.content(made.id, vector_store_id=vs.id)
        assert "Glaciers carve fjords." in "".join(part.text or "" for part in content)


def test_a_file_that_cannot_be_read_fails_alone(store_url: str, tmp_path: Path) -> None:
    with _server(store_url, tmp_path / "files") as base, _sdk(base) as client:
        binary = client.files.create(file=("blob.bin", bytes(range(256)) * 4), purpose="assistants")
        pdf = client.files.create(file=("a.pdf", b"%PDF-1.7\n..."), purpose="assistants")
        empty = client.files.create(file=("empty.txt", b" \n"), purpose="assistants")
        good = client.files.create(file=("ok.txt", b"plain words"), purpose="assistants")
        vs = client.vector_stores.create(file_ids=[binary.id, pdf.id, empty.id, good.id])
        store = _until_completed(client, vs.id)
        assert (store.file_counts.failed, store.file_counts.completed) == (3, 1)
        for file_id, code in (
            (binary.id, "unsupported_file"),
            (pdf.id, "invalid_file"),  # a PDF, broken
            (empty.id, "invalid_file"),
        ):
            got = client.vector_stores.files.retrieve(file_id, vector_store_id=vs.id)
            assert got.status == "failed" and got.last_error is not None
            assert got.last_error.code == code and got.last_error.message
        failed = client.vector_stores.files.list(vs.id, filter="failed")
        assert len(list(failed)) == 3
        assert [h.file_id for h in client.vector_stores.search(vs.id, query="plain")] == [good.id]


def test_a_restart_during_ingestion_indexes_each_file_once(store_url: str, tmp_path: Path) -> None:
    """Files left `in_progress` by a replica that stopped (here: added straight to the store,
    with the chunks of an attempt that never committed) are taken up at the next start and
    indexed whole, once."""
    folder = tmp_path / "files"
    with _server(store_url, folder) as base, _sdk(base) as client:
        ids = [_upload(client, name) for name in DOCS[:2]]
        vs = client.vector_stores.create(name="r").id
    static = {
        "type": "static",
        "static": {"max_chunk_size_tokens": 100, "chunk_overlap_tokens": 20},
    }

    async def leave_in_progress(store: SqlStore) -> None:
        await store.add_vector_files(vs, [NewVectorFile(i, {}, static) for i in ids], tenant="")
        async with store.engine.begin() as conn:  # what a crash mid-transaction cannot leave
            rows = [
                {
                    "vector_store_id": vs,
                    "file_id": ids[0],
                    "position": 0,
                    "text": "half",
                    "tokens": 1,
                }
            ]
            await conn.execute(vector_chunks.insert(), rows)

    _on_store(store_url, leave_in_progress)
    expected = sum(
        len(chunks(extract((CORPUS / n).read_bytes(), n), word_tokens, 100, 20)) for n in DOCS[:2]
    )
    with _server(store_url, folder) as base, _sdk(base) as client:
        store = _until_completed(client, vs)
        assert store.file_counts.completed == 2
        assert [h.file_id for h in client.vector_stores.search(vs, query="half")] == []
    assert _chunk_count(store_url, vs) == expected


def test_the_sweeper_expires_a_store(store_url: str, tmp_path: Path) -> None:
    folder = tmp_path / "files"
    with _server(store_url, folder) as base, _sdk(base) as client:
        file_id = _upload(client, DOCS[0])
        policy: Any = {"anchor": "last_active_at", "days": 1}
        vs = client.vector_stores.create(file_ids=[file_id], expires_after=policy)
        kept = client.vector_stores.create(file_ids=[file_id])
        _until_completed(client, vs.id)
        _until_completed(client, kept.id)

    async def sweep(store: SqlStore) -> int:
        async with store.engine.begin() as conn:
            await conn.execute(
                update(vector_stores).where(vector_stores.c.id == vs.id).values(expires_at=1)
            )
        from oars.blobs import Blobs

        await Sweeper(store, Blobs(folder)).sweep(time.time())
        return 0

    _on_store(store_url, sweep)
    assert _chunk_count(store_url, vs.id) == 0 and _chunk_count(store_url, kept.id) > 0
    with _server(store_url, folder) as base, _sdk(base) as client:
        assert client.vector_stores.retrieve(vs.id).status == "expired"
        with pytest.raises(openai.BadRequestError) as caught:
            client.vector_stores.search(vs.id, query="lava")
        assert caught.value.code == "vector_store_expired"
        with pytest.raises(openai.BadRequestError):
            client.vector_stores.files.create(vector_store_id=vs.id, file_id=file_id)
        assert client.vector_stores.search(kept.id, query="lava").data


def test_the_sdk_s_upload_helpers_end(tmp_path: Path) -> None:
    with _server(f"sqlite:///{tmp_path}/o.db", tmp_path / "files") as base, _sdk(base) as client:
        vs = client.vector_stores.create(name="helpers")
        one = client.vector_stores.files.upload_and_poll(
            vector_store_id=vs.id, file=CORPUS / DOCS[0], poll_interval_ms=POLL
        )
        assert one.status == "completed"
        batch = client.vector_stores.file_batches.upload_and_poll(
            vs.id, files=[CORPUS / name for name in DOCS[1:3]], poll_interval_ms=POLL
        )
        assert (batch.status, batch.file_counts.completed) == ("completed", 2)
        assert client.vector_stores.retrieve(vs.id).file_counts.completed == 3


def test_a_batch_cancelled_reports_cancelled(tmp_path: Path) -> None:
    with _server(f"sqlite:///{tmp_path}/o.db", tmp_path / "files") as base, _sdk(base) as client:
        vs = client.vector_stores.create()
        file_id = _upload(client, DOCS[1])
        batch = client.vector_stores.file_batches.create(
            vs.id, files=[{"file_id": file_id, "attributes": {"a": 1}}]
        )
        cancelled = client.vector_stores.file_batches.cancel(batch.id, vector_store_id=vs.id)
        assert cancelled.status == "cancelled" and cancelled.file_counts.total == 1
        store = _until_completed(client, vs.id)
        assert store.file_counts.in_progress == 0


def test_a_store_of_the_version_before_vector_stores_gains_them(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/old.db"

    async def make_v5(store: SqlStore) -> None:
        async with store.engine.begin() as conn:
            for statement in (
                "DROP TRIGGER vector_chunks_ai",
                "DROP TRIGGER vector_chunks_ad",
                "DROP TABLE vector_chunks_fts",
                "DROP TABLE vector_chunks",
                "DROP TABLE vector_store_files",
                "DROP TABLE vector_store_file_batches",
                "DROP TABLE vector_stores",
                "UPDATE oars_schema SET version = 5",
            ):
                await conn.execute(text(statement))

    _on_store(url, make_v5)
    with _server(url, tmp_path / "files") as base, _sdk(base) as client:
        file_id = _upload(client, DOCS[0])
        vs = client.vector_stores.create(file_ids=[file_id])
        _until_completed(client, vs.id)
        assert client.vector_stores.search(vs.id, query="magma").data[0].file_id == file_id


def test_fusion_weighs_each_list_by_reciprocal_rank_within_0_and_1() -> None:
    words, meaning = {1: 1, 2: 2}, {2: 1, 3: 2}
    even = fused(words, meaning, Ranking())
    assert even[2] > even[1] > even[3] > 0  # in both lists beats first of one
    assert fused({1: 1}, {1: 1}, Ranking()) == {1: 1.0}
    assert all(0 < v <= 1 for v in even.values())
    by_words = fused(words, meaning, Ranking(embedding_weight=0))
    assert set(by_words) == {1, 2} and by_words[1] > by_words[2]  # the list weighed 0 finds none
    leaning = fused(words, meaning, Ranking(embedding_weight=3))
    assert leaning[3] > leaning[1]  # the vectors' second passes the keywords' first


def test_a_store_takes_at_most_its_limit_of_files() -> None:
    full = {"id": "vs_x", "file_counts": {"total": MAX_STORE_FILES - 2}}
    room(full, 2)
    with pytest.raises(InvalidRequest) as refused:
        room(full, 3)
    assert refused.value.code == "too_many_files"


@pytest.mark.parametrize("weight", [float("nan"), float("inf"), -1.0, "1", True])
def test_a_weight_is_a_finite_number_from_0(weight: object) -> None:
    with pytest.raises(InvalidRequest) as refused:
        ranking({"hybrid_search": {"text_weight": weight}})
    assert refused.value.param == "ranking_options.hybrid_search.text_weight"
    with pytest.raises(InvalidRequest):
        ranking({"score_threshold": float("nan")})
