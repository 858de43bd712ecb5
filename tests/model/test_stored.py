"""Stored state on the real model, through the real clients: the openai SDK's stored-state calls,
the Agents SDK chaining with `previous_response_id`, a background run resumed mid-stream."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from openai import NotFoundError, OpenAI

from oars.validator import validate_sse

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


def test_openai_sdk_retrieve_input_items_chain_delete(server: str) -> None:
    client = _client(server)
    first = client.responses.create(model=MODEL, input="Say hi", max_output_tokens=8,
                                    temperature=0)  # fmt: skip
    assert first.model_dump()["store"] is True
    got = client.responses.retrieve(first.id)
    assert got.model_dump() == first.model_dump()
    items = client.responses.input_items.list(first.id)
    assert items.data[0].type == "message" and items.data[0].content[0].text == "Say hi"  # type: ignore[union-attr]
    second = client.responses.create(model=MODEL, input="Once more", previous_response_id=first.id,
                                     max_output_tokens=8, temperature=0)  # fmt: skip
    assert second.previous_response_id == first.id and second.usage is not None
    assert first.usage is not None and second.usage.input_tokens > first.usage.input_tokens
    chained = client.responses.input_items.list(second.id, order="asc")
    assert [i.type for i in chained.data] == ["message", "message", "message"]
    client.responses.delete(first.id)
    with pytest.raises(NotFoundError):
        client.responses.retrieve(first.id)


def test_openai_sdk_background_resume_and_cancel(server: str) -> None:
    client = _client(server)
    run = client.responses.create(model=MODEL, input="Count from 1 to 40, comma separated.",
                                  background=True, max_output_tokens=48, temperature=0)  # fmt: skip
    assert run.status == "queued"
    resumed = list(client.responses.retrieve(run.id, stream=True, starting_after=2))
    assert resumed[0].sequence_number == 3
    assert resumed[-1].type in ("response.completed", "response.incomplete")
    whole = httpx.get(f"{server}/responses/{run.id}", params={"stream": "true"}, timeout=60)
    report = validate_sse(whole.text)
    assert report.ok, report.text()
    assert [e["type"] for e in report.events[:3]] == [
        "response.created", "response.queued", "response.in_progress"]  # fmt: skip
    long = client.responses.create(model=MODEL, input="Write a long story about a lighthouse.",
                                   background=True, max_output_tokens=400)  # fmt: skip
    _until(client, long.id, ("in_progress",))
    time.sleep(0.5)
    cancelled = client.responses.cancel(long.id)
    assert cancelled.status == "cancelled"
    assert client.responses.retrieve(long.id).status == "cancelled"
    replay = validate_sse(httpx.get(f"{server}/responses/{long.id}", params={"stream": "true"},
                                    timeout=60).text)  # fmt: skip
    assert replay.ok and replay.events[-1]["type"] == "response.cancelled", replay.text()


def test_openai_sdk_conversations(server: str) -> None:
    client = _client(server)
    conversation = client.conversations.create(
        items=[{"type": "message", "role": "user", "content": "My name is Ada."}]
    )
    response = client.responses.create(model=MODEL, input="What is my name?",
                                       conversation=conversation.id, max_output_tokens=16,
                                       temperature=0)  # fmt: skip
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
            second = await Runner.run(agent, "What is my favourite colour?",
                                      previous_response_id=first.last_response_id)  # fmt: skip
            return first, second
        finally:
            await client.close()

    first, second = asyncio.run(run())
    assert first.last_response_id and second.last_response_id != first.last_response_id
    stored = httpx.get(f"{agent_server}/responses/{second.last_response_id}", timeout=30).json()
    assert stored["previous_response_id"] == first.last_response_id
    assert isinstance(second.final_output, str) and second.final_output.strip()
