"""The foundation on the real embedded model, through real HTTP and the official openai SDK."""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import httpx2
import openai
import pytest

from oars.validator import same_response, validate_sse
from tests.model.conftest import RecordingTransport, stream

pytestmark = pytest.mark.model

SHORT = {"model": "default", "max_output_tokens": 24, "temperature": 0}


def _raw(server: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server}/responses", json=body, timeout=120)


def _client(server: str, transport: RecordingTransport) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=server,
        api_key="unused",
        max_retries=0,
        timeout=120,
        http_client=httpx2.Client(transport=transport),
    )


def _recorded(transport: RecordingTransport) -> Any:
    report = validate_sse(transport.bodies[-1].decode())
    assert report.ok, report.text()
    return report


def test_sdk_createstream(server: str) -> None:
    transport = RecordingTransport()
    with _client(server, transport) as client:
        stream = client.responses.create(
            model="default",
            input="What is the capital of France? One sentence.",
            stream=True,
            max_output_tokens=24,
            temperature=0,
        )
        events = list(stream)
    report = _recorded(transport)
    assert [e.type for e in events] == [e["type"] for e in report.events]
    final = report.final
    assert final["status"] in ("completed", "incomplete")
    assert "Paris" in final["output"][0]["content"][0]["text"]


def test_sdk_create_without_streaming(server: str) -> None:
    transport = RecordingTransport()
    with _client(server, transport) as client:
        response = client.responses.create(
            model="default",
            input="What is the capital of France? One sentence.",
            max_output_tokens=24,
            temperature=0,
        )
    assert response.status in ("completed", "incomplete")
    assert "Paris" in response.output_text
    assert response.usage is not None and response.usage.output_tokens > 0
    assert response.id.startswith("resp_")
    assert [item.type for item in response.output] == ["message"]


def test_sdk_stream_helper_final_response(server: str) -> None:
    transport = RecordingTransport()
    with (
        _client(server, transport) as client,
        client.responses.stream(
            model="default", input="Say hello.", max_output_tokens=24, temperature=0
        ) as stream,
    ):
        for _ in stream:
            pass
        final = stream.get_final_response()
    assert final.id == _recorded(transport).final["id"]
    assert final.output_text.strip()
    assert final.usage is not None and final.usage.output_tokens > 0


def test_streamed_final_equals_non_streamed(server: str) -> None:
    body = {
        "model": "default",
        "input": "Name three fruits.",
        "temperature": 0.8,
        "seed": 42,
        "max_output_tokens": 20,
    }
    streamed = stream(server, body).final
    plain = _raw(server, body).json()
    # A seeded run does not reuse the KV cache (see the engine), so nothing may differ.
    assert same_response(streamed, plain), (streamed["output"], plain["output"])


def test_max_output_tokens_gives_incomplete(server: str) -> None:
    report = stream(
        server, {**SHORT, "input": "Write a long story about a ship.", "max_output_tokens": 5}
    )
    final = report.final
    assert report.events[-1]["type"] == "response.incomplete"
    assert final["incomplete_details"] == {"reason": "max_output_tokens"}
    assert final["output"][-1]["status"] == "incomplete"
    assert final["usage"]["output_tokens"] == 5


def test_over_long_prompt_is_400_before_streaming(server: str) -> None:
    r = _raw(server, {**SHORT, "input": "word " * 6000, "stream": True})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_multibyte_emoji_survives_token_splits(server: str) -> None:
    body = {
        **SHORT,
        "input": "Repeat exactly, nothing else: héllo wörld 👋 你好 🎉",
        "include": ["message.output_text.logprobs"],
        "top_logprobs": 2,
    }
    report = stream(server, body)
    text = "".join(e["delta"] for e in report.events if e["type"] == "response.output_text.delta")
    assert "👋" in text and "\ufffd" not in text
    part = report.final["output"][0]["content"][0]
    assert part["text"] == text
    # Tokens that split a character carry partial bytes; together they are the text exactly.
    assert bytes(b for lp in part["logprobs"] for b in lp["bytes"]).decode() == text
    assert "".join(lp["token"] for lp in part["logprobs"]) == text


def test_repeated_prefix_is_reported_as_cached(server: str) -> None:
    system = "You are a terse assistant. " * 40
    first = _raw(server, {**SHORT, "instructions": system, "input": "Say A."}).json()
    second = _raw(server, {**SHORT, "instructions": system, "input": "Say B."}).json()
    cached = second["usage"]["input_tokens_details"]["cached_tokens"]
    assert first["usage"]["input_tokens"] > 200
    assert 200 < cached < second["usage"]["input_tokens"]


def test_multi_turn_history(server: str) -> None:
    body = {
        **SHORT,
        "input": [
            {"role": "user", "content": "My name is Ada."},
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Nice to meet you, Ada!"}],
            },
            {"role": "user", "content": "What is my name? Answer with the name only."},
        ],
    }
    assert "Ada" in stream(server, body).final["output"][0]["content"][0]["text"]


LONG_COUNT = {
    "model": "default",
    "input": "Count from 1 to 10000, one number per line.",
    "max_output_tokens": 3000,
    "temperature": 0,
}


def _engine_frees_itself(server: str) -> None:
    # 3000 tokens would take minutes at ~30 tok/s; a stopped generation frees the engine at once.
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.removesuffix('/v1')}/health").json()["busy"]:
        assert time.monotonic() < deadline, "generation kept running after the client left"
        time.sleep(0.2)


def test_disconnect_stops_generation(server: str) -> None:
    body = {**LONG_COUNT, "stream": True}
    with httpx.stream("POST", f"{server}/responses", json=body, timeout=60) as r:
        deltas = 0
        for line in r.iter_lines():
            deltas += line.startswith("event: response.output_text.delta")
            if deltas >= 3:
                break
    _engine_frees_itself(server)


def test_disconnect_stops_a_non_streamed_generation(server: str) -> None:
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server}/responses", json=LONG_COUNT, timeout=3)
    _engine_frees_itself(server)


def test_concurrent_requests_are_queued_fairly(server: str) -> None:
    results: list[int] = []

    def one(n: int) -> None:
        r = _raw(server, {**SHORT, "input": f"Say the number {n}.", "max_output_tokens": 8})
        results.append(r.status_code)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == [200, 200, 200]


def test_bad_input_on_real_server(server: str) -> None:
    r = _raw(server, {**SHORT, "input": "x", "temperature": 5})
    assert r.status_code == 400 and r.json()["error"]["param"] == "temperature"
