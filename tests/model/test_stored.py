"""Stored state on the real model, through the real clients: the openai SDK's stored-state calls,
the Agents SDK chaining with `previous_response_id`, a background run resumed mid-stream."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import httpx
import pytest
from openai import NotFoundError, OpenAI

from oars.sealing import Sealer
from oars.validator import same_response, validate_events, validate_sse
from tests.model.conftest import SECRET_KEY

pytestmark = pytest.mark.model

MODEL = "qwen2.5-coder-0.5b-instruct"


def _client(server: str) -> OpenAI:
    return OpenAI(base_url=server, api_key="unused", max_retries=0)


def _until(client: OpenAI, response_id: str, statuses: tuple[str, ...]) -> Any:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        response = client.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        time.sleep(0.05)
    raise AssertionError(f"{response_id} never reached {statuses}")


def test_openai_sdk_retrieve_input_items_chain_delete(
    server: str, closing: contextlib.ExitStack
) -> None:
    client = closing.enter_context(_client(server))
    first = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=8, temperature=0)
    assert first.model_dump()["store"] is True
    got = client.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump()
    items = client.responses.input_items.list(first.id)
    assert items.data[0].type == "message" and items.data[0].content[0].text == "Say hi"  # type: ignore[union-attr]
    second = client.responses.create(
        model=MODEL,
        input="Once more",
        previous_response_id=first.id,
        max_output_tokens=8,
        temperature=0,
    )
    assert second.previous_response_id == first.id and second.usage is not None
    assert first.usage is not None and second.usage.input_tokens > first.usage.input_tokens
    chained = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in chained.data] == ["message", "message", "message"]
    client.responses.delete(first.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(first.id)


def test_openai_sdk_background_resume_and_cancel(
    server: str, closing: contextlib.ExitStack
) -> None:
    client = closing.enter_context(_client(server))
    run = client.responses.create(
        model=MODEL,
        input="Count from 1 to 40, comma separated.",
        background=True,
        max_output_tokens=48,
        temperature=0,
    )
    assert run.status == "queued"
    resumed = list(client.responses.retrieve(run.id, stream=True, starting_after=2))
    assert resumed[0].sequence_number == 3
    assert resumed[-1].type in ("response.completed", "response.incomplete")
    whole = httpx.get(f"{server}/responses/{run.id}", params={"stream": "true"}, timeout=60)
    report = validate_sse(whole.text)
    assert report.ok, report.text()
    assert [e["type"] for e in report.events[:3]] == [
        "response.created",
        "response.queued",
        "response.in_progress",
    ]
    # Greedy counting runs for all 400 tokens (about 10 s): a sampled story could end by itself
    # before the cancel arrives.
    long = client.responses.create(
        model=MODEL,
        input="Count from 1 to 500, comma separated.",
        background=True,
        max_output_tokens=400,
        temperature=0,
    )
    _until(client, long.id, ("in_progress",))
    time.sleep(0.5)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"
    replay = validate_sse(
        httpx.get(f"{server}/responses/{long.id}", params={"stream": "true"}, timeout=60).text
    )
    assert replay.ok and replay.events[-1]["type"] == "response.cancelled", replay.text()


def test_openai_sdk_conversations(server: str, closing: contextlib.ExitStack) -> None:
    client = closing.enter_context(_client(server))
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}]
    )
    response = client.responses.create(
        model=MODEL,
        input="What is my name?",
        conversation=conversation.id,
        max_output_tokens=16,
        temperature=0,
    )
    assert response.conversation is not None and response.conversation.id == conversation.id
    items = client.conversations.items.list(conversation.id, order="asc")
    assert [i.type for i in items.data] == ["message", "message", "message"]
    assert items.data[-1].id == response.output[0].id
    assert client.conversations.retrieve(conversation.id).id == conversation.id
    client.conversations.delete(conversation.id)
    with pytest.raises(NotFoundError):
        client.conversations.retrieve(conversation.id)


def test_openai_agents_chain_with_previous_response_id(agent_server: str) -> None:
    from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    async def run() -> tuple[Any, Any]:
        client = AsyncOpenAI(base_url=agent_server, api_key="unused", max_retries=0)
        model = OpenAIResponsesModel(model=MODEL, openai_client=client)
        agent = Agent(name="Helper", instructions="Answer in one short sentence.", model=model)
        try:
            first = await Runner.run(agent, "My favourite colour is green. Say OK.")
            second = await Runner.run(
                agent, "What is my favourite colour?", previous_response_id=first.last_response_id
            )
            return first, second
        finally:
            await client.close()

    first, second = asyncio.run(run())
    assert first.last_response_id and second.last_response_id != first.last_response_id
    stored = httpx.get(f"{agent_server}/responses/{second.last_response_id}", timeout=30).json()
    assert stored["previous_response_id"] == first.last_response_id
    assert isinstance(second.final_output, str) and second.final_output.strip()


def test_openai_sdk_streams_a_compaction_made_before_the_answer(server: str) -> None:
    """`context_management` over a chain past its threshold: the real model's summary is
    sampled under `response.compaction.compacting`, then it answers from the compaction."""
    client = _client(server)
    first = client.responses.create(
        model=MODEL,
        input="The deploy code word is heron. " + "Keep it in mind. " * 260,
        max_output_tokens=4,
        temperature=0,
    )
    events = list(
        client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input="Say OK.",
            max_output_tokens=4,
            temperature=0,
            context_management=[{"type": "compaction", "compact_threshold": 1000}],
            stream=True,
        )
    )
    report = validate_events([e.model_dump(exclude_unset=True) for e in events])
    assert report.ok, report.text()
    kinds = [e.type for e in events]
    at = kinds.index("response.compaction.compacting")
    assert kinds[at + 1 : at + 3] == ["response.output_item.added", "response.output_item.done"]
    compacting, added = events[at], events[at + 1]
    assert compacting.item_id == added.item.id and compacting.output_index == 0  # type: ignore[union-attr]
    final = events[-1].response  # type: ignore[union-attr]
    assert final.status == "completed"
    assert [item.type for item in final.output] == ["compaction", "message"]


def test_encrypted_reasoning_goes_back_into_the_prompt_and_tampering_is_a_400(server: str) -> None:
    sealed = Sealer(SECRET_KEY.encode()).seal("The user is called Ada.")
    turn: list[dict[str, Any]] = [
        {"role": "user", "content": "Hi"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": sealed},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "Say bye."},
    ]
    body = {
        "model": MODEL,
        "input": turn,
        "max_output_tokens": 8,
        "store": False,
        "include": ["reasoning.encrypted_content"],
    }
    ok = httpx.post(f"{server}/responses", json=body, timeout=120)
    assert ok.status_code == 200 and ok.json()["status"] in ("completed", "incomplete")
    turn[1] = {
        **turn[1],
        "encrypted_content": sealed[:-4] + ("AAAA" if sealed[-4:] != "AAAA" else "BBBB"),
    }
    bad = httpx.post(f"{server}/responses", json=body, timeout=120)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "input[1].encrypted_content"


def test_twenty_concurrent_stored_requests(server: str) -> None:
    async def run() -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=300) as client:

            async def one(i: int) -> dict[str, Any]:
                body = {
                    "model": MODEL,
                    "input": f"Say the number {i}.",
                    "max_output_tokens": 6,
                    "temperature": 0,
                    "stream": i % 2 == 0,
                }
                r = await client.post(f"{server}/responses", json=body)
                if not body["stream"]:
                    return r.json()  # type: ignore[no-any-return]
                report = validate_sse(r.text)
                assert report.ok and report.final is not None, report.text()
                return report.final

            return await asyncio.gather(*(one(i) for i in range(20)))

    made = asyncio.run(run())
    assert len({m["id"] for m in made}) == 20
    for i, m in enumerate(made):
        got = httpx.get(f"{server}/responses/{m['id']}", timeout=30).json()
        assert same_response(got, m) and got["status"] in ("completed", "incomplete")
        items = httpx.get(f"{server}/responses/{m['id']}/input_items", timeout=30).json()
        assert items["data"][0]["content"][0]["text"] == f"Say the number {i}."
