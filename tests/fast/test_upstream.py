"""Gateway mode on recorded upstream streams: what oars sends, what every dialect becomes, and
how every fault ends (a status before the first byte, `response.failed` after it)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

import httpx
import pytest

from oars.engines import Engine
from oars.engines.upstream import (
    Pacing,
    UpstreamConfig,
    UpstreamEngine,
    load_upstreams,
    upstream_arg,
)
from oars.engines.upstream.body import chat_body
from oars.engines.upstream.chunks import ChunkReader
from oars.generation import ChatMessage, EngineRequest, FinishReason, SamplingParams
from oars.http import create_app
from oars.parsing import SegmentKind
from oars.service import ResponsesService
from oars.testing import ScriptedEngine
from oars.validator import validate_sse
from tests.conftest import free_port
from tests.upstream_replay import FIXTURES, Replay, Scenario, recorded, text_stream

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
def upstream() -> Any:
    with Replay() as replay:
        yield replay


def _engine(url: str, pacing: Pacing | None = None, **options: Any) -> UpstreamEngine:
    config = UpstreamConfig("up", url, **{"idle_timeout": 2.0, **options})
    return UpstreamEngine(config, pacing=pacing)


def _call(
    upstream_url: str,
    body: dict[str, Any],
    *,
    method: str = "POST",
    path: str = "/v1/responses",
    engines: dict[str, Engine] | None = None,
    **options: Any,
) -> httpx.Response:
    engines = engines or {"up": _engine(upstream_url, **options)}
    service = ResponsesService(engines, strict_models=True)
    app = create_app(service)

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as c:
            try:
                if method == "GET":
                    return await c.get(path)
                return await c.post(path, json={"model": "up", **body})
            finally:
                await service.aclose()

    return asyncio.run(go())


def _stream(upstream_url: str, body: dict[str, Any], **options: Any) -> list[dict[str, Any]]:
    r = _call(upstream_url, {**body, "stream": True}, **options)
    assert r.status_code == 200, r.text
    report = validate_sse(r.text)
    assert report.ok, report.text()
    return [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]


def _final(events: list[dict[str, Any]]) -> dict[str, Any]:
    response: dict[str, Any] = events[-1]["response"]
    return response


# ---- what oars sends ----------------------------------------------------------------------------


def test_the_request_becomes_a_streamed_chat_completion(upstream: Replay) -> None:
    namespace = {
        "type": "namespace",
        "name": "files",
        "tools": [{"type": "function", "name": "read", "parameters": {"type": "object"}}],
    }
    patch = {"type": "custom", "name": "apply_patch", "description": "Patch files."}
    history = [
        {"role": "user", "content": "weather?"},
        {
            "type": "function_call",
            "call_id": "c1",
            "name": "get_weather",
            "arguments": '{"city": "Paris"}',
        },
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    ]
    # (not through the validator: the SDK's types do not know namespace tools in the echo)
    _call(
        upstream.url,
        {
            "instructions": "Be brief.",
            "input": history,
            "tools": [WEATHER, namespace, patch],
            "tool_choice": "auto",
            "parallel_tool_calls": False,
            "max_output_tokens": 50,
            "temperature": 0.2,
            "top_p": 0.9,
            "seed": 7,
            "reasoning": {"effort": "low"},
            "include": ["message.output_text.logprobs"],
            "top_logprobs": 2,
        },
    )
    sent = upstream.bodies[-1]
    assert sent["model"] == "up" and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool"]
    assert sent["messages"][0]["content"] == "Be brief."
    call = sent["messages"][2]["tool_calls"][0]
    assert call == {
        "id": "c1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
    }
    assert sent["messages"][3] == {"role": "tool", "content": "sunny", "tool_call_id": "c1"}
    names = [t["function"]["name"] for t in sent["tools"]]
    assert names == ["get_weather", "read", "apply_patch"]  # namespace flattened
    custom = sent["tools"][2]["function"]["parameters"]
    assert custom["properties"] == {"input": {"type": "string"}}
    assert (sent["tool_choice"], sent["parallel_tool_calls"]) == ("auto", False)
    assert (sent["max_tokens"], sent["temperature"], sent["top_p"], sent["seed"]) == (
        50,
        0.2,
        0.9,
        7,
    )
    assert (sent["logprobs"], sent["top_logprobs"], sent["reasoning_effort"]) == (True, 2, "low")


def test_the_body_is_written_without_a_server() -> None:
    """`chat_body` is pure: a request's body, defaults left out, efforts past `high` as `high`."""
    request = EngineRequest(
        (ChatMessage("user", "Hi"),),
        SamplingParams(temperature=0.5, seed=3),
        reasoning_effort="xhigh",
    )
    assert chat_body(request, "Qwen/Real-Name") == {
        "model": "Qwen/Real-Name",
        "messages": [{"role": "user", "content": "Hi"}],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": 0.5,
        "seed": 3,
        "reasoning_effort": "high",
    }


