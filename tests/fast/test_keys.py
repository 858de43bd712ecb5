"""API keys: 401 without a valid one; what a key stores is a 404 for every other key (on a real
SQLite file and a real PostgreSQL); the schema upgrade that added owners keeps old rows."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import text

from oars.cli import main
from oars.http import create_app
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.store import SqlStore
from oars.testing import ScriptedEngine

A, B = "key-a-0123456789", "key-b-9876543210"


def _as(key: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"} if key else {}


async def _calls(url: str | None, body: Any, **kw: Any) -> Any:
    app = create_app(
        ResponsesService(ScriptedEngine(delay=0.001)),
        SqlStore(url) if url else None,
        settings=ServerSettings(api_keys=(A, B), **kw),
    )
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await body(client)


def test_without_a_valid_key_it_is_a_401_but_pages_and_health_are_open() -> None:
    async def body(c: httpx.AsyncClient) -> dict[str, httpx.Response]:
        post = {"model": "m", "input": "x"}
        return {
            "none": await c.post("/v1/responses", json=post),
            "wrong": await c.post("/v1/responses", json=post, headers=_as("nope")),
            "basic": await c.get("/v1/models", headers={"authorization": f"Basic {A}"}),
            "right": await c.post("/v1/responses", json=post, headers=_as(A)),
            "health": await c.get("/health"),
            "metrics": await c.get("/metrics"),
            "page": await c.get("/"),
            "js": await c.get("/static/playground.js"),
            "doc": await c.get("/openapi.json"),
        }

    r = asyncio.run(_calls(None, body))
    for name, code in (
        ("none", "missing_api_key"),
        ("wrong", "invalid_api_key"),
        ("basic", "missing_api_key"),
    ):
        assert r[name].status_code == 401, name
        assert r[name].json()["error"] == {
            **r[name].json()["error"],
            "code": code,
            "type": "invalid_request_error",
            "param": None,
        }
        assert r[name].headers["www-authenticate"] == "Bearer"
        assert r[name].headers["x-request-id"]
    assert r["right"].status_code == 200
    assert all(r[n].status_code == 200 for n in ("health", "metrics", "page", "js", "doc"))


def test_health_and_metrics_can_be_closed_too() -> None:
    async def body(c: httpx.AsyncClient) -> list[int]:
        return [
            (await c.get(p, headers=h)).status_code
            for p in ("/health", "/metrics")
            for h in ({}, _as(B))
        ]

    assert asyncio.run(_calls(None, body, public=())) == [401, 200, 401, 200]


def test_what_a_key_stores_does_not_exist_for_another(store_url: str) -> None:
    async def body(c: httpx.AsyncClient) -> None:
        a, b = _as(A), _as(B)
        made = (await c.post("/v1/responses", json={"model": "m", "input": "hi"}, headers=a)).json()
        rid = made["id"]
        item = made["output"][0]["id"]
        conv = (
            await c.post(
                "/v1/conversations",
                json={"items": [{"role": "user", "content": "hello"}]},
                headers=a,
            )
        ).json()
        cid = conv["id"]
        bg = (
            await c.post(
                "/v1/responses",
                headers=a,
                json={"model": "m", "input": "x", "background": True, "stream": False},
            )
        ).json()

        others = [
            ("GET", f"/v1/responses/{rid}", None),
            ("GET", f"/v1/responses/{rid}?stream=true", None),
            ("GET", f"/v1/responses/{rid}/input_items", None),
            ("DELETE", f"/v1/responses/{rid}", None),
            ("POST", f"/v1/responses/{bg['id']}/cancel", None),
            ("POST", "/v1/responses", {"model": "m", "input": "x", "previous_response_id": rid}),
            (
                "POST",
                "/v1/responses",
                {"model": "m", "input": [{"type": "item_reference", "id": item}]},
            ),
            ("POST", "/v1/responses", {"model": "m", "input": "x", "conversation": cid}),
            (
                "POST",
                "/v1/responses/input_tokens",
                {"model": "m", "input": "x", "previous_response_id": rid},
            ),
            ("GET", f"/v1/conversations/{cid}", None),
            ("POST", f"/v1/conversations/{cid}", {"metadata": {"k": "v"}}),
            ("GET", f"/v1/conversations/{cid}/items", None),
            (
                "POST",
                f"/v1/conversations/{cid}/items",
                {"items": [{"role": "user", "content": "sneaky"}]},
            ),
            ("DELETE", f"/v1/conversations/{cid}", None),
        ]
        for method, path, json_body in others:
            r = await c.request(method, path, json=json_body, headers=b)
            assert r.status_code == 404, (method, path, r.text)
            assert "not found" in r.json()["error"]["message"]
        assert (await c.get("/oars/responses", headers=b)).json()["data"] == []

        # everything is still there, whole, for its own key
        assert (await c.get(f"/v1/responses/{rid}", headers=a)).json() == made
        items = (await c.get(f"/v1/conversations/{cid}/items", headers=a)).json()["data"]
        assert [i["content"][0]["text"] for i in items] == ["hello"]
        chained = await c.post(
            "/v1/responses",
            headers=a,
            json={"model": "m", "input": "more", "previous_response_id": rid, "conversation": None},
        )
        assert chained.status_code == 200, chained.text
        listed = [r["id"] for r in (await c.get("/oars/responses", headers=a)).json()["data"]]
        assert rid in listed and bg["id"] in listed
        assert (await c.delete(f"/v1/responses/{rid}", headers=a)).status_code == 200

    asyncio.run(_calls(store_url, body))


def test_rows_from_before_keys_belong_to_no_key(tmp_path: Path) -> None:
    """A database of schema version 1 (no owners) upgrades in place; its responses stay
    readable by a server without keys, and are no key's."""
    url = f"sqlite:///{tmp_path}/old.db"

    async def make_v1() -> str:
        store = SqlStore(url)
        await store.open()
        async with store.engine.begin() as conn:
            await conn.execute(text("ALTER TABLE responses DROP COLUMN tenant"))
            await conn.execute(text("ALTER TABLE conversations DROP COLUMN tenant"))
            await conn.execute(text("UPDATE oars_schema SET version = 1"))
            await conn.execute(
                text(
                    "INSERT INTO responses (id, status, background, streamed, owner, lease_until, "
                    "cancel_requested, created_at, snapshot) VALUES ('resp_old', 'completed', 0, 0, "
                    '\'r\', 0, 0, 1, \'{"id": "resp_old", "status": "completed"}\')'
                )
            )
        await store.close()
        return "ok"

    asyncio.run(make_v1())

    async def read(c: httpx.AsyncClient) -> list[int]:
        return [(await c.get("/v1/responses/resp_old", headers=_as(k))).status_code for k in (A, B)]

    assert asyncio.run(_calls(url, read)) == [404, 404]

    async def read_open() -> int:
        app = create_app(ResponsesService(ScriptedEngine()), SqlStore(url))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                return (await c.get("/v1/responses/resp_old")).status_code

    assert asyncio.run(read_open()) == 200


def test_serving_beyond_loopback_needs_keys(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OARS_API_KEYS", raising=False)
    argv = ["serve", "--host", "0.0.0.0", "--upstream", "m=http://127.0.0.1:9/v1"]
    assert main(argv) == 1
    assert "no API keys" in capsys.readouterr().err
    keys = tmp_path / "keys"
    keys.write_text("# team keys\n\nkey-one  # ops\n")
    assert main([*argv, "--api-keys", str(tmp_path / "missing")]) == 1
    assert "--api-keys" in capsys.readouterr().err
    from oars.cli import _parser
    from oars.serve import api_keys
    from oars.settings import from_args

    args = _parser().parse_args([*argv, "--api-keys", str(keys), "--api-key", "k2"])
    monkeypatch.setenv("OARS_API_KEYS", "k3, k4")
    assert api_keys(from_args(args, os.environ).server) == ["k2", "k3", "k4", "key-one"]
