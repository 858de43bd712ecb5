"""The HTTP surface on the scripted engine: framing, errors, stream == non-stream."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from oars.engines.base import ModelInfo
from oars.http import create_app
from oars.service import ResponsesService
from oars.testing import ScriptedEngine
from oars.validator import same_response, validate_sse

CAPTURES = Path(__file__).parent.parent / "fixtures" / "captures"


def _post(
    body: Any, engine: ScriptedEngine | None = None, *, raw: bytes | None = None
) -> httpx.Response:
    app = create_app(ResponsesService(engine or ScriptedEngine()))

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            content = raw if raw is not None else json.dumps(body).encode()
            return await client.post(
                "/v1/responses", content=content, headers={"content-type": "application/json"}
            )

    return asyncio.run(go())


def _get(path: str) -> httpx.Response:
    app = create_app(ResponsesService(ScriptedEngine()))

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.get(path)

    return asyncio.run(go())


def test_stream_is_sse_and_valid() -> None:
    r = _post({"model": "m", "input": "hi", "stream": True})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    report = validate_sse(r.text)
    assert report.ok, report.text()
    assert r.text.startswith("event: response.created\ndata: {")
    assert r.text.rstrip().split("\n")[-2] == "event: response.completed"


def test_stream_decided_by_body_not_accept_header() -> None:
    r = _post({"model": "m", "input": "hi"})
    assert r.headers["content-type"].startswith("application/json")
    assert r.json()["object"] == "response"


def test_non_stream_equals_streamed_final() -> None:
    body = {"model": "m", "input": "hi", "metadata": {"k": "v"}, "temperature": 0.5}
    streamed = validate_sse(_post({**body, "stream": True}).text).final
    plain = _post(body).json()
    assert streamed is not None and same_response(streamed, plain)
    assert plain["metadata"] == {"k": "v"} and plain["temperature"] == 0.5
    assert plain["output"][0]["content"][0]["text"] == "Hello world!"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": 5}, "input"),
        ({"model": "m", "input": "x", "temperature": 3}, "temperature"),
        ({"model": "m", "input": "x", "temperature": "hot"}, "temperature"),
        ({"model": "m", "input": "x", "top_p": 0}, "top_p"),
        ({"model": "m", "input": "x", "max_output_tokens": 0}, "max_output_tokens"),
        ({"model": "m", "input": "x", "top_logprobs": 21}, "top_logprobs"),
        ({"model": "m", "input": "x", "stream": "yes"}, "stream"),
        ({"model": "m", "input": "x", "include": ["nope"]}, "include[0]"),
        ({"model": "m", "input": [{"role": "robot", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"role": "user"}]}, "input[0].content"),
        (
            {
                "model": "m",
                "input": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_image", "image_url": "data:image/png;base64,AA"}
                        ],
                    }
                ],
            },
            "input[0].content[0]",
        ),
        ({"model": "m", "input": "x", "tools": ["x"]}, "tools[0]"),
        ({"model": "m", "input": "x", "metadata": {"k": 1}}, "metadata.k"),
        ({"model": "m", "input": "x", "text": {"format": {"type": "xml"}}}, "text.format.type"),
        (
            {"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}},
            "text.format.name",
        ),
        (
            {"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "n"}}},
            "text.format.schema",
        ),
        ({"model": "m", "input": "x", "text": {"verbosity": "loud"}}, "text.verbosity"),
        ({"model": "m", "input": "x", "reasoning": {"effort": "huge"}}, "reasoning.effort"),
        ({"model": "m", "input": "x", "top_k": -1}, "top_k"),
        ({"model": "m", "input": "x", "repetition_penalty": 0}, "repetition_penalty"),
        ({"model": "m", "input": "x", "stop": ["a", "b", "c", "d", "e"]}, "stop"),
        ({"model": "m", "input": "x", "seed": 1.5}, "seed"),
        ({"model": "m", "input": "x", "seed": -1}, "seed"),
        ([1, 2], "body"),
        ({"model": "m", "input": "x", "include": [["x"]]}, "include[0]"),
        ({"model": "m", "input": "x", "include": [{}]}, "include[0]"),
        (
            {"model": "m", "input": [{"type": ["message"], "role": "user", "content": "x"}]},
            "input[0].type",
        ),
        ({"model": "m", "input": [{"type": {}, "role": "user", "content": "x"}]}, "input[0].type"),
        (  # a call_id keys the pairing of calls and outputs: a list cannot
            {
                "model": "m",
                "input": [
                    {"type": "function_call", "call_id": ["c"], "name": "f", "arguments": "{}"},
                    {"type": "function_call_output", "call_id": ["c"], "output": "o"},
                ],
            },
            "input[0].call_id",
        ),
        (
            {
                "model": "m",
                "input": [{"type": "function_call_output", "call_id": {}, "output": "o"}],
            },
            "input[0].call_id",
        ),
        (
            {
                "model": "m",
                "input": "x",
                "tools": [{"type": "namespace", "name": "ns", "tools": ["x"]}],
            },
            "tools[0].tools[0]",
        ),
        (
            {
                "model": "m",
                "input": "x",
                "tools": [{"type": "namespace", "name": "ns", "tools": [None]}],
            },
            "tools[0].tools[0]",
        ),
        (
            {
                "model": "m",
                "input": "x",
                "tools": [{"type": "namespace", "name": "ns", "tools": 5}],
            },
            "tools[0].tools",
        ),
        (
            {
                "model": "m",
                "input": "x",
                "tools": [{"type": "function", "name": "f", "description": 5}],
            },
            "tools[0].description",
        ),
        (
            {
                "model": "m",
                "input": "x",
                "tools": [{"type": "function", "name": "f", "strict": "yes"}],
            },
            "tools[0].strict",
        ),
        ({"model": "m", "input": "x", "truncation": 5}, "truncation"),
        ({"model": "m", "input": "x", "truncation": "bogus"}, "truncation"),
        ({"model": "m", "input": "x", "service_tier": "bogus"}, "service_tier"),
        ({"model": "m", "input": "x", "tool_choice": "required"}, "tool_choice"),
        ({"model": "m", "input": "x", "tool_choice": "sometimes"}, "tool_choice"),
        (
            {"model": "m", "input": "x", "stop": "}", "text": {"format": {"type": "json_object"}}},
            "stop",
        ),
    ],
)
def test_bad_input_is_400_naming_the_param(body: Any, param: str) -> None:
    r = _post(body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param and error["type"] == "invalid_request_error"


def test_reasoning_effort_reaches_the_template() -> None:
    engine = ScriptedEngine()
    _post({"model": "m", "input": "x", "reasoning": {"effort": "none"}}, engine)
    assert engine.plans[-1].template_kwargs == {"enable_thinking": False}
    _post({"model": "m", "input": "x", "reasoning": {"effort": "high"}}, engine)
    assert engine.plans[-1].template_kwargs == {"enable_thinking": True, "reasoning_effort": "high"}


def test_invalid_json_is_400() -> None:
    r = _post(None, raw=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_json"


def test_previous_response_id_is_404_not_500() -> None:
    r = _post({"model": "m", "input": "x", "previous_response_id": "resp_123"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "previous_response_id"


def test_context_length_exceeded_before_any_byte() -> None:
    engine = ScriptedEngine(info=ModelInfo("tiny", context_length=5))
    r = _post({"model": "m", "input": "one two three four five six seven", "stream": True}, engine)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "context_length_exceeded"


def test_engine_failure_mid_stream_becomes_response_failed() -> None:
    engine = ScriptedEngine(["a", ScriptedEngine.FAIL])
    report = validate_sse(_post({"model": "m", "input": "x", "stream": True}, engine).text)
    assert report.ok, report.text()
    types = [e["type"] for e in report.events]
    assert types[-2:] == ["error", "response.failed"]


def test_engine_failure_without_stream_is_500() -> None:
    r = _post({"model": "m", "input": "x"}, ScriptedEngine(["a", ScriptedEngine.FAIL]))
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_every_input_form_is_rendered() -> None:
    engine = ScriptedEngine()
    body = {
        "model": "m",
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Dev rule."},
            {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {
                "type": "message",
                "role": "assistant",
                "id": "msg_x",
                "status": "completed",
                "phase": "final_answer",
                "content": [{"type": "output_text", "text": "Hello", "annotations": []}],
            },
            {"type": "reasoning", "id": "rs_x", "summary": [], "encrypted_content": None},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": "42"},
            {"type": "web_search_call", "id": "ws_1", "status": "completed"},
            {"role": "user", "content": "And?"},
        ],
    }
    assert _post(body, engine).status_code == 200
    messages = engine.requests[-1].messages
    assert [m.role for m in messages] == [
        "system",
        "user",
        "assistant",
        "assistant",
        "tool",
        "user",
    ]
    assert messages[0].content == "Be brief.\n\nDev rule."
    assert messages[3].tool_calls[0]["function"]["arguments"] == {"a": 1}


@pytest.mark.parametrize("path", sorted(CAPTURES.glob("codex_*.json")), ids=lambda p: p.stem)
def test_codex_request_is_accepted(path: Path) -> None:
    body = json.loads(path.read_text())["body"]
    r = _post(body)
    assert r.status_code == 200, r.text
    assert validate_sse(r.text).ok


def test_every_response_has_a_request_id() -> None:
    assert _post({"model": "m", "input": "x"}).headers["x-request-id"].startswith("req_")
    assert _post({"model": "m"}).headers["x-request-id"].startswith("req_")


def test_models_and_health() -> None:
    models = _get("/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "scripted"
    assert _get("/health").json()["status"] == "ok"


def test_deeply_nested_json_is_400() -> None:
    r = _post(None, raw=b"[" * 100_000)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_json"


def test_tools_are_echoed_in_their_full_shape() -> None:
    tools = [WEATHER, {"type": "custom", "name": "note"}, {"type": "web_search"}]
    echoed = _post({"model": "m", "input": "x", "tools": tools}).json()["tools"]
    assert echoed[0] == {**WEATHER, "description": None, "strict": True}
    assert echoed[1] == {
        "type": "custom",
        "name": "note",
        "description": None,
        "format": {"type": "text"},
    }
    assert echoed[2] == {"type": "web_search"}


def test_unknown_route_is_openai_style_404() -> None:
    r = _get("/v1/nothing")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
}


@pytest.mark.parametrize(
    ("tool_choice", "param"),
    [
        ({"type": "web_search"}, "tool_choice"),
        ({"type": "function", "name": "nope"}, "tool_choice.name"),
        (
            {"type": "allowed_tools", "mode": "auto", "tools": [{"type": "function", "name": "x"}]},
            "tool_choice.tools[0]",
        ),
        ({"type": "allowed_tools", "mode": "maybe", "tools": []}, "tool_choice.mode"),
        ({"type": "allowed_tools", "tools": 5}, "tool_choice.tools"),
    ],
)
def test_bad_tool_choice_is_400(tool_choice: Any, param: str) -> None:
    r = _post(
        {
            "model": "m",
            "input": "x",
            "tools": [WEATHER, {"type": "web_search"}],
            "tool_choice": tool_choice,
        }
    )
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_web_search_is_accepted_and_not_offered() -> None:
    """Codex sends it with every request: taken, echoed as sent, never offered."""
    engine = ScriptedEngine()
    tools: list[dict[str, Any]] = [
        {"type": "web_search", "external_web_access": True},
        WEATHER,
        {"type": "tool_search", "execution": "client"},
    ]
    r = _post({"model": "m", "input": "x", "tools": tools}, engine)
    assert r.status_code == 200
    assert _offered(engine) == ["get_weather", "tool_search"]
    assert [t["type"] for t in r.json()["tools"]] == [t["type"] for t in tools]
    assert r.json()["tools"][0] == tools[0]


@pytest.mark.parametrize(
    "tool",
    [
        {"type": "file_search", "vector_store_ids": ["vs_1"]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "image_generation"},
        {
            "type": "computer_use_preview",
            "display_height": 1,
            "display_width": 1,
            "environment": "linux",
        },
        {"type": "web_search_preview"},
    ],
)
def test_a_hosted_tool_this_server_does_not_run_is_refused(tool: dict[str, Any]) -> None:
    r = _post({"model": "m", "input": "x", "tools": [WEATHER, tool]}, ScriptedEngine())
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["param"].startswith("tools[1]"), error
    assert tool["type"] in error["message"], error


def test_an_mcp_tool_needs_a_url_or_a_server_the_operator_configured() -> None:
    tools: list[dict[str, Any]] = [WEATHER, {"type": "mcp", "server_label": "x"}]
    r = _post({"model": "m", "input": "x", "tools": tools}, ScriptedEngine())
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tools[1].server_url"


def test_tool_choice_none_offers_nothing_and_parses_no_call() -> None:
    engine = ScriptedEngine(['{"name": "get_weather", "arguments": {}}'])
    r = _post({"model": "m", "input": "x", "tools": [WEATHER], "tool_choice": "none"}, engine)
    assert _offered(engine) == [] and engine.plans[-1].constraint is None
    assert r.json()["output"][0]["type"] == "message"


def test_forced_call_is_constrained_from_the_first_token() -> None:
    engine = ScriptedEngine()
    _post({"model": "m", "input": "x", "tools": [WEATHER], "tool_choice": "required"}, engine)
    constraint = engine.plans[-1].constraint
    assert constraint is not None and constraint.triggers == ()
    assert '"\\"get_weather\\""' in constraint.source
    _post({"model": "m", "input": "x", "tools": [WEATHER]}, engine)
    lazy = engine.plans[-1].constraint
    assert lazy is not None and lazy.triggers


def test_after_tool_output_a_bare_call_cannot_open_the_reply() -> None:
    engine = ScriptedEngine()
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "sunny"},
    ]
    _post({"model": "m", "input": items, "tools": [WEATHER]}, engine)
    ban = engine.plans[-1].opening_ban
    assert "{" in ban and not any("<tool_call>".startswith(p) for p in ban), ban
    _post({"model": "m", "input": items[:1], "tools": [WEATHER]}, engine)
    assert engine.plans[-1].opening_ban == ()


def test_custom_tool_call_replay_is_rendered_as_input_argument() -> None:
    engine = ScriptedEngine()
    items = [
        {"role": "user", "content": "patch it"},
        {"type": "custom_tool_call", "call_id": "c", "name": "apply_patch", "input": "P"},
        {"type": "custom_tool_call_output", "call_id": "c", "output": "Done"},
    ]
    _post({"model": "m", "input": items}, engine)
    msgs = engine.requests[-1].messages
    assert msgs[1].tool_calls[0]["function"]["arguments"] == {"input": "P"}
    assert (msgs[2].role, msgs[2].content) == ("tool", "Done")


APPLY_PATCH_GRAMMAR = Path(__file__).parent.parent / "fixtures" / "grammars" / "apply_patch.lark"


def test_custom_tool_grammar_constrains_the_input() -> None:
    engine = ScriptedEngine()
    patch = {
        "type": "custom",
        "name": "apply_patch",
        "format": {
            "type": "grammar",
            "syntax": "lark",
            "definition": APPLY_PATCH_GRAMMAR.read_text(),
        },
    }
    _post({"model": "m", "input": "x", "tools": [patch], "tool_choice": "required"}, engine)
    constraint = engine.plans[-1].constraint
    assert constraint is not None and '"pattern": "^\\\\*\\\\*\\\\* Begin' in constraint.source
    freeform = {"type": "custom", "name": "note"}
    _post({"model": "m", "input": "x", "tools": [freeform], "tool_choice": "required"}, engine)
    constraint = engine.plans[-1].constraint
    assert constraint is not None and '"input": {"type": "string"}' in constraint.source


class _CountingEngine(ScriptedEngine):
    produced = 0

    async def generate(self, prepared: Any) -> Any:
        async for chunk in super().generate(prepared):
            self.produced += chunk.num_tokens
            yield chunk


@pytest.mark.parametrize("streamed", [True, False])
def test_a_client_that_goes_away_stops_its_generation(streamed: bool) -> None:
    engine = _CountingEngine(["tok "] * 200, delay=0.005)
    app = create_app(ResponsesService(engine))
    body = json.dumps({"input": "hi", "stream": streamed}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if messages:
            return messages.pop()
        await asyncio.sleep(0.05)  # the client hangs up while the model is still writing
        return {"type": "http.disconnect"}

    async def send(message: Any) -> None:
        pass

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/v1/responses",
        "query_string": b"",
        "headers": [(b"content-type", b"application/json")],
        "http_version": "1.1",
        "scheme": "http",
        "server": ("t", 80),
        "client": ("c", 1),
        "root_path": "",
    }
    asyncio.run(asyncio.wait_for(app(scope, receive, send), 5))
    assert 0 < engine.produced < 100, engine.produced


JSON_ANSWER = {"format": {"type": "json_object"}}


def test_a_json_answer_streams_as_written_even_with_tools() -> None:
    """Once the object's first key shows it is no call, it streams as the model writes it."""
    engine = ScriptedEngine(['{"summary": "', "light ", 'rain"}'])
    body = {"model": "m", "input": "x", "tools": [WEATHER], "stream": True, "text": JSON_ANSWER}
    report = validate_sse(_post(body, engine).text)
    assert report.ok, report.text()
    deltas = [e["delta"] for e in report.events if e["type"] == "response.output_text.delta"]
    assert deltas == ['{"summary": "', "light ", 'rain"}']


