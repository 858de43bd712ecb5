"""Stored state over HTTP, on the scripted engine and a real database (SQLite file, PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx

from oars.families import THINK_TAGS, Hermes
from oars.http import create_app
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.validator import same_response, validate_events, validate_sse

THINKER = Hermes(THINK_TAGS, guards=True)
Client = httpx.AsyncClient


@asynccontextmanager
async def _client(
    url: str | None, engine: ScriptedEngine, store: SqlStore | None = None, **kw: Any
) -> AsyncIterator[Client]:
    service = ResponsesService(engine, sealer=Sealer(b"0" * 43 + b"="))
    app = create_app(service, store or (SqlStore(url) if url else None), **kw)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
            yield client


def run(
    url: str | None,
    test: Callable[[Client], Awaitable[None]],
    engine: ScriptedEngine | None = None,
    store: SqlStore | None = None,
) -> None:
    async def go() -> None:
        async with _client(url, engine or ScriptedEngine(), store) as client:
            await test(client)

    asyncio.run(go())


async def _until(client: Client, response_id: str, statuses: tuple[str, ...]) -> dict[str, Any]:
    for _ in range(200):
        body: dict[str, Any] = (await client.get(f"/responses/{response_id}")).json()
        if body["status"] in statuses:
            return body
        await asyncio.sleep(0.02)
    raise AssertionError(f"{response_id} never reached {statuses}: {body['status']}")


def test_a_response_is_kept_by_default_and_read_back_unchanged(store_url: str) -> None:
    async def test(client: Client) -> None:
        made = (await client.post("/responses", json={"model": "m", "input": "hi"})).json()
        assert made["store"] is True and made["status"] == "completed"
        got = await client.get(f"/responses/{made['id']}")
        assert got.status_code == 200 and got.json() == made

    run(store_url, test)


def test_a_streamed_response_is_kept_as_streamed(store_url: str) -> None:
    async def test(client: Client) -> None:
        r = await client.post("/responses", json={"model": "m", "input": "hi", "stream": True})
        report = validate_sse(r.text)
        assert report.ok and report.final is not None
        got = (await client.get(f"/responses/{report.final['id']}")).json()
        assert got == report.final
        replay = await client.get(f"/responses/{got['id']}", params={"stream": "true"})
        assert replay.text == r.text  # the whole log, byte for byte

    run(store_url, test)


def test_store_false_keeps_nothing(store_url: str) -> None:
    async def test(client: Client) -> None:
        made = (await client.post("/responses", json={"input": "hi", "store": False})).json()
        assert made["store"] is False
        got = await client.get(f"/responses/{made['id']}")
        assert got.status_code == 404 and got.json()["error"]["param"] == "response_id"

    run(store_url, test)


def test_previous_response_id_continues_from_input_then_output(store_url: str) -> None:
    engine = ScriptedEngine(["Hello", " world", "!"])

    async def test(client: Client) -> None:
        first = (
            await client.post("/responses", json={"input": "one", "instructions": "Be brief"})
        ).json()
        second = await client.post(
            "/responses", json={"input": "two", "previous_response_id": first["id"]}
        )
        assert second.status_code == 200 and second.json()["previous_response_id"] == first["id"]
        messages = [(m.role, m.content) for m in engine.requests[-1].messages]
        # instructions are not carried over
        assert messages == [("user", "one"), ("assistant", "Hello world!"), ("user", "two")]
        third = await client.post(
            "/responses", json={"input": "three", "previous_response_id": second.json()["id"]}
        )
        assert [m.content for m in engine.requests[-1].messages] == [
            "one",
            "Hello world!",
            "two",
            "Hello world!",
            "three",
        ]
        items = (
            await client.get(
                f"/responses/{third.json()['id']}/input_items", params={"order": "asc"}
            )
        ).json()
        assert [i["type"] for i in items["data"]] == ["message"] * 5

    run(store_url, test, engine)


def test_unknown_previous_response_is_404(store_url: str) -> None:
    async def test(client: Client) -> None:
        r = await client.post("/responses", json={"input": "x", "previous_response_id": "resp_x"})
        err = r.json()["error"]
        assert r.status_code == 404
        assert (err["param"], err["code"]) == (
            "previous_response_id",
            "previous_response_not_found",
        )
        both = await client.post(
            "/responses", json={"input": "x", "previous_response_id": "r", "conversation": "conv_1"}
        )
        assert both.status_code == 400

    run(store_url, test)


def test_input_items_pages(store_url: str) -> None:
    async def test(client: Client) -> None:
        turns = [{"role": "user", "content": f"m{i}"} for i in range(5)]
        made = (await client.post("/responses", json={"input": turns})).json()
        path = f"/responses/{made['id']}/input_items"
        page = (await client.get(path, params={"limit": 2})).json()
        assert page["object"] == "list" and page["has_more"] is True
        texts = [i["content"][0]["text"] for i in page["data"]]
        assert texts == ["m4", "m3"]  # desc by default
        assert (
            page["first_id"] == page["data"][0]["id"] and page["last_id"] == page["data"][1]["id"]
        )
        rest = (await client.get(path, params={"after": page["last_id"], "limit": 20})).json()
        assert [i["content"][0]["text"] for i in rest["data"]] == ["m2", "m1", "m0"]
        assert rest["has_more"] is False
        asc = (await client.get(path, params={"order": "asc"})).json()
        assert asc["data"][0]["content"][0] == {"type": "input_text", "text": "m0"}
        for bad in ({"limit": 0}, {"limit": 101}, {"order": "up"}):
            r = await client.get(path, params=bad)
            assert r.status_code == 400 and r.json()["error"]["param"] in bad
        assert (await client.get("/responses/resp_nope/input_items")).status_code == 404

    run(store_url, test)


def test_item_reference_resolves_from_the_store(store_url: str) -> None:
    engine = ScriptedEngine(["Hi"])

    async def test(client: Client) -> None:
        made = (await client.post("/responses", json={"input": "first"})).json()
        ref = {"type": "item_reference", "id": made["output"][0]["id"]}
        r = await client.post(
            "/responses", json={"input": [ref, {"role": "user", "content": "again"}]}
        )
        assert r.status_code == 200
        assert [(m.role, m.content) for m in engine.requests[-1].messages] == [
            ("assistant", "Hi"),
            ("user", "again"),
        ]
        missing = await client.post(
            "/responses",
            json={
                "input": [
                    {"role": "user", "content": "x"},
                    {"type": "item_reference", "id": "msg_nope"},
                ]
            },
        )
        assert missing.status_code == 404 and missing.json()["error"]["param"] == "input[1].id"

    run(store_url, test, engine)


def test_background_answers_queued_then_runs_and_resumes(store_url: str) -> None:
    engine = ScriptedEngine(["a", "b", "c", "d"], delay=0.02)

    async def test(client: Client) -> None:
        made = (await client.post("/responses", json={"input": "x", "background": True})).json()
        assert made["status"] == "queued" and made["background"] is True
        done = await _until(client, made["id"], ("completed",))
        assert done["output"][0]["content"][0]["text"] == "abcd"
        whole = await client.get(f"/responses/{made['id']}", params={"stream": "true"})
        events = validate_sse(whole.text)
        assert events.ok, events.text()
        types = [e["type"] for e in events.events]
        assert types[:3] == ["response.created", "response.queued", "response.in_progress"]
        tail = await client.get(
            f"/responses/{made['id']}", params={"stream": "true", "starting_after": 5}
        )
        numbers = [e["sequence_number"] for e in validate_sse(tail.text).events]
        assert numbers == list(range(6, len(events.events)))

    run(store_url, test, engine)


def test_background_requires_store() -> None:
    async def test(client: Client) -> None:
        r = await client.post("/responses", json={"input": "x", "background": True, "store": False})
        assert r.status_code == 400 and r.json()["error"]["param"] == "background"

    run(None, test)


def test_cancel_a_background_response(store_url: str) -> None:
    engine = ScriptedEngine(["tick "] * 400, delay=0.01)

    async def test(client: Client) -> None:
        made = (await client.post("/responses", json={"input": "x", "background": True})).json()
        response_id = made["id"]
        await _until(client, response_id, ("in_progress",))
        await asyncio.sleep(0.1)
        cancelled = (await client.post(f"/responses/{response_id}/cancel")).json()
        assert cancelled["status"] == "cancelled"
        assert cancelled["output"][0]["status"] == "incomplete"
        assert (await client.get(f"/responses/{response_id}")).json() == cancelled
        again = (await client.post(f"/responses/{response_id}/cancel")).json()
        assert again == cancelled  # cancelling a finished response returns it unchanged
        replay = await client.get(f"/responses/{response_id}", params={"stream": "true"})
        report = validate_sse(replay.text)
        assert report.ok, report.text()
        assert report.events[-1]["type"] == "response.cancelled"
        plain = (await client.post("/responses", json={"input": "x"})).json()
        r = await client.post(f"/responses/{plain['id']}/cancel")
        assert r.status_code == 400

    run(store_url, test, engine)


def test_delete(store_url: str) -> None:
    async def test(client: Client) -> None:
        made = (await client.post("/responses", json={"input": "x"})).json()
        r = await client.delete(f"/responses/{made['id']}")
        assert r.json() == {"id": made["id"], "object": "response", "deleted": True}
        assert (await client.get(f"/responses/{made['id']}")).status_code == 404
        assert (await client.delete(f"/responses/{made['id']}")).status_code == 404

    run(store_url, test)


def test_conversations(store_url: str) -> None:
    engine = ScriptedEngine(["Sure."])

    async def test(client: Client) -> None:
        conv = (
            await client.post(
                "/conversations",
                json={"metadata": {"topic": "t"}, "items": [{"role": "user", "content": "hello"}]},
            )
        ).json()
        assert conv["object"] == "conversation" and conv["metadata"] == {"topic": "t"}
        r = await client.post("/responses", json={"input": "more", "conversation": conv["id"]})
        assert r.json()["conversation"] == {"id": conv["id"]}
        assert [m.content for m in engine.requests[-1].messages] == ["hello", "more"]
        items = (
            await client.get(f"/conversations/{conv['id']}/items", params={"order": "asc"})
        ).json()
        texts = [i["content"][0]["text"] for i in items["data"]]
        assert texts == ["hello", "more", "Sure."]
        await client.post("/responses", json={"input": "next", "conversation": {"id": conv["id"]}})
        assert [m.content for m in engine.requests[-1].messages] == [
            "hello",
            "more",
            "Sure.",
            "next",
        ]
        added = (
            await client.post(
                f"/conversations/{conv['id']}/items",
                json={"items": [{"role": "user", "content": "added"}]},
            )
        ).json()
        item_id = added["data"][0]["id"]
        got = (await client.get(f"/conversations/{conv['id']}/items/{item_id}")).json()
        assert got["content"][0]["text"] == "added"
        assert (await client.delete(f"/conversations/{conv['id']}/items/{item_id}")).json()[
            "id"
        ] == conv["id"]
        updated = (
            await client.post(f"/conversations/{conv['id']}", json={"metadata": {"a": "b"}})
        ).json()
        assert updated["metadata"] == {"a": "b"}
        gone = (await client.delete(f"/conversations/{conv['id']}")).json()
        assert gone == {"id": conv["id"], "object": "conversation.deleted", "deleted": True}
        r = await client.post("/responses", json={"input": "x", "conversation": conv["id"]})
        assert r.status_code == 404 and r.json()["error"]["param"] == "conversation"

    run(store_url, test, engine)


def test_encrypted_reasoning_round_trip_and_tamper() -> None:
    engine = ScriptedEngine(["<think>", "secret plan", "</think>", "Done."], family=THINKER)

    async def test(client: Client) -> None:
        made = (
            await client.post(
                "/responses",
                json={"input": "go", "store": False, "include": ["reasoning.encrypted_content"]},
            )
        ).json()
        reasoning = made["output"][0]
        assert reasoning["type"] == "reasoning" and reasoning["encrypted_content"]
        assert "secret" not in reasoning["encrypted_content"]
        replay = {
            "type": "reasoning",
            "id": reasoning["id"],
            "summary": [],
            "encrypted_content": reasoning["encrypted_content"],
        }
        answer = {"role": "assistant", "content": "Done."}
        r = await client.post(
            "/responses",
            json={
                "input": [
                    {"role": "user", "content": "go"},
                    replay,
                    answer,
                    {"role": "user", "content": "more"},
                ]
            },
        )
        assert r.status_code == 200
        assert engine.requests[-1].messages[1].reasoning == "secret plan"
        sealed = reasoning["encrypted_content"]
        tampered = {
            **replay,
            "encrypted_content": sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:],
        }
        bad = await client.post(
            "/responses", json={"input": [tampered, {"role": "user", "content": "x"}]}
        )
        assert (
            bad.status_code == 400 and bad.json()["error"]["param"] == "input[0].encrypted_content"
        )
        plain = (await client.post("/responses", json={"input": "go", "store": False})).json()
        assert plain["output"][0]["encrypted_content"] is None

    run(None, test, engine)


def test_retrieve_with_include_encrypted_reasoning(tmp_path: Path) -> None:
    engine = ScriptedEngine(["<think>", "plan", "</think>", "Done."], family=THINKER)

    async def test(client: Client) -> None:
        made = (await client.post("/responses", json={"input": "go"})).json()
        assert made["output"][0]["encrypted_content"] is None
        got = (
            await client.get(
                f"/responses/{made['id']}", params={"include[]": "reasoning.encrypted_content"}
            )
        ).json()
        sealed = got["output"][0]["encrypted_content"]
        assert Sealer(b"0" * 43 + b"=").unseal(sealed) == "plan"
        bad = await client.get(f"/responses/{made['id']}", params={"include[]": "nope"})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "include[0]"

    run(f"sqlite:///{tmp_path}/oars.db", test, engine)


def test_sealed_reasoning_added_to_a_conversation_is_opened_before_it_is_kept(
    tmp_path: Path,
) -> None:
    """Items added to a conversation are opened with the key every later turn opens them
    with: a tampered one is a 400 now, not on every turn of the conversation after it."""
    engine = ScriptedEngine(["<think>", "plan", "</think>", "Done."], family=THINKER)

    async def test(client: Client) -> None:
        body = {"input": "go", "store": False, "include": ["reasoning.encrypted_content"]}
        reasoning = (await client.post("/responses", json=body)).json()["output"][0]
        sealed = reasoning["encrypted_content"]
        replay = {
            "type": "reasoning",
            "id": reasoning["id"],
            "summary": [],
            "encrypted_content": sealed,
        }
        tampered = {
            **replay,
            "encrypted_content": sealed[:-6] + ("A" if sealed[-6] != "A" else "B") + sealed[-5:],
        }
        conversation = (await client.post("/conversations", json={})).json()
        items = f"/conversations/{conversation['id']}/items"
        added = await client.post(items, json={"items": [tampered]})
        assert added.status_code == 400, added.text
        assert added.json()["error"]["param"] == "items[0].encrypted_content"
        created = await client.post("/conversations", json={"items": [tampered]})
        assert created.status_code == 400, created.text
        assert (await client.post(items, json={"items": [replay]})).status_code == 200
        turn = await client.post(
            "/responses", json={"conversation": conversation["id"], "input": "more"}
        )
        assert turn.status_code == 200, turn.text

    run(f"sqlite:///{tmp_path}/oars.db", test, engine)


def test_input_tokens(store_url: str) -> None:
    async def test(client: Client) -> None:
        r = await client.post("/responses/input_tokens", json={"model": "m", "input": "a b c"})
        assert r.json()["object"] == "response.input_tokens" and r.json()["input_tokens"] > 0

    run(store_url, test)


def test_twenty_concurrent_stored_requests_leave_twenty_records(store_url: str) -> None:
    engine = ScriptedEngine(["x", "y"], delay=0.01)

    async def test(client: Client) -> None:
        async def one(i: int) -> dict[str, Any]:
            body = {"input": f"n{i}", "stream": i % 2 == 0}
            r = await client.post("/responses", json=body)
            final = validate_sse(r.text).final if body["stream"] else r.json()
            assert final is not None
            return final  # type: ignore[no-any-return]

        made = await asyncio.gather(*(one(i) for i in range(20)))
        assert len({m["id"] for m in made}) == 20
        for m in made:
            got = (await client.get(f"/responses/{m['id']}")).json()
            assert same_response(got, m) and got["status"] == "completed"
            items = (await client.get(f"/responses/{m['id']}/input_items")).json()
            assert len(items["data"]) == 1

    run(store_url, test, engine)


def test_a_store_that_is_down_is_a_503_not_a_500() -> None:
    from tests.conftest import free_port

    async def test(client: Client) -> None:
        r = await client.post("/responses", json={"input": "x"})
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_unavailable"
        assert (await client.get("/responses/resp_x")).status_code == 503
        ok = await client.post("/responses", json={"input": "x", "store": False})
        assert ok.status_code == 200

    async def go() -> None:
        url = f"postgresql://nobody@127.0.0.1:{free_port()}/none"
        service = ResponsesService(ScriptedEngine())
        app = create_app(service, SqlStore(url))
        transport = httpx.ASGITransport(app=app)  # no lifespan: the store never opened
        async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
            await test(client)

    asyncio.run(go())


def test_every_event_log_passes_the_validator(store_url: str) -> None:
    engine = ScriptedEngine(["Hel", "lo"])

    async def test(client: Client) -> None:
        made = (await client.post("/responses", json={"input": "x", "stream": True})).text
        final = validate_sse(made).final
        assert final is not None
        replay = await client.get(f"/responses/{final['id']}", params={"stream": "true"})
        assert validate_events(validate_sse(replay.text).events).ok

    run(store_url, test, engine)


def test_a_response_deleted_while_it_runs_leaves_nothing_behind(store_url: str) -> None:
    """Another replica deleted it: the owner's final write must not bring items back."""
    from oars.store import Finished, NewResponse, StoredResponse, Writes

    async def go() -> None:
        store = SqlStore(store_url)
        await store.open()
        try:
            snapshot = {"id": "resp_1", "created_at": 1, "status": "in_progress", "output": []}
            item = {"id": "msg_1", "type": "message", "role": "user", "content": []}
            await store.write(Writes(begun=[NewResponse(StoredResponse(snapshot), [item])]))
            assert await store.delete("resp_1")
            done = {**snapshot, "status": "completed", "output": [{**item, "id": "msg_2"}]}
            ending = [{"type": "x", "sequence_number": 0}]
            await store.write(Writes(finished=[Finished("resp_1", done, ending)]))
            assert await store.get("resp_1") is None
            assert await store.find_items(["msg_1", "msg_2"]) == {}
            assert await store.events("resp_1", after=-1) == []
        finally:
            await store.close()

    asyncio.run(go())