def test_tool_choice_and_text_format_translate(upstream: Replay) -> None:
    _stream(
        upstream.url,
        {
            "input": "x",
            "tools": [WEATHER],
            "tool_choice": {"type": "function", "name": "get_weather"},
        },
    )
    assert upstream.bodies[-1]["tool_choice"] == {
        "type": "function",
        "function": {"name": "get_weather"},
    }
    _stream(upstream.url, {"input": "x", "tools": [WEATHER], "tool_choice": "none"})
    assert "tools" not in upstream.bodies[-1]
    fmt = {
        "type": "json_schema",
        "name": "answer",
        "strict": True,
        "schema": {"type": "object", "properties": {"a": {"type": "integer"}}},
    }
    _stream(upstream.url, {"input": "x", "text": {"format": fmt}})
    assert upstream.bodies[-1]["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": fmt["schema"], "strict": True},
    }
    _stream(upstream.url, {"input": "x", "text": {"format": {"type": "json_object"}}})
    assert upstream.bodies[-1]["response_format"] == {"type": "json_object"}
    _stream(upstream.url, {"input": "x", "text": {"format": fmt}}, schema_in_json_object=True)
    assert upstream.bodies[-1]["response_format"] == {
        "type": "json_object",
        "schema": fmt["schema"],
    }


