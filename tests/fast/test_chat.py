"""`/v1/chat/completions` on the scripted engine, driven by the openai SDK's chat client over a
real socket: text, streams with usage, reasoning, a tool round trip, what is refused (a 400
naming the chat parameter), and that nothing is kept."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
)
from openai.types.shared_params import ResponseFormatJSONSchema

from oars.families import THINK_TAGS, Hermes
from oars.generation import EngineRequest, FinishReason
from oars.http import create_app
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from tests.conftest import serving

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
WEATHER: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
    },
}
HI: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _weather(request: EngineRequest) -> list[str]:
    """A call, split inside its JSON; after the tool's output, the answer."""
    return ["It is ", "sunny."] if request.after_tool_output else [CALL[:25], CALL[25:]]


@contextlib.contextmanager
def _client(engine: ScriptedEngine | None = None, **kw: Any) -> Iterator[tuple[openai.OpenAI, str]]:
    """The openai SDK's client on a real uvicorn serving the scripted engine, and the URL."""
    app = create_app(ResponsesService(engine or ScriptedEngine()), **kw)
    with (
        serving(app) as url,
        openai.OpenAI(base_url=f"{url}/v1", api_key="k", max_retries=0) as client,
    ):
        yield client, url


def _stream(client: openai.OpenAI, **kw: Any) -> list[ChatCompletionChunk]:
    body: dict[str, Any] = {"model": "m", "messages": HI, **kw}
    return list(client.chat.completions.create(stream=True, **body))


def test_text_is_one_message_with_usage() -> None:
    with _client() as (client, _):
        done = client.chat.completions.create(model="m", messages=HI)
    assert done.object == "chat.completion" and done.id.startswith("chatcmpl-")
    choice = done.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == "Hello world!"
    assert choice.finish_reason == "stop" and choice.message.tool_calls is None
    assert done.usage is not None and done.usage.completion_tokens == 3
    assert done.usage.total_tokens == done.usage.prompt_tokens + 3


def test_stream_assembles_the_text_then_finishes_then_usage() -> None:
    with _client(ScriptedEngine(["Hel", "lo", "!"])) as (client, _):
        chunks = _stream(client, stream_options={"include_usage": True})
    assert all(isinstance(c, ChatCompletionChunk) for c in chunks)
    assert len({c.id for c in chunks}) == 1 and chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Hello!"
    *_, finish, last = chunks
    assert finish.choices[0].finish_reason == "stop" and finish.usage is None
    assert last.choices == [] and last.usage is not None and last.usage.completion_tokens == 3


def test_stream_is_data_lines_ending_with_done() -> None:
    with _client() as (_, url):
        body = {"model": "m", "messages": HI, "stream": True}
        r = httpx.post(f"{url}/v1/chat/completions", json=body)
    assert r.headers["content-type"].startswith("text/event-stream")
    blocks = [b for b in r.text.split("\n\n") if b]
    assert all(b.startswith("data: ") for b in blocks) and blocks[-1] == "data: [DONE]"
    assert "usage" not in blocks[-2]  # no include_usage: no usage chunk


def test_length_is_the_finish_reason_of_a_cut_answer() -> None:
    with _client(ScriptedEngine(["Hi"], finish=FinishReason.LENGTH)) as (client, _):
        done = client.chat.completions.create(model="m", messages=HI, max_tokens=1)
        chunks = _stream(client, max_completion_tokens=1)
    assert done.choices[0].finish_reason == "length"
    assert chunks[-1].choices[0].finish_reason == "length"


def test_reasoning_is_reasoning_content() -> None:
    engine = ScriptedEngine(["<think>", "plan", " it", "</think>\n\n", "Hi"])
    engine.family = Hermes(THINK_TAGS, guards=True)
    with _client(engine) as (client, _):
        done = client.chat.completions.create(model="m", messages=HI)
        chunks = _stream(client)
    message = done.choices[0].message
    assert message.content == "Hi" and message.model_extra == {"reasoning_content": "plan it"}
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert "".join((d.model_extra or {}).get("reasoning_content", "") for d in deltas) == "plan it"
    assert "".join(d.content or "" for d in deltas) == "Hi"


def test_tool_round_trip() -> None:
    with _client(ScriptedEngine(_weather)) as (client, _):
        first = client.chat.completions.create(model="m", messages=HI, tools=[WEATHER])
        call = first.choices[0].message.tool_calls
        assert first.choices[0].finish_reason == "tool_calls" and call is not None
        assert call[0].function.name == "get_weather"  # type: ignore[union-attr]
        assert call[0].function.arguments == '{"location": "Paris"}'  # type: ignore[union-attr]
        assert call[0].id.startswith("call_") and first.choices[0].message.content is None
        chunks = _stream(client, tools=[WEATHER], tool_choice="required")
        history: list[Any] = [
            *HI,
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call[0].id, "content": "sunny, 21 C"},
        ]
        answer = client.chat.completions.create(model="m", messages=history, tools=[WEATHER])
    deltas = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].index == 0 and deltas[0].id and deltas[0].function is not None
    assert deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function)
    assert arguments == '{"location": "Paris"}' and len(deltas) >= 2
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert answer.choices[0].message.content == "It is sunny."
    assert answer.choices[0].finish_reason == "stop"