class _SlowFinish(SqlStore):
    """A real store whose final write of a response lands late (a busy database)."""

    async def write(self, writes: Any) -> None:
        if writes.finished:
            await asyncio.sleep(0.3)
        await super().write(writes)


class _FailingFinish(SqlStore):
    """A real store that goes away just as a response ends."""

    async def write(self, writes: Any) -> None:
        from oars.errors import StoreUnavailable

        if writes.finished:
            raise StoreUnavailable("The response store is unavailable: gone")
        await super().write(writes)


def test_completed_is_said_only_once_it_is_kept(store_url: str) -> None:
    """A client told `completed` chains from it at once: the answer must be in the store."""
    engine = ScriptedEngine(["Paris"])

    async def test(client: Client) -> None:
        made = (
            await client.post("/responses", json={"input": "capital?", "background": True})
        ).json()
        await _until(client, made["id"], ("completed",))
        await client.post(
            "/responses", json={"input": "and Spain?", "previous_response_id": made["id"]}
        )
        assert [m.content for m in engine.requests[-1].messages] == [
            "capital?",
            "Paris",
            "and Spain?",
        ]

    run(None, test, engine, _SlowFinish(store_url))


def test_a_response_that_could_not_be_kept_is_not_reported_kept(store_url: str) -> None:
    async def test(client: Client) -> None:
        plain = await client.post("/responses", json={"input": "x"})
        assert plain.status_code == 503 and plain.json()["error"]["code"] == "store_unavailable"
        streamed = await client.post("/responses", json={"input": "x", "stream": True})
        report = validate_sse(streamed.text)
        assert report.ok, report.text()
        assert [e["type"] for e in report.events[-2:]] == ["error", "response.failed"]
        assert report.events[-2]["code"] == "store_unavailable"

    run(None, test, None, _FailingFinish(store_url))