def test_api_key_comes_from_the_named_environment_variable(
    upstream: Replay, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPSTREAM_KEY_FOR_TEST", "sk-up")
    _stream(upstream.url, {"input": "x"}, api_key_env="UPSTREAM_KEY_FOR_TEST")
    assert upstream.headers[-1]["Authorization"] == "Bearer sk-up"
    _stream(upstream.url, {"input": "x"}, upstream_model="Qwen/Real-Name")
    assert upstream.bodies[-1]["model"] == "Qwen/Real-Name"
    assert "Authorization" not in upstream.headers[-1]


# ---- what each dialect becomes ------------------------------------------------------------------


def test_plain_text_stream(upstream: Replay) -> None:
    # chunks that come apart go out apart, each a delta as it is read
    upstream.play(replace(text_stream(["Hel", "lo", " world"]), chunk_delay=0.05))
    events = _stream(upstream.url, {"input": "x"})
    response = _final(events)
    assert response["status"] == "completed"
    assert response["output"][0]["content"][0]["text"] == "Hello world"
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["Hel", "lo", " world"]
    assert response["usage"]["input_tokens"] == 7 and response["usage"]["output_tokens"] == 3


def _paced(url: str, interval: float) -> dict[str, Engine]:
    """An engine whose streams are read `interval` seconds apart (one stream open)."""
    return {"up": _engine(url, Pacing(1 / interval, longest=interval))}


def test_chunks_read_at_once_are_one_delta(upstream: Replay) -> None:
    """Reads spaced out: what came between two reads is one delta, but for whitespace alone
    (which the builder drops between items). The first output is not put off: the role's
    chunk before it, which brings none, does not start the spacing."""
    upstream.play(replace(text_stream(["Hel", "lo", " ", "world", "!"]), chunk_delay=0.1))
    events = _stream(upstream.url, {"input": "x"}, engines=_paced(upstream.url, 0.8))
    response = _final(events)
    assert response["output"][0]["content"][0]["text"] == "Hello world!"
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == ["Hel", "lo", " ", "world!"]
    assert response["usage"]["output_tokens"] == 5


def test_reasoning_read_at_once_is_one_delta_and_the_answer_is_as_read_apart(
    upstream: Replay,
) -> None:
    scenario = recorded("vllm_reasoning_field")  # "\n\n", then "4", after the reasoning
    upstream.play(replace(scenario, chunk_delay=0.02))
    apart = _final(_stream(upstream.url, {"input": "x"}))
    upstream.play(scenario)
    events = _stream(upstream.url, {"input": "x"}, engines=_paced(upstream.url, 0.4))
    together = _final(events)
    assert together["output"][1]["content"] == apart["output"][1]["content"]
    assert together["output"][1]["content"][0]["text"] == "4"
    reasoning = [e["delta"] for e in events if e["type"] == "response.reasoning_text.delta"]
    assert "".join(reasoning) == "".join(_deltas(scenario, "reasoning")) and len(reasoning) < 5


def test_pacing_shares_its_reads_among_the_open_streams() -> None:
    pacing = Pacing(2000, longest=0.05)
    assert pacing.interval() == 0.0
    pacing.streams = 64
    assert pacing.interval() == pytest.approx(0.032)
    pacing.streams = 500
    assert pacing.interval() == 0.05
    assert Pacing(0).interval() == 0.0


REASONING_DIALECTS = [
    "vllm_reasoning",
    "vllm_reasoning_field",
    "sglang_reasoning",
    "ollama_reasoning",
    "ollama_reasoning_legacy",
    "deepseek_reasoning",
]


@pytest.mark.parametrize("name", REASONING_DIALECTS)
def test_reasoning_dialects_become_a_reasoning_item(upstream: Replay, name: str) -> None:
    scenario = recorded(name)
    upstream.play(scenario)
    response = _final(_stream(upstream.url, {"input": "x"}))
    assert response["status"] == "completed"
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "message"], kinds
    reasoning = "".join(p["text"] for p in response["output"][0]["content"])
    sent = "".join(_deltas(scenario, "reasoning_content") + _deltas(scenario, "reasoning"))
    assert reasoning == sent and reasoning
    text = response["output"][1]["content"][0]["text"]
    assert text == "".join(_deltas(scenario, "content")).lstrip()  # as after a </think>
    assert response["usage"]["output_tokens_details"]["reasoning_tokens"] > 0


def _deltas(scenario: Scenario, key: str) -> list[str]:
    return [
        c["choices"][0]["delta"][key]
        for c in scenario.chunks
        if isinstance(c, dict)
        and c.get("choices")
        and isinstance(c["choices"][0].get("delta", {}).get(key), str)
    ]


def test_cached_and_reasoning_tokens_are_reported(upstream: Replay) -> None:
    for name in ("vllm_reasoning", "deepseek_reasoning"):
        scenario = recorded(name)
        usage = next(c["usage"] for c in scenario.chunks if c.get("usage"))
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or usage.get(
            "prompt_cache_hit_tokens"
        )
        upstream.play(scenario)
        got = _final(_stream(upstream.url, {"input": "x"}))["usage"]
        assert got["input_tokens"] == usage["prompt_tokens"]
        assert got["input_tokens_details"]["cached_tokens"] == cached and cached
        assert got["output_tokens"] == usage["completion_tokens"]


@pytest.mark.parametrize("name", ["vllm_parallel_tools", "interleaved_tools"])
def test_indexed_call_deltas_become_one_item_per_call(upstream: Replay, name: str) -> None:
    scenario = recorded(name)
    upstream.play(scenario)
    response = _final(_stream(upstream.url, {"input": "x", "tools": [WEATHER]}))
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert len(calls) == 2 and response["status"] == "completed"
    expected: dict[int, str] = {}
    for chunk in scenario.chunks:
        for delta in (chunk.get("choices") or [{}])[0].get("delta", {}).get("tool_calls") or []:
            piece = delta.get("function", {}).get("arguments") or ""
            expected[delta["index"]] = expected.get(delta["index"], "") + piece
    assert [json.loads(c["arguments"]) for c in calls] == [
        json.loads(expected[i]) for i in sorted(expected)
    ]
    assert all(c["status"] == "completed" and c["call_id"] for c in calls)


