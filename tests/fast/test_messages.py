"""`/v1/messages` on the scripted engine, driven by the anthropic SDK over a real socket: text,
streams through the SDK's helper, thinking, a tool round trip, token counts, what is refused (a
400 in Anthropic's error shape naming the parameter), keys as `x-api-key`, and that nothing is
kept."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.types import MessageParam, ToolParam

from oars.families import THINK_TAGS, Hermes
from oars.generation import EngineRequest, FinishReason
from oars.http import create_app
from oars.service import ResponsesService
from oars.settings import ServerSettings
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.validator import parse_sse
from tests.conftest import serving

CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"location": "Paris"}}\n</tool_call>'
WEATHER: ToolParam = {
    "name": "get_weather",
    "description": "The weather in a city.",
    "input_schema": {"type": "object", "properties": {"location": {"type": "string"}}},
}
HI: list[MessageParam] = [{"role": "user", "content": "hi"}]


def _weather(request: EngineRequest) -> list[str]:
    """A call, split inside its JSON; after the tool's output, the answer."""
    return ["It is ", "sunny."] if request.after_tool_output else [CALL[:25], CALL[25:]]


@contextlib.contextmanager
def _client(
    engine: ScriptedEngine | None = None, key: str = "k", **kw: Any
) -> Iterator[tuple[anthropic.Anthropic, str]]:
    """The anthropic SDK's client on a real uvicorn serving the scripted engine, and the URL."""
    app = create_app(ResponsesService(engine or ScriptedEngine()), **kw)
    with (
        serving(app) as url,
        anthropic.Anthropic(base_url=url, api_key=key, max_retries=0) as client,
    ):
        yield client, url


def test_text_is_one_message_with_usage() -> None:
    with _client() as (client, _):
        done = client.messages.create(model="m", max_tokens=16, messages=HI)
    assert done.type == "message" and done.id.startswith("msg_") and done.role == "assistant"
    assert [b.type for b in done.content] == ["text"]
    assert done.content[0].text == "Hello world!"  # type: ignore[union-attr]
    assert done.stop_reason == "end_turn" and done.stop_sequence is None
    assert done.usage.output_tokens == 3 and done.usage.input_tokens > 0


def test_stream_helper_assembles_the_text() -> None:
    with (
        _client(ScriptedEngine(["Hel", "lo", "!"])) as (client, _),
        client.messages.stream(model="m", max_tokens=16, messages=HI) as stream,
    ):
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Hello!" and final.content[0].text == "Hello!"  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn" and final.usage.output_tokens == 3
    assert final.usage.input_tokens > 0


def test_stream_is_named_events_in_anthropics_order() -> None:
    with _client() as (_, url):
        body = {"model": "m", "max_tokens": 16, "messages": HI, "stream": True}
        r = httpx.post(f"{url}/v1/messages", json=body, headers={"x-api-key": "k"})
    assert r.headers["content-type"].startswith("text/event-stream")
    names = [name for name, _ in parse_sse(r.text)]
    assert names[:2] == ["message_start", "content_block_start"]
    assert set(names[2:-3]) == {"content_block_delta"}
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]


def test_max_tokens_is_the_stop_reason_of_a_cut_answer() -> None:
    with _client(ScriptedEngine(["Hi"], finish=FinishReason.LENGTH)) as (client, _):
        done = client.messages.create(model="m", max_tokens=1, messages=HI)
        with client.messages.stream(model="m", max_tokens=1, messages=HI) as stream:
            final = stream.get_final_message()
    assert done.stop_reason == "max_tokens" and final.stop_reason == "max_tokens"


def test_a_stop_sequence_that_ends_the_answer_is_named() -> None:
    """The sequence that matched is the message's `stop_sequence`, in the message and in the
    stream's `message_delta`; the text stops before it."""
    engine = ScriptedEngine(["Hi ", "there. ", "END", " never sent"])
    stops = ["STOP", "END"]
    with _client(engine) as (client, url):
        done = client.messages.create(model="m", max_tokens=16, messages=HI, stop_sequences=stops)
        with client.messages.stream(
            model="m", max_tokens=16, messages=HI, stop_sequences=stops
        ) as stream:
            final = stream.get_final_message()
        body = {"model": "m", "max_tokens": 16, "messages": HI, "stream": True}
        r = httpx.post(f"{url}/v1/messages", json=body | {"stop_sequences": stops})
        plain = client.messages.create(model="m", max_tokens=16, messages=HI, stop_sequences=["x"])
    for message in (done, final):
        assert message.stop_reason == "stop_sequence" and message.stop_sequence == "END"
        assert message.content[0].text == "Hi there. "  # type: ignore[union-attr]
    delta = [json.loads(data) for name, data in parse_sse(r.text) if name == "message_delta"]
    assert delta[0]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": "END"}
    assert plain.stop_reason == "end_turn" and plain.stop_sequence is None


def test_thinking_is_thinking_blocks() -> None:
    engine = ScriptedEngine(["<think>", "plan", " it", "</think>\n\n", "Hi"])
    engine.family = Hermes(THINK_TAGS, guards=True)
    thinking: Any = {"type": "enabled", "budget_tokens": 1024}
    body: dict[str, Any] = {"model": "m", "max_tokens": 64, "messages": HI, "thinking": thinking}
    with _client(engine) as (client, _):
        done = client.messages.create(**body)
        with client.messages.stream(**body) as stream:
            final = stream.get_final_message()
    assert engine.requests[-1].reasoning_effort == "low"
    for message in (done, final):
        assert [b.type for b in message.content] == ["thinking", "text"]
        assert message.content[0].thinking == "plan it"  # type: ignore[union-attr]
        assert message.content[0].signature == ""  # type: ignore[union-attr]
        assert message.content[1].text == "Hi"  # type: ignore[union-attr]