def test_concurrent_turns_of_one_conversation_all_land(store_url: str) -> None:
    engine = ScriptedEngine(["ok"], delay=0.01)

    async def test(client: Client) -> None:
        conv = (await client.post("/conversations", json={})).json()
        turns = [
            client.post("/responses", json={"input": f"t{i}", "conversation": conv["id"]})
            for i in range(6)
        ]
        assert all(r.status_code == 200 for r in await asyncio.gather(*turns))
        items = (
            await client.get(f"/conversations/{conv['id']}/items", params={"limit": 100})
        ).json()
        assert len(items["data"]) == 12

    run(store_url, test, engine)


def test_ids_a_client_sends_are_checked(store_url: str) -> None:
    async def test(client: Client) -> None:
        ok = await client.post(
            "/responses",
            json={"input": [{"type": "message", "id": None, "role": "user", "content": "x"}]},
        )
        assert ok.status_code == 200
        items = (await client.get(f"/responses/{ok.json()['id']}/input_items")).json()
        assert items["data"][0]["id"].startswith("msg_")
        for bad in (5, "", "x" * 201, "a\x00b"):
            r = await client.post(
                "/responses",
                json={"input": [{"type": "message", "id": bad, "role": "user", "content": "x"}]},
            )
            assert r.status_code == 400 and r.json()["error"]["param"] == "input[0].id", bad
        for previous in ("", "resp_\x00", "r" * 300):
            r = await client.post(
                "/responses", json={"input": "x", "previous_response_id": previous}
            )
            assert r.status_code == 404, previous
        assert (await client.get("/responses/resp_%00x")).status_code == 404
        assert (await client.get(f"/conversations/{'c' * 300}")).status_code == 404

    run(store_url, test)


def test_a_lone_surrogate_is_refused_and_nothing_is_kept(store_url: str) -> None:
    async def test(client: Client) -> None:
        conv = (await client.post("/conversations", json={})).json()
        body = b'{"items": [{"role": "user", "content": "a\\ud800b"}]}'
        added = await client.post(
            f"/conversations/{conv['id']}/items",
            content=body,
            headers={"content-type": "application/json"},
        )
        assert added.status_code == 400
        assert added.json()["error"]["param"] == "items[0].content"
        not_an_item = await client.post(f"/conversations/{conv['id']}/items", json={"items": [1]})
        assert not_an_item.status_code == 400
        assert not_an_item.json()["error"]["param"] == "items[0]"
        items = await client.get(f"/conversations/{conv['id']}/items")
        assert items.status_code == 200 and items.json()["data"] == []

    run(store_url, test)