def test_a_call_repeating_its_name_in_every_delta_keeps_one_name(upstream: Replay) -> None:
    """llama-cpp-python's server repeats id, type and name in each argument delta."""
    upstream.play(recorded("llama_cpp_python_named_tool"))
    body = {
        "input": "x",
        "tools": [WEATHER],
        "tool_choice": {"type": "function", "name": "get_weather"},
    }
    response = _final(_stream(upstream.url, body))
    [call] = [item for item in response["output"] if item["type"] == "function_call"]
    assert call["name"] == "get_weather" and json.loads(call["arguments"])["city"]


def test_logprobs_reach_the_output_text(upstream: Replay) -> None:
    scenario = recorded("logprobs")
    upstream.play(scenario)
    body = {"input": "x", "include": ["message.output_text.logprobs"], "top_logprobs": 2}
    part = _final(_stream(upstream.url, body))["output"][0]["content"][0]
    entries = [
        e
        for c in scenario.chunks
        if c.get("choices") and c["choices"][0]["delta"].get("content")
        for e in (c["choices"][0].get("logprobs") or {}).get("content") or []
    ]
    assert [lp["token"] for lp in part["logprobs"]] == [e["token"] for e in entries]
    assert part["logprobs"][0]["logprob"] == entries[0]["logprob"]
    assert len(part["logprobs"][0]["top_logprobs"]) == 2


@pytest.mark.parametrize(
    ("name", "reason"), [("length", "max_output_tokens"), ("content_filter", "content_filter")]
)
def test_cut_short_is_incomplete_with_its_reason(upstream: Replay, name: str, reason: str) -> None:
    upstream.play(recorded(name))
    response = _final(_stream(upstream.url, {"input": "x"}))
    assert response["status"] == "incomplete"
    assert response["incomplete_details"] == {"reason": reason}


@pytest.mark.parametrize(
    "name", ["usage_in_last_choice_chunk", "text_with_role_first", "llama_cpp_python_text"]
)
def test_other_framings_complete(upstream: Replay, name: str) -> None:
    upstream.play(recorded(name))
    response = _final(_stream(upstream.url, {"input": "x"}))
    assert response["status"] == "completed" and response["usage"]["output_tokens"] > 0


def test_every_recorded_stream_is_replayed_by_a_test() -> None:
    covered = {
        *REASONING_DIALECTS,
        "vllm_parallel_tools",
        "interleaved_tools",
        "logprobs",
        "length",
        "content_filter",
        "usage_in_last_choice_chunk",
        "text_with_role_first",
        "llama_cpp_python_text",
        "llama_cpp_python_named_tool",
    }
    assert {p.stem for p in FIXTURES.glob("*.json")} == covered


def test_the_reader_reads_a_recorded_stream_without_a_server() -> None:
    """The chunk reader is pure: interleaved call deltas come out one call after the other,
    then the reason and the usage, with no connection in between."""
    reader = ChunkReader()
    chunks = [c for raw in recorded("interleaved_tools").chunks for c in reader.read(raw)]
    chunks += reader.finish()
    starts = [s.name for c in chunks for s in c.segments if s.kind is SegmentKind.CALL_START]
    assert starts == ["get_weather", "get_time"]
    last = chunks[-1]
    assert last.finish is FinishReason.TOOL_CALLS
    assert last.usage is not None and last.usage.input_tokens == 301