def test_tool_round_trip() -> None:
    with _client(ScriptedEngine(_weather)) as (client, _):
        first = client.messages.create(model="m", max_tokens=64, messages=HI, tools=[WEATHER])
        with client.messages.stream(
            model="m", max_tokens=64, messages=HI, tools=[WEATHER], tool_choice={"type": "any"}
        ) as stream:
            streamed = stream.get_final_message()
        call = first.content[0]
        assert call.type == "tool_use" and first.stop_reason == "tool_use"
        history: list[MessageParam] = [
            *HI,
            {"role": "assistant", "content": first.content},  # type: ignore[typeddict-item]
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "sunny"}],
            },
        ]
        answer = client.messages.create(model="m", max_tokens=64, messages=history, tools=[WEATHER])
    assert call.name == "get_weather" and call.input == {"location": "Paris"}
    assert call.id.startswith("call_")
    assert streamed.stop_reason == "tool_use" and streamed.content[0].type == "tool_use"
    assert streamed.content[0].input == {"location": "Paris"}
    assert answer.content[0].text == "It is sunny."  # type: ignore[union-attr]
    assert answer.stop_reason == "end_turn"


def test_options_reach_the_engine() -> None:
    engine = ScriptedEngine()
    system: Any = [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}]
    with _client(engine) as (client, _):
        client.messages.create(
            model="m",
            max_tokens=16,
            system=system,
            messages=HI,
            stop_sequences=["END"],
            extra_body={"temperature": 0.5, "top_k": 7},  # older clients send them
            metadata={"user_id": "u"},
            tools=[WEATHER],
            tool_choice={"type": "auto", "disable_parallel_tool_use": True},
        )
    request = engine.requests[-1]
    assert not request.parallel_tool_calls
    assert request.messages[0].role == "system" and "Be brief." in str(request.messages[0].content)
    assert request.sampling.stop == ("END",) and request.sampling.top_k == 7
    assert request.sampling.temperature == 0.5


def test_count_tokens_is_the_prompts() -> None:
    engine = ScriptedEngine()
    with _client(engine) as (client, _):
        counted = client.messages.count_tokens(model="m", messages=HI, system="Be brief.")
        done = client.messages.create(model="m", max_tokens=16, messages=HI, system="Be brief.")
    assert counted.input_tokens == done.usage.input_tokens > 0


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"model": "m", "messages": HI}, "max_tokens"),
        ({"model": "m", "max_tokens": 8}, "messages"),
        ({"model": "m", "max_tokens": 8, "messages": HI, "frobnicate": 1}, "frobnicate"),
        ({"model": "m", "max_tokens": 0, "messages": HI}, "max_tokens"),
        ({"model": "m", "max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
        (
            {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "tool_result", "content": "x"}]}]},
            "messages[0].content[0].tool_use_id",
        ),
        (
            {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
            "messages[0].content[0].type",
        ),
        ({"model": "m", "max_tokens": 8, "messages": HI, "tools": [{"name": "a b", "input_schema": {}}]}, "tools[0].name"),
        ({"model": "m", "max_tokens": 8, "messages": HI, "tools": [{"type": "bash_20250124", "name": "bash"}]}, "tools[0].type"),
        ({"model": "m", "max_tokens": 8, "messages": HI, "thinking": {"type": "enabled"}}, "thinking.budget_tokens"),
        ({"model": "m", "max_tokens": 8, "messages": HI, "temperature": 3}, "temperature"),
    ],
)  # fmt: skip
def test_bad_requests_are_anthropic_errors_naming_the_parameter(
    body: dict[str, Any], named: str
) -> None:
    with _client() as (client, _), pytest.raises(anthropic.BadRequestError) as caught:
        client.post("/v1/messages", cast_to=object, body=body)
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "error", error
    assert error["error"]["type"] == "invalid_request_error"
    assert named in error["error"]["message"], error
    assert error["request_id"] == caught.value.request_id and error["request_id"]


def test_x_api_key_is_the_key_and_nothing_is_kept(tmp_path: Path) -> None:
    settings = ServerSettings(api_keys=("k",))
    store = SqlStore(str(tmp_path / "o.db"))
    with _client(settings=settings, store=store) as (client, url):
        done = client.messages.create(model="m", max_tokens=16, messages=HI)
        stored = httpx.get(
            f"{url}/v1/responses/resp_" + done.id.removeprefix("msg_"), headers={"x-api-key": "k"}
        )
    with (
        _client(key="wrong", settings=settings) as (client, _),
        pytest.raises(anthropic.AuthenticationError) as caught,
    ):
        client.messages.create(model="m", max_tokens=16, messages=HI)
    assert stored.status_code == 404
    error = caught.value.body
    assert isinstance(error, dict) and error["type"] == "error"
    assert error["error"]["type"] == "authentication_error"


def test_a_failure_mid_stream_is_an_error_event() -> None:
    with _client(ScriptedEngine(["Hi", ScriptedEngine.FAIL])) as (client, url):
        with (
            pytest.raises(anthropic.APIStatusError),
            client.messages.stream(model="m", max_tokens=8, messages=HI) as stream,
        ):
            stream.get_final_message()
        body = {"model": "m", "max_tokens": 8, "messages": HI, "stream": True}
        r = httpx.post(f"{url}/v1/messages", json=body)
    name, data = list(parse_sse(r.text))[-1]
    assert name == "error" and '"type":"api_error"' in data.replace(" ", "")
