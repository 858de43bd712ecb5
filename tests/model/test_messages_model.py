"""`/v1/messages` on the real default model, through the anthropic SDK: a forced tool call, whole
and streamed with the SDK's helper, its `input` valid against the tool's schema, then the tool's
result sent back and answered."""

from __future__ import annotations

from typing import Any

import anthropic
import jsonschema
import pytest
from anthropic.types import MessageParam, ToolParam

from tests.model.test_chat_model import SCHEMA

pytestmark = pytest.mark.model

WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "Get the current weather for a city.",
    "input_schema": SCHEMA,
}
QUESTION: list[MessageParam] = [{"role": "user", "content": "What's the weather in Paris?"}]


def _client(server: str) -> anthropic.Anthropic:
    base = server.removesuffix("/").removesuffix("/v1")
    return anthropic.Anthropic(base_url=base, api_key="unused", max_retries=0, timeout=120)


def test_forced_tool_whole_streamed_and_answered(server: str) -> None:
    body: dict[str, Any] = {
        "model": "default",
        "max_tokens": 48,
        "messages": QUESTION,
        "tools": [WEATHER],
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": {"temperature": 0},
    }
    with _client(server) as client:
        done = client.messages.create(**body)
        with client.messages.stream(**body) as stream:
            deltas = [e for e in stream if e.type == "content_block_delta"]
            streamed = stream.get_final_message()
        call = done.content[-1]
        assert call.type == "tool_use" and call.name == "get_weather"
        history: list[MessageParam] = [
            *QUESTION,
            {"role": "assistant", "content": [call]},  # type: ignore[list-item]
            {
                "role": "user",
                "content": [
                    {"type": "tool_result", "tool_use_id": call.id, "content": "Sunny, 21 C"}
                ],
            },
        ]
        answer = client.messages.create(
            model="default", max_tokens=48, messages=history, tools=[WEATHER]
        )
    assert done.stop_reason == "tool_use" and done.usage.output_tokens > 0
    jsonschema.validate(call.input, SCHEMA)
    last = streamed.content[-1]
    assert streamed.stop_reason == "tool_use" and last.type == "tool_use"
    assert last.input == call.input  # temperature 0: the same call, in pieces
    assert sum(d.delta.type == "input_json_delta" for d in deltas) >= 3
    assert answer.content and answer.stop_reason in ("end_turn", "max_tokens", "tool_use")


def test_a_stop_sequence_ends_the_message_and_is_named(server: str) -> None:
    """Counting aloud, the model writes "3"; the stop sequence cuts it there, and the message
    says which sequence did, whole and in the stream's `message_delta`."""
    count: list[MessageParam] = [
        {"role": "user", "content": "Count from 1 to 10, separated by commas. Only the numbers."}
    ]
    body: dict[str, Any] = {
        "model": "default",
        "max_tokens": 40,
        "messages": count,
        "stop_sequences": ["4", "XYZ"],
        "extra_body": {"temperature": 0},
    }
    with _client(server) as client:
        done = client.messages.create(**body)
        with client.messages.stream(**body) as stream:
            streamed = stream.get_final_message()
    for message in (done, streamed):
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == "4"
        text = message.content[0].text  # type: ignore[union-attr]
        assert "3" in text and "4" not in text