def test_the_stop_string_an_upstream_names_is_the_stop_sequence() -> None:
    """vLLM and SGLang name the stop string that matched in `stop_reason` (a token id when a
    stop token did: not a sequence)."""
    for stop_reason, expected in (("END", "END"), (151645, None), (None, None)):
        reader = ChunkReader()
        choice = {"index": 0, "delta": {}, "finish_reason": "stop", "stop_reason": stop_reason}
        reader.read({"choices": [choice]})
        assert reader.finish()[-1].stop_sequence == expected


def test_calls_and_think_left_in_content_are_parsed_when_asked(upstream: Replay) -> None:
    text = [
        "<think>The user",
        " wants weather.</think>",
        '<tool_call>\n{"name": "get_weather",',
        ' "arguments": {"city": "Paris"}}\n</tool_call>',
    ]
    upstream.play(text_stream(text))
    response = _final(
        _stream(
            upstream.url, {"input": "x", "tools": [WEATHER]}, parse_calls="hermes", parse_think=True
        )
    )
    kinds = [item["type"] for item in response["output"]]
    assert kinds == ["reasoning", "function_call"], kinds
    assert json.loads(response["output"][1]["arguments"]) == {"city": "Paris"}
    upstream.play(text_stream(text))
    unparsed = _final(_stream(upstream.url, {"input": "x", "tools": [WEATHER]}))
    assert [item["type"] for item in unparsed["output"]] == ["message"]


# ---- faults -------------------------------------------------------------------------------------


def _error(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


def test_refused_before_the_first_byte_is_a_502() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    for stream in (True, False):
        error = _error(_call(url, {"input": "x", "stream": stream}), 502)
        assert error["code"] == "upstream_unreachable" and error["type"] == "server_error"


def test_no_answer_in_time_is_a_504(upstream: Replay) -> None:
    upstream.play(Scenario(text_stream(["x"]).chunks, header_delay=1.5))
    error = _error(_call(upstream.url, {"input": "x"}, first_byte_timeout=0.5), 504)
    assert error["code"] == "upstream_timeout"


def test_an_upstream_4xx_passes_through_with_its_message(upstream: Replay) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 4096 tokens.",
            "type": "BadRequestError",
            "param": None,
            "code": 400,
        }
    }
    upstream.play(Scenario(status=400, error=body))
    error = _error(_call(upstream.url, {"input": "x", "stream": True}), 400)
    assert "maximum context length" in error["message"]
    upstream.play(Scenario(status=422, error={"detail": [{"msg": "field required"}]}))
    assert "field required" in _error(_call(upstream.url, {"input": "x"}), 422)["message"]


def test_an_upstream_5xx_or_refused_credentials_is_a_502(upstream: Replay) -> None:
    upstream.play(Scenario(status=503, error={"error": "overloaded"}))
    assert "overloaded" in _error(_call(upstream.url, {"input": "x"}), 502)["message"]
    upstream.play(Scenario(status=401, error={"error": {"message": "bad key"}}))
    assert _error(_call(upstream.url, {"input": "x"}), 502)["code"] == "upstream_unauthorized"


def _failed(upstream: Replay, scenario: Scenario, **options: Any) -> dict[str, Any]:
    upstream.play(scenario)
    events = _stream(upstream.url, {"input": "x"}, **options)
    assert events[-2]["type"] == "error" and events[-1]["type"] == "response.failed"
    return _final(events)


def test_a_stream_broken_mid_way_ends_failed_with_what_it_had(upstream: Replay) -> None:
    chunks = text_stream(["Hel", "lo", " there"]).chunks
    cut = _failed(upstream, Scenario(chunks, cut_after=3))
    assert cut["output"][0]["content"][0]["text"] == "Hello"
    assert cut["output"][0]["status"] == "incomplete"
    garbage = _failed(upstream, Scenario([*chunks[:2], "{not json"]))
    assert "not JSON" in garbage["error"]["message"]
    unfinished = _failed(upstream, Scenario(chunks[:3], done=True))  # [DONE], no finish_reason
    assert "ended before it finished" in unfinished["error"]["message"]
    error_chunk = _failed(upstream, Scenario([*chunks[:2], {"error": {"message": "OOM"}}]))
    assert "OOM" in error_chunk["error"]["message"]