def test_json_schema_becomes_the_responses_format() -> None:
    engine = ScriptedEngine(['{"a": ', "1}"])
    schema: dict[str, object] = {"type": "object", "properties": {"a": {"type": "integer"}}}
    fmt: ResponseFormatJSONSchema = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": schema},
    }
    with _client(engine) as (client, _):
        done = client.chat.completions.create(model="m", messages=HI, response_format=fmt)
    assert done.choices[0].message.content == '{"a": 1}'
    assert engine.requests[-1].output is not None and engine.requests[-1].output.name == "a"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": []}, "messages"),
        ({"model": "m", "messages": HI, "n": 2}, "n"),
        ({"model": "m", "messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
        ({"model": "m", "messages": [{"role": "robot", "content": "x"}]}, "messages[0].role"),
        ({"model": "m", "messages": HI, "frobnicate": 1}, "frobnicate"),
        ({"model": "m", "messages": HI, "logit_bias": {"1": 2}}, "logit_bias"),
        ({"model": "m", "messages": HI, "presence_penalty": 1}, "presence_penalty"),
        ({"model": "m", "messages": HI, "max_completion_tokens": 0}, "max_completion_tokens"),
        ({"model": "m", "messages": HI, "max_tokens": "many"}, "max_tokens"),
        ({"model": "m", "messages": HI, "temperature": 3}, "temperature"),
        ({"model": "m", "messages": HI, "stream_options": {"include_usage": True}}, "stream_options"),
        ({"model": "m", "messages": HI, "response_format": {"type": "yaml"}}, "response_format.type"),
        (
            {"model": "m", "messages": HI, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}},
            "response_format.json_schema.name",
        ),
        (
            {"model": "m", "messages": HI, "tools": [{"type": "function", "function": {"name": "a b"}}]},
            "tools[0].function.name",
        ),
        (
            {"model": "m", "messages": HI, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice.function.name",
        ),
        (
            {"model": "m", "messages": [*HI, {"role": "assistant", "content": None}]},
            "messages[1]",
        ),
    ],
)  # fmt: skip
def test_bad_requests_name_the_chat_parameter(body: dict[str, Any], param: str) -> None:
    with _client() as (client, _), pytest.raises(openai.BadRequestError) as caught:
        client.post("/chat/completions", cast_to=object, body=body)
    error = caught.value.body
    assert isinstance(error, dict) and error["param"] == param, error
    assert caught.value.status_code == 400 and error["type"] == "invalid_request_error"


def test_api_keys_and_nothing_is_kept(tmp_path: Path) -> None:
    settings = ServerSettings(api_keys=("k",))
    store = SqlStore(str(tmp_path / "o.db"))
    with _client(settings=settings, store=store) as (client, url):
        done = client.chat.completions.create(model="m", messages=HI, store=True)
        stored = client.responses.with_raw_response.retrieve
        with pytest.raises(openai.NotFoundError):
            stored("resp_" + done.id.removeprefix("chatcmpl-"))
        anonymous = httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": HI})
    assert anonymous.status_code == 401


def test_a_failure_mid_stream_is_an_error_chunk() -> None:
    with _client(ScriptedEngine(["Hi", ScriptedEngine.FAIL])) as (client, url):
        with pytest.raises(openai.APIError):
            _stream(client)
        body = {"model": "m", "messages": HI, "stream": True}
        r = httpx.post(f"{url}/v1/chat/completions", json=body)
    blocks = [b for b in r.text.split("\n\n") if b]
    assert blocks[-2].startswith('data: {"error":') and blocks[-1] == "data: [DONE]"


def test_logprobs_are_the_texts() -> None:
    with _client(ScriptedEngine(["Hel", "lo"], logprobs=True)) as (client, _):
        done = client.chat.completions.create(model="m", messages=HI, logprobs=True, top_logprobs=2)
        chunks = _stream(client, logprobs=True)
    logprobs = done.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    assert "".join(t.token for t in logprobs.content) == "Hello"
    streamed = [t for c in chunks if c.choices for t in (c.choices[0].logprobs.content or [])]  # type: ignore[union-attr]
    assert "".join(t.token for t in streamed) == "Hello"
