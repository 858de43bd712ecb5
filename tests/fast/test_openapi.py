"""/openapi.json: valid OpenAPI 3.1, every route in it, and the server's answers match it."""

from __future__ import annotations

import asyncio
import json
import re
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import httpx
import pytest
from jsonschema import Draft202012Validator
from openapi_spec_validator import validate
from starlette.routing import Route

from oars.bert_gguf import convert
from oars.embeddings import Embedder, LlamaEmbedder
from oars.http import create_app
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.validator import parse_sse
from tests.bert_reference import tiny_bert


def _app(tmp_path: Path, embedder: Embedder | None = None) -> Any:
    service = ResponsesService(ScriptedEngine(), sealer=Sealer(b"2" * 43 + b"="))
    store = SqlStore(str(tmp_path / "o.db"))
    return create_app(service, store, files=tmp_path / "files", embedder=embedder)


def _embedder(tmp_path: Path) -> Embedder:
    """A tiny random BERT, so that `/v1/embeddings` answers 200 as well as 400."""
    convert(tiny_bert(), tmp_path / "tiny.gguf", name="tiny-bert")
    return LlamaEmbedder(tmp_path / "tiny.gguf", "tiny-bert", threads=1)


async def _calls(app: Any) -> tuple[dict[str, Any], list[tuple[str, str, httpx.Response]]]:
    """Every route called once or more: (method, route path, answer)."""
    answers: list[tuple[str, str, httpx.Response]] = []
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            doc = (await c.get("/openapi.json")).json()

            async def call(
                method: str, route: str, path: str | None = None, **kw: Any
            ) -> httpx.Response:
                r = await c.request(method, path or route, **kw)
                answers.append((method, route, r))
                return r

            created = await call(
                "POST", "/v1/responses", json={"model": "m", "input": "hi", "store": True}
            )
            rid = created.json()["id"]
            one = "/v1/responses/{response_id}"
            await call("POST", "/v1/responses", json={"model": "m", "input": "hi", "stream": True})
            await call("POST", "/v1/responses", json={"model": "m", "input": 5})
            await call("POST", "/v1/responses/input_tokens", json={"model": "m", "input": "hi"})
            await call("POST", "/v1/responses/compact", json={"model": "m", "input": "hi"})
            await call("POST", "/v1/responses/compact", json={"input": "hi"})
            await call("GET", one, f"/v1/responses/{rid}")
            await call("GET", one, "/v1/responses/resp_0123456789abcdef0123")
            await call("GET", f"{one}/input_items", f"/v1/responses/{rid}/input_items")
            await call("POST", f"{one}/cancel", f"/v1/responses/{rid}/cancel")
            await call("DELETE", one, f"/v1/responses/{rid}")
            chat = "/v1/chat/completions"
            hi = [{"role": "user", "content": "hi"}]
            await call("POST", chat, json={"messages": hi})
            await call("POST", chat, json={"messages": hi, "stream": True})
            await call("POST", chat, json={"messages": hi, "n": 3})
            anthropic = {"model": "m", "max_tokens": 8, "messages": hi}
            await call("POST", "/v1/messages", json=anthropic)
            await call("POST", "/v1/messages", json={**anthropic, "stream": True})
            await call("POST", "/v1/messages", json={"model": "m", "messages": hi})
            count = "/v1/messages/count_tokens"
            await call("POST", count, json={"model": "m", "messages": hi})
            await call("POST", count, json={"model": "m", "messages": 5})
            conv = await call(
                "POST", "/v1/conversations", json={"items": [{"role": "user", "content": "hi"}]}
            )
            cid = conv.json()["id"]
            base = "/v1/conversations/{conversation_id}"
            await call("GET", base, f"/v1/conversations/{cid}")
            await call("POST", base, f"/v1/conversations/{cid}", json={"metadata": {"a": "b"}})
            items = await call("GET", f"{base}/items", f"/v1/conversations/{cid}/items")
            await call(
                "POST",
                f"{base}/items",
                f"/v1/conversations/{cid}/items",
                json={"items": [{"role": "user", "content": "more"}]},
            )
            iid = items.json()["data"][0]["id"]
            item = f"{base}/items/{{item_id}}"
            await call("GET", item, f"/v1/conversations/{cid}/items/{iid}")
            await call("DELETE", item, f"/v1/conversations/{cid}/items/{iid}")
            await call("DELETE", base, f"/v1/conversations/{cid}")
            upload = {"file": ("a.txt", b"some text")}
            made = await call("POST", "/v1/files", data={"purpose": "user_data"}, files=upload)
            await call("POST", "/v1/files", data={"purpose": "nope"}, files=upload)
            await call("GET", "/v1/files", params={"limit": 5, "order": "asc"})
            fid, file = made.json()["id"], "/v1/files/{file_id}"
            await call("GET", file, f"/v1/files/{fid}")
            await call("GET", f"{file}/content", f"/v1/files/{fid}/content")
            made = await call("POST", "/v1/files", data={"purpose": "assistants"}, files=upload)
            vfid = made.json()["id"]
            await vector_store_calls(call, vfid)
            await call("DELETE", file, f"/v1/files/{fid}")
            await call("GET", file, f"/v1/files/{fid}")
            for route in ("/v1/models", "/health", "/metrics", "/docs", "/", "/oars/responses"):
                await call("GET", route)
            await call("GET", "/v1/models/{model}", "/v1/models/scripted")
            await call("GET", "/v1/models/{model}", "/v1/models/org/unknown")
            await call("GET", "/static/{name}", "/static/playground.js")
            await call("GET", "/static/{name}", "/static/..%2Foars.db")
            await call("POST", "/oars/validate", content=answers[1][2].text)
            embed = {"model": "m", "input": ["the cat", "sat"]}
            await call("POST", "/v1/embeddings", json=embed)
            await call("POST", "/v1/embeddings", json={**embed, "encoding_format": "base64"})
            await call("POST", "/v1/embeddings", json={**embed, "input": [[1, 2]]})
    return doc, answers