def test_with_a_json_text_format_the_reply_is_the_answer_or_one_call() -> None:
    engine = ScriptedEngine(['{"name": "get_weather", "arguments": {"location": "Paris"}}'])
    body = {"model": "m", "input": "x", "tools": [WEATHER], "text": JSON_ANSWER}
    output = _post(body, engine).json()["output"]
    assert [(i["type"], i.get("name")) for i in output] == [("function_call", "get_weather")]
    constraint = engine.plans[-1].constraint
    assert constraint is not None and not constraint.triggers
    assert "start: call | answer" in constraint.source
    assert _offered(engine) == ["get_weather"]


def test_right_after_a_tool_result_a_json_text_format_is_the_answer() -> None:
    engine = ScriptedEngine()
    items = [
        {"role": "user", "content": "weather?"},
        {"type": "function_call", "call_id": "c", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "sunny"},
    ]
    _post({"model": "m", "input": items, "tools": [WEATHER], "text": JSON_ANSWER}, engine)
    plan = engine.plans[-1]
    assert _offered(engine) == [] and plan.opening_ban == ()
    assert plan.constraint is not None and plan.constraint.param == "text.format.schema"
    assert "call" not in plan.constraint.source


def test_tools_sharing_a_name_are_told_apart_by_namespace() -> None:
    """Two MCP servers' `search`: the model sees `jira.search`, Codex gets name + namespace."""
    search = {
        "type": "function",
        "name": "search",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    }
    tools = [search, {"type": "namespace", "name": "jira", "tools": [search]}]
    for written, namespace in (("jira.search", "jira"), ("search", None)):
        engine = ScriptedEngine([f'{{"name": "{written}", "arguments": {{"q": "x"}}}}'])
        output = _post({"model": "m", "input": "x", "tools": tools}, engine).json()["output"]
        assert [(i["type"], i["name"], i.get("namespace")) for i in output] == [
            ("function_call", "search", namespace)
        ]
    offered = _offered(engine)
    assert offered == ["search", "jira.search"]


def _offered(engine: ScriptedEngine) -> list[str]:
    """The tools the template shows in the last request's prompt."""
    tools = engine.plans[-1].tools
    return [t.model_name for t in tools.offered] if tools.mode != "none" else []