def test_a_stalled_upstream_fails_after_the_idle_timeout(upstream: Replay) -> None:
    chunks = text_stream(["a", "b"]).chunks
    start = time.monotonic()
    stalled = _failed(upstream, Scenario(chunks, stall_after=2, stall=5.0), idle_timeout=0.5)
    assert time.monotonic() - start < 4
    assert "sent nothing for 0.5 s" in stalled["error"]["message"]


def test_a_finished_stream_without_done_still_completes(upstream: Replay) -> None:
    upstream.play(Scenario(text_stream(["ok"]).chunks, done=False))
    assert _final(_stream(upstream.url, {"input": "x"}))["status"] == "completed"


def test_a_non_streamed_failure_is_a_5xx_with_the_error_shape(upstream: Replay) -> None:
    upstream.play(Scenario(text_stream(["a", "b"]).chunks, cut_after=2))
    error = _error(_call(upstream.url, {"input": "x"}), 500)
    assert "ended before it finished" in error["message"]


# ---- engine level: disconnects, concurrency --------------------------------------------------


def _request(text: str = "x") -> EngineRequest:
    return EngineRequest((ChatMessage("user", text),), SamplingParams())


def test_closing_the_generation_closes_the_upstream_request(upstream: Replay) -> None:
    pieces = [f"w{i} " for i in range(200)]
    upstream.play(Scenario(text_stream(pieces).chunks, chunk_delay=0.01))
    engine = _engine(upstream.url)

    async def read_two() -> None:
        opened = await engine.open(_request())
        stream = engine.generate(opened)
        async for _ in stream:
            if engine.streams and upstream.bodies:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        assert engine.streams == 0
        await engine.aclose()

    asyncio.run(read_two())
    assert upstream.closed.wait(5), "the upstream kept streaming to nobody"


def test_requests_to_an_upstream_run_concurrently(upstream: Replay) -> None:
    slow = Scenario(text_stream([f"{i}" for i in range(10)]).chunks, chunk_delay=0.05)
    upstream.play(*[slow] * 8)
    engine = _engine(upstream.url)

    async def one() -> int:
        opened = await engine.open(_request())
        return len([c async for c in engine.generate(opened)])

    async def eight() -> list[int]:
        counts = await asyncio.gather(*[one() for _ in range(8)])
        await engine.aclose()
        return counts

    start = time.monotonic()
    counts = asyncio.run(eight())
    elapsed = time.monotonic() - start
    assert all(n > 10 for n in counts)
    assert elapsed < 8 * 0.5 / 2, f"8 streams of 0.5 s took {elapsed:.2f} s: serialized"


# ---- many models --------------------------------------------------------------------------------


def test_models_are_listed_and_an_unknown_one_is_a_404(upstream: Replay) -> None:
    engines: dict[str, Engine] = {"local": ScriptedEngine(["hi"]), "up": _engine(upstream.url)}
    listed = _call(upstream.url, {}, method="GET", path="/v1/models", engines=engines).json()
    assert [m["id"] for m in listed["data"]] == ["local", "up"]
    error = _error(_call(upstream.url, {"model": "nope", "input": "x"}, engines=engines), 404)
    assert (error["param"], error["code"]) == ("model", "model_not_found")
    local = _call(upstream.url, {"model": "local", "input": "x"}, engines=engines).json()
    assert local["output"][0]["content"][0]["text"] == "hi" and local["model"] == "local"
    remote = _call(upstream.url, {"model": "up", "input": "x"}, engines=engines).json()
    assert remote["output"][0]["content"][0]["text"] == "Hello there"


