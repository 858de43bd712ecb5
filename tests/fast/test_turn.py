"""The turn renders a request's input once: that render is the items' validation, and a sealed
item (reasoning, a compaction) is opened once per engine request, not once to check it and
again to render it."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest

from oars import prompt
from oars.compaction import Sealed
from oars.generation import ChatMessage
from oars.http import create_app
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine

KEY = b"1" * 43 + b"="


def _post(
    service: ResponsesService, bodies: Sequence[dict[str, Any]], store: SqlStore | None = None
) -> list[httpx.Response]:
    app = create_app(service, store)

    async def go() -> list[httpx.Response]:
        answers = []
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
                for body in bodies:
                    answers.append(await client.post("/responses", json=body))
        return answers

    return asyncio.run(go())


def _count_walks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times the renderer walks a list of items (render and validate both do)."""
    walks = [0]
    walk = prompt._items

    def counted(raw: Sequence[prompt.Json], ctx: prompt.Context) -> list[ChatMessage]:
        walks[0] += 1
        return walk(raw, ctx)

    monkeypatch.setattr(prompt, "_items", counted)
    return walks


def _count_unseals(monkeypatch: pytest.MonkeyPatch, sealer: Sealer) -> Counter[str]:
    """Each sealed token the server opens, and how often."""
    opened: Counter[str] = Counter()
    unseal: Callable[[str], str] = sealer.unseal

    def counted(token: str) -> str:
        opened[token] += 1
        return unseal(token)

    monkeypatch.setattr(sealer, "unseal", counted)
    return opened


@pytest.mark.parametrize("stream", [False, True])
def test_a_request_renders_its_input_once_and_opens_each_sealed_item_once(
    monkeypatch: pytest.MonkeyPatch, stream: bool
) -> None:
    sealer = Sealer(KEY)
    thought = sealer.seal("The user wants the file read first.")
    summary = Sealed("Earlier, the agent listed the files.", frozenset()).seal(sealer.seal)
    body = {
        "model": "m",
        "stream": stream,
        "input": [
            {"type": "compaction", "encrypted_content": summary},
            {"role": "user", "content": "Read calc.py."},
            {"type": "reasoning", "summary": [], "encrypted_content": thought},
            {"role": "assistant", "content": "It subtracts."},
            {"role": "user", "content": "Fix it."},
        ],
    }
    engine = ScriptedEngine(["Done."])
    service = ResponsesService(engine, sealer=sealer)
    walks = _count_walks(monkeypatch)
    opened = _count_unseals(monkeypatch, sealer)
    (r,) = _post(service, [body])
    assert r.status_code == 200, r.text
    assert walks == [1], "the input is rendered once: the render is its validation"
    assert opened == Counter({thought: 1, summary: 1})
    (asked,) = engine.requests
    said = [(m.role, m.content, m.reasoning) for m in asked.messages]
    assert said[0][1].endswith("Earlier, the agent listed the files.")
    assert ("assistant", "It subtracts.", "The user wants the file read first.") in said


def test_a_continuation_renders_once_and_names_a_bad_new_item_as_input(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    service = ResponsesService(ScriptedEngine(["One.", "Two."]))
    store = SqlStore(f"sqlite:///{tmp_path}/oars.db")
    walks = _count_walks(monkeypatch)

    async def go() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        app = create_app(service, store)
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
                first = await client.post("/responses", json={"model": "m", "input": "Hi."})
                previous = first.json()["id"]
                bad_item = {"type": "function_call", "call_id": "c", "name": 3, "arguments": ""}
                bad = await client.post(
                    "/responses",
                    json={
                        "model": "m",
                        "previous_response_id": previous,
                        "input": [{"role": "user", "content": "And?"}, bad_item],
                    },
                )
                walks[0] = 0
                good = await client.post(
                    "/responses",
                    json={
                        "model": "m",
                        "previous_response_id": previous,
                        "input": [{"role": "user", "content": "And?"}],
                    },
                )
                return first, bad, good

    first, bad, good = asyncio.run(go())
    assert first.status_code == 200 and good.status_code == 200, good.text
    assert walks == [1], "history and new input are rendered together, once"
    error = bad.json()["error"]
    assert bad.status_code == 400 and error["param"] == "input[1].name", error


def test_an_input_with_nothing_to_respond_to_is_400_even_without_generating() -> None:
    service = ResponsesService(ScriptedEngine())
    nothing = [{"type": "reasoning", "summary": []}]
    answers = _post(
        service,
        [
            {"model": "m", "input": nothing},
            {"model": "m", "input": nothing, "generate": False},
            {"model": "m", "input": nothing, "generate": False, "instructions": "Be terse."},
        ],
    )
    for r in answers[:2]:
        error = r.json()["error"]
        assert r.status_code == 400 and error["param"] == "input", error
        assert "no message to respond to" in error["message"]
    assert answers[2].status_code == 200, answers[2].text


def test_configuration_updates_set_the_following_responses_settings(tmp_path: Path) -> None:
    """A `configuration_update` item sets reasoning effort and `text.format` from where it
    stands: for its own response and those continuing it, until a later one replaces them."""
    engine = ScriptedEngine(['{"n": 1}'])
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    update = {
        "type": "configuration_update",
        "reasoning": {"effort": "low"},
        "text": {"format": {"type": "json_schema", "name": "n", "schema": schema}},
    }

    async def go() -> None:
        app = create_app(ResponsesService(engine), SqlStore(f"sqlite:///{tmp_path}/oars.db"))
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as c:
                ask = {"role": "user", "content": "A number."}
                first = await c.post("/responses", json={"model": "m", "input": [update, ask]})
                assert first.status_code == 200, first.text
                asked = engine.requests[-1]
                assert asked.reasoning_effort == "low" and asked.output is not None
                assert asked.output.schema == schema
                plain = {"type": "configuration_update", "text": {"format": {"type": "text"}}}
                body = {"model": "m", "previous_response_id": first.json()["id"]}
                await c.post("/responses", json={**body, "input": "Another."})
                assert engine.requests[-1].output is not None  # still in effect
                await c.post("/responses", json={**body, "input": [plain, ask]})
                after = engine.requests[-1]
                assert after.output is None and after.reasoning_effort == "low"
                bad = {"type": "configuration_update", "reasoning": {"effort": "lots"}}
                r = await c.post("/responses", json={"model": "m", "input": [bad, ask]})
                assert r.status_code == 400
                assert r.json()["error"]["param"] == "input[0].reasoning.effort"

    asyncio.run(go())
