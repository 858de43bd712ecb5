"""`/v1/chat/completions` through the gateway: `oars serve --upstreams …` with API keys and
limits in front of llama-cpp-python's own server on the default GGUF. A chat request goes to the
upstream through the same router, keys and limits as a response: its answers (whole, streamed,
with a tool call) are the openai SDK's types, and the key's limits refuse what is over them."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletion, ChatCompletionChunk, ChatCompletionMessageParam

from tests.model.conftest import MODEL, serve_gateway
from tests.model.test_chat_model import QUESTION, SCHEMA

pytestmark = pytest.mark.model

KEY = "sk-gateway-chat"
CAP = 32  # --max-output-tokens
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather for a city.",
        "parameters": SCHEMA,
    },
}


@pytest.fixture(scope="module")
def keyed_gateway(tmp_path_factory: pytest.TempPathFactory, llama_upstream: str) -> Iterator[str]:
    """The gateway with one key that may have one response running, of at most CAP tokens."""
    yield from serve_gateway(
        tmp_path_factory,
        llama_upstream,
        *("--api-key", KEY, "--max-concurrent-per-key", "1"),
        *("--max-output-tokens", str(CAP)),
    )


def _client(gateway: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=gateway, api_key=KEY, max_retries=0, timeout=300)


def _post(gateway: str, body: dict[str, Any]) -> httpx.Response:
    headers = {"authorization": f"Bearer {KEY}"}
    return httpx.post(f"{gateway}/chat/completions", json=body, headers=headers, timeout=300)


def _chunks(text: str) -> list[ChatCompletionChunk]:
    """A chat stream's chunks, each validated as the SDK's type; it ends with `[DONE]`."""
    lines = [line[len("data: ") :] for line in text.splitlines() if line.startswith("data: ")]
    assert lines[-1] == "[DONE]", lines[-3:]
    return [ChatCompletionChunk.model_validate(json.loads(line)) for line in lines[:-1]]


def test_a_chat_completion_through_the_gateway_whole_and_streamed(keyed_gateway: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}]}
    body |= {"max_tokens": 12, "temperature": 0}
    whole = ChatCompletion.model_validate(_post(keyed_gateway, body).json())
    choice = whole.choices[0]
    assert choice.message.role == "assistant" and (choice.message.content or "").strip()
    assert choice.finish_reason in ("stop", "length")
    assert whole.usage is not None and whole.usage.prompt_tokens > 0
    assert whole.usage.completion_tokens > 0 and whole.model == MODEL
    streamed = _post(
        keyed_gateway, body | {"stream": True, "stream_options": {"include_usage": True}}
    )
    chunks = _chunks(streamed.text)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == choice.message.content  # temperature 0: the same answer
    finish = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finish == [choice.finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert len({c.id for c in chunks}) == 1


def test_a_tool_call_through_the_gateway(keyed_gateway: str) -> None:
    body: dict[str, Any] = {"model": MODEL, "messages": QUESTION, "tools": [WEATHER]}
    body |= {"tool_choice": "required", "max_tokens": CAP, "temperature": 0}
    with _client(keyed_gateway) as client:
        done = client.chat.completions.create(**body)
        streamed = list(client.chat.completions.create(**body, stream=True))
    calls = done.choices[0].message.tool_calls
    assert done.choices[0].finish_reason == "tool_calls" and calls, done
    call = calls[0]
    assert call.type == "function" and call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["location"].lower()
    deltas = [d for c in streamed if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert deltas[0].function is not None and deltas[0].function.name == "get_weather"
    assert deltas[0].id and deltas[0].type == "function"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.function is not None)
    assert json.loads(arguments) == json.loads(call.function.arguments)


def test_the_keys_limits_apply_to_chat(keyed_gateway: str) -> None:
    """Over the output cap: a 400 naming chat's own parameter. Without a key: a 401. A second
    chat while the key's one response runs: a 429 with Retry-After, and the first goes on."""
    body: dict[str, Any] = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
    over = _post(keyed_gateway, body | {"max_completion_tokens": CAP + 1})
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_completion_tokens"
    anonymous = httpx.post(f"{keyed_gateway}/chat/completions", json=body, timeout=30)
    assert anonymous.status_code == 401
    count: ChatCompletionMessageParam = {
        "role": "user",
        "content": "Count from 1 to 50, separated by commas.",
    }
    first: dict[str, Any] = {}
    started = threading.Event()

    def run_first() -> None:
        with (
            _client(keyed_gateway) as client,
            client.chat.completions.create(
                model=MODEL, messages=[count], max_tokens=CAP, stream=True
            ) as stream,
        ):
            started.set()  # its headers are in: the key's one response is running
            first["chunks"] = list(stream)

    thread = threading.Thread(target=run_first)
    thread.start()
    assert started.wait(300)
    second = _post(keyed_gateway, body | {"max_tokens": 4})
    thread.join(300)
    assert second.status_code == 429 and second.headers["retry-after"], second.text
    assert second.json()["error"]["code"] == "rate_limit_exceeded"
    finishes = [c.choices[0].finish_reason for c in first["chunks"] if c.choices]
    assert finishes[-1] in ("stop", "length")


def test_the_catalog_says_what_the_gateway_knows_of_the_upstream_model(keyed_gateway: str) -> None:
    """llama-cpp-python's listing reports no context window and the table says none: null."""
    with _client(keyed_gateway) as client:
        model = client.models.retrieve(MODEL)
    assert model.id == MODEL and model.owned_by == "upstream"
    headers = {"authorization": f"Bearer {KEY}"}
    entry = httpx.get(f"{keyed_gateway}/models/{MODEL}", headers=headers).json()
    assert entry["context_window"] is None and entry["reasoning"] is None
    assert entry["input_modalities"] == ["text", "image", "file", "audio"]