def test_upstreams_are_configured_by_flag_or_toml(tmp_path: Any) -> None:
    assert upstream_arg("qwen=http://gpu:8000/v1") == UpstreamConfig("qwen", "http://gpu:8000/v1")
    with pytest.raises(ValueError):
        upstream_arg("no-url")
    path = tmp_path / "upstreams.toml"
    path.write_text(
        '[[upstream]]\nmodel = "a"\nurl = "http://x/v1"\nparse_calls = "hermes"\n'
        'idle_timeout = 5.0\n[[upstream]]\nmodel = "b"\nurl = "http://y/v1"\n'
    )
    a, b = load_upstreams(str(path))
    assert (a.parse_calls, a.idle_timeout, b.model) == ("hermes", 5.0, "b")
    path.write_text('[[upstream]]\nmodel = "a"\nurl = "http://x/v1"\nspeed = 3\n')
    with pytest.raises(ValueError, match="speed"):
        load_upstreams(str(path))


def test_a_stream_without_usage_is_counted_by_the_upstream(upstream: Replay) -> None:
    upstream.play(text_stream(["a", "b", "c"], usage=False))
    usage = _final(_stream(upstream.url, {"input": "x"}))["usage"]
    assert (usage["input_tokens"], usage["output_tokens"]) == (7, 3)
    assert upstream.bodies[-1]["stream"] is False and upstream.bodies[-1]["max_tokens"] == 1


def test_a_client_that_leaves_closes_the_upstream_request_at_once(upstream: Replay) -> None:
    """End to end, with a real `oars serve --upstream` process (no model to load)."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "oars.cli",
        "serve",
        "--port",
        str(port),
        "--store",
        "none",
        "--upstream",
        f"up={upstream.url}",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_for(lambda: httpx.get(f"{base}/health", timeout=1).status_code == 200)
        upstream.play(
            Scenario(text_stream([f"w{i} " for i in range(500)]).chunks, chunk_delay=0.02)
        )
        body = {"model": "up", "input": "x", "stream": True}
        with httpx.stream("POST", f"{base}/v1/responses", json=body, timeout=10) as r:
            for line in r.iter_lines():
                if "response.output_text.delta" in line:
                    break
        left = time.monotonic()
        assert upstream.closed.wait(5), "the upstream kept streaming to nobody"
        assert time.monotonic() - left < 1.0
        _wait_for(lambda: not httpx.get(f"{base}/health", timeout=1).json()["busy"])
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def _wait_for(check: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError("timed out")


def test_input_tokens_are_the_upstream_count(upstream: Replay) -> None:
    r = _call(upstream.url, {"input": "x"}, path="/v1/responses/input_tokens")
    assert r.json() == {"object": "response.input_tokens", "input_tokens": 7}
    assert upstream.bodies[-1]["max_tokens"] == 1 and upstream.bodies[-1]["stream"] is False


def _calls_stream(*deltas: Any, finish: str = "tool_calls") -> Scenario:
    """A stream of `delta` objects (tool_calls lists or content strings), then `finish`."""
    base = {"id": "chatcmpl-2", "object": "chat.completion.chunk", "created": 1, "model": "up"}
    chunks: list[Any] = []
    for d in deltas:
        delta = {"content": d} if isinstance(d, str) else {"tool_calls": d}
        chunks.append({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]})
    chunks.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
    return Scenario(chunks)


def _fn(name: str | None = None, arguments: str | None = None, **extra: Any) -> dict[str, Any]:
    function = {k: v for k, v in (("name", name), ("arguments", arguments)) if v is not None}
    return {**extra, "type": "function", "function": function}


def _output(upstream: Replay, scenario: Scenario) -> dict[str, Any]:
    upstream.play(scenario)
    return _final(_stream(upstream.url, {"input": "x", "tools": [WEATHER]}))


def test_a_call_cut_off_mid_arguments_is_never_completed(upstream: Replay) -> None:
    for finish in ("tool_calls", "stop"):
        response = _output(
            upstream, _calls_stream([_fn("get_weather", '{"city": "Pa', index=0)], finish=finish)
        )
        assert response["status"] == "failed", response["output"]
        assert response["output"][0]["status"] == "incomplete"


def test_text_sent_inside_an_unfinished_call_waits_for_it(upstream: Replay) -> None:
    response = _output(
        upstream,
        _calls_stream(
            [_fn("get_weather", '{"city": "Pa', index=0)],
            "Let me check.",
            [_fn(None, 'ris"}', index=0)],
        ),
    )
    call, message = response["output"]
    assert json.loads(call["arguments"]) == {"city": "Paris"} and call["status"] == "completed"
    assert message["content"][0]["text"] == "Let me check."


def test_calls_without_an_index_are_told_apart_by_id(upstream: Replay) -> None:
    response = _output(
        upstream,
        _calls_stream(
            [_fn("get_weather", '{"city": ', id="a")],
            [_fn(None, '"Paris"}')],
            [_fn("get_weather", '{"city": "Oslo"}', id="b")],
        ),
    )
    cities = [json.loads(c["arguments"])["city"] for c in response["output"]]
    assert cities == ["Paris", "Oslo"] and response["status"] == "completed"


def test_a_name_in_pieces_and_a_call_without_arguments(upstream: Replay) -> None:
    response = _output(
        upstream,
        _calls_stream(
            [_fn("get_", "", index=0)],
            [_fn("weather", None, index=0)],
            [_fn(None, '{"city": "Rome"}', index=0)],
            [_fn("get_weather", None, index=1)],
        ),
    )
    first, second = response["output"]
    assert (first["name"], json.loads(first["arguments"])) == ("get_weather", {"city": "Rome"})
    assert (second["name"], second["arguments"]) == ("get_weather", "{}")


@pytest.mark.parametrize("framing", ["close", "chunked", "gzip"])
def test_a_stream_reads_the_same_however_its_body_is_framed(upstream: Replay, framing: str) -> None:
    """Until the connection closes, a chunk a token (vLLM's and llama.cpp's servers), or
    compressed: an uncompressed body is read from the connection's stream directly, a
    compressed one through httpx's decoder."""
    pieces = ["Hel", "lo", " the", "re", ", wor", "ld"]
    upstream.play(Scenario(text_stream(pieces).chunks, framing=framing, chunk_delay=0.02))
    events = _stream(upstream.url, {"input": "x"})
    deltas = [e["delta"] for e in events if e["type"] == "response.output_text.delta"]
    assert deltas == pieces
    assert _final(events)["status"] == "completed"


