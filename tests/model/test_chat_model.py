"""`/v1/chat/completions` on the real default model, through the openai SDK's chat client: a
forced function call (whole and streamed) and a json_schema answer that parses."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import openai
import pytest
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam
from openai.types.shared_params import ResponseFormatJSONSchema

pytestmark = pytest.mark.model

SCHEMA: dict[str, object] = {
    "type": "object",
    "properties": {"location": {"type": "string"}},
    "required": ["location"],
    "additionalProperties": False,
}
WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": SCHEMA,
        "strict": True,
    },
}
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "What's the weather in Paris?"}
]
FORCED: Any = {"type": "function", "function": {"name": "get_weather"}}


def _client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=server, api_key="unused", max_retries=0, timeout=120)


def test_forced_call_whole_and_streamed(server: str) -> None:
    body: dict[str, Any] = {
        "model": "default",
        "messages": QUESTION,
        "tools": [WEATHER],
        "tool_choice": FORCED,
        "max_completion_tokens": 48,
        "temperature": 0,
    }
    with _client(server) as client:
        done = client.chat.completions.create(**body)
        options: Any = {"include_usage": True}
        chunks = list(client.chat.completions.create(**body, stream=True, stream_options=options))
    calls = done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "tool_calls" and calls is not None and len(calls) == 1
    call = calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    jsonschema.validate(json.loads(call.function.arguments), SCHEMA)
    assert done.usage is not None and done.usage.completion_tokens > 0
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].id and deltas[0].function and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert arguments == call.function.arguments  # temperature 0: the same call, in pieces
    assert len(deltas) >= 3, "arguments should stream as the model writes them"
    assert chunks[-2].choices[0].finish_reason == "tool_calls"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None


def test_json_schema_answer_parses(server: str) -> None:
    fmt: ResponseFormatJSONSchema = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": SCHEMA, "strict": True},
    }
    with _client(server) as client:
        done = client.chat.completions.create(
            model="default",
            messages=[{"role": "user", "content": "Name a city in France, as JSON."}],
            response_format=fmt,
            max_completion_tokens=48,
            temperature=0,
        )
    content = done.choices[0].message.content
    assert done.choices[0].finish_reason == "stop" and content is not None
    jsonschema.validate(json.loads(content), SCHEMA)