async def vector_store_calls(call: Any, fid: str) -> None:
    """Every vector store route, once or more (the file `fid` indexed in the background)."""
    root, one = "/v1/vector_stores", "/v1/vector_stores/{vector_store_id}"
    made = await call("POST", root, json={"name": "n", "file_ids": [fid]})
    await call("POST", root, json={"name": 5})
    vs = made.json()["id"]
    here = f"{root}/{vs}"
    await call("GET", root, params={"limit": 5})
    await call("GET", one, here)
    await call("GET", one, f"{root}/vs_unknown")
    await call("POST", one, here, json={"metadata": {"a": "b"}})
    for _ in range(200):  # until its file is indexed
        if (await call("GET", one, here)).json()["status"] == "completed":
            break
        await asyncio.sleep(0.02)
    await call("POST", f"{one}/search", f"{here}/search", json={"query": "some text"})
    await call("POST", f"{one}/search", f"{here}/search", json={"query": 5})
    files, file = f"{one}/files", f"{one}/files/{{file_id}}"
    await call("POST", files, f"{here}/files", json={"file_id": fid, "attributes": {"k": 1}})
    await call("GET", files, f"{here}/files", params={"filter": "completed"})
    await call("GET", file, f"{here}/files/{fid}")
    await call("POST", file, f"{here}/files/{fid}", json={"attributes": {"k": "v"}})
    await call("GET", f"{file}/content", f"{here}/files/{fid}/content")
    batches, batch = f"{one}/file_batches", f"{one}/file_batches/{{batch_id}}"
    made = await call("POST", batches, f"{here}/file_batches", json={"file_ids": [fid]})
    bid = made.json()["id"]
    await call("GET", batch, f"{here}/file_batches/{bid}")
    await call("GET", f"{batch}/files", f"{here}/file_batches/{bid}/files")
    await call("POST", f"{batch}/cancel", f"{here}/file_batches/{bid}/cancel")
    await call("DELETE", file, f"{here}/files/{fid}")
    await call("DELETE", one, here)


def _schema(doc: dict[str, Any], schema: dict[str, Any]) -> Draft202012Validator:
    return Draft202012Validator({**schema, "components": doc["components"]})


def test_the_document_is_openapi_3_1_and_has_every_route(tmp_path: Path) -> None:
    app = _app(tmp_path)
    doc, _ = asyncio.run(_calls(app))
    validate(doc)
    assert doc["openapi"] == "3.1.0"
    served = {
        (m, re.sub(r"\{(\w+):\w+\}", r"{\1}", r.path))  # `{model:path}` is `{model}`
        for r in app.routes
        if isinstance(r, Route)
        for m in (r.methods or set()) - {"HEAD"}
    }
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert served == documented
    assert len(served) == 50


def test_every_answer_matches_the_document(tmp_path: Path) -> None:
    app = _app(tmp_path, _embedder(tmp_path))
    doc, answers = asyncio.run(_calls(app))
    called = set()
    for method, route, r in answers:
        called.add((method, route))
        op = doc["paths"][route][method.lower()]
        key = "200" if r.status_code == 200 else f"{str(r.status_code)[0]}XX"
        assert key in op["responses"], (method, route, r.status_code)
        content = op["responses"][key].get("content", {})
        media = r.headers["content-type"].split(";")[0]
        if media == "text/event-stream":
            data_schema = content[media]["schema"]["properties"]["data"]
            done = data_schema.get("if", {}).get("const")  # chat's last line, `[DONE]`
            validator = _schema(doc, data_schema.get("else", data_schema)["contentSchema"])
            for _, data in parse_sse(r.text):
                if data != done:
                    validator.validate(json.loads(data))
        elif media == "application/json":
            _schema(doc, content["application/json"]["schema"]).validate(r.json())
        else:
            assert any(fnmatch(media, m.split(";")[0]) for m in content), (route, media)
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops}
    assert called == documented - {("GET", "/openapi.json")}
    statuses = {r.status_code for _, _, r in answers}
    assert {200, 400, 404} <= statuses
    assert {r.status_code for _, route, r in answers if route == "/v1/embeddings"} == {200, 400}


def test_the_docs_page_and_the_playground_need_nothing_from_elsewhere(tmp_path: Path) -> None:
    _, answers = asyncio.run(_calls(_app(tmp_path)))
    pages = {route: r.text for method, route, r in answers if route in ("/docs", "/")}
    assert "/v1/conversations/{conversation_id}/items/{item_id}" in pages["/docs"]
    for html in pages.values():
        for ref in re.findall(r'(?:src|href)="([^"]*)"', html):
            assert ref.startswith(("/", "#")), ref
    for html in pages.values():
        assert "http://" not in html and "https://" not in html


@pytest.mark.parametrize("name", ["playground.html", "playground.js", "playground.css"])
def test_the_playground_files_are_served(tmp_path: Path, name: str) -> None:
    async def go() -> httpx.Response:
        app = _app(tmp_path)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
            return await c.get(f"/static/{name}")

    r = asyncio.run(go())
    assert r.status_code == 200 and len(r.content) > 500