def test_the_first_chunk_may_take_longer_than_the_idle_timeout(upstream: Replay) -> None:
    """Engines send their headers at once, then queue and prefill."""
    slow_start = Scenario(text_stream(["ok"]).chunks, stall_after=0, stall=1.0)
    upstream.play(slow_start)
    response = _final(
        _stream(upstream.url, {"input": "x"}, idle_timeout=0.3, first_byte_timeout=5.0)
    )
    assert response["status"] == "completed"


def test_upstream_latency_and_faults_are_in_the_metrics(upstream: Replay) -> None:
    from oars.metrics import Metrics
    from oars.serve import observe
    from tests.fast.test_operator import scrape, value

    upstream.play(Scenario(text_stream(["Hi", " there"]).chunks))
    dead = f"http://127.0.0.1:{free_port()}/v1"
    down = UpstreamEngine(UpstreamConfig("down", dead))
    engines: dict[str, Engine] = {"up": _engine(upstream.url), "down": down}
    service = ResponsesService(engines, strict_models=True)
    metrics = Metrics()
    observe(metrics, engines)  # as `oars serve` wires its engines
    app = create_app(service, metrics=metrics)

    async def go() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as c:
            ok = await c.post("/v1/responses", json={"model": "up", "input": "x"})
            assert ok.status_code == 200
            down = await c.post("/v1/responses", json={"model": "down", "input": "x"})
            assert down.status_code == 502
            text = (await c.get("/metrics")).text
        await service.aclose()
        return text

    m = scrape(asyncio.run(go()))
    up_url = upstream.url
    assert value(m, "oars_upstream_first_byte_seconds_count", model="up", replica=up_url) == 1
    errors = value(
        m, "oars_upstream_errors_total", model="down", replica=dead, code="upstream_unreachable"
    )
    assert errors == 1
    assert value(m, "oars_responses_total", model="up", status="completed") == 1
    assert value(m, "oars_tokens_total", model="up", kind="output") > 0
