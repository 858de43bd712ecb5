"""MCP servers' tools run inside a response: real MCP servers (tests/mcp_server.py, from the
`mcp` package) on loopback, the scripted engine writing the model's calls. Every stream goes
through the validator."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from oars.generation import EngineRequest
from oars.http import create_app
from oars.mcp.config import McpConfig, OperatorServer
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.toolbox import ToolboxFactory
from oars.validator import validate_sse
from tests.conftest import McpProcess, normalize_ids, serving

GOLDEN = Path(__file__).parent.parent / "fixtures" / "golden"
WORD = "aubergine"
ANSWER = "The word is aubergine."


def _call(name: str, arguments: dict[str, Any]) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


OPEN = _call("vault__open_vault", {"code": "1234"})


def steps(*scripts: Sequence[object]) -> Callable[[EngineRequest], Sequence[object]]:
    """A script per generation: the n-th after n tool results (the last one after that)."""

    def script(request: EngineRequest) -> Sequence[object]:
        results = sum(m.role == "tool" for m in request.messages)
        return scripts[min(results, len(scripts) - 1)]

    return script


def mcp(server: McpProcess, **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "vault",
        "server_url": server.url,
        "require_approval": "never",
        **fields,
    }


@asynccontextmanager
async def _client(
    engine: ScriptedEngine,
    allow: Sequence[str] = ("http://127.0.0.1",),
    store: SqlStore | None = None,
    servers: Sequence[OperatorServer] = (),
    **limits: Any,
) -> AsyncIterator[httpx.AsyncClient]:
    config = McpConfig.of(servers, allow, **limits)
    service = ResponsesService(engine, toolboxes=ToolboxFactory(config))
    app = create_app(service, store)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
            yield client


def _post(engine: ScriptedEngine, body: dict[str, Any], **options: Any) -> httpx.Response:
    async def go() -> httpx.Response:
        async with _client(engine, **options) as client:
            return await client.post("/responses", json={"model": "m", **body}, timeout=60)

    return asyncio.run(go())


def _stream(engine: ScriptedEngine, body: dict[str, Any], **options: Any) -> list[dict[str, Any]]:
    r = _post(engine, {**body, "stream": True}, **options)
    assert r.status_code == 200, r.text
    report = validate_sse(r.text)
    assert report.ok, report.text()
    return report.events


def _shape(events: list[dict[str, Any]]) -> list[str]:
    """Event types, with the item's type for item events; text deltas once."""
    shape: list[str] = []
    for e in events:
        kind = e["type"].removeprefix("response.")
        if "item" in e:
            kind += " " + e["item"]["type"]
        if not shape or shape[-1] != kind or not kind.endswith(".delta"):
            shape.append(kind)
    return shape


def _output(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    output: list[dict[str, Any]] = events[-1]["response"]["output"]
    return output


MESSAGE = [
    "output_item.added message",
    "content_part.added",
    "output_text.delta",
    "output_text.done",
    "content_part.done",
    "output_item.done message",
]
LISTING = [
    "output_item.added mcp_list_tools",
    "mcp_list_tools.in_progress",
    "mcp_list_tools.completed",
    "output_item.done mcp_list_tools",
]
CALL = [
    "output_item.added mcp_call",
    "mcp_call.in_progress",
    "mcp_call_arguments.delta",
    "mcp_call_arguments.done",
    "mcp_call.completed",
    "output_item.done mcp_call",
]


# ---- the order of events, as OpenAI streams them (mcp.md §1.3) --------------------------------


def test_a_listing_streams_before_any_model_output(mcp_http: McpProcess) -> None:
    engine = ScriptedEngine(["Hi", "!"])
    events = _stream(engine, {"input": "hello", "tools": [mcp(mcp_http)]})
    assert _shape(events) == [
        "created",
        "in_progress",
        *LISTING,
        *MESSAGE,
        "completed",
    ]
    listing = _output(events)[0]
    assert listing["server_label"] == "vault" and "error" not in listing
    names = {t["name"]: t["annotations"] for t in listing["tools"]}
    assert names["add"] == {"read_only": True} and names["open_vault"] == {"read_only": False}
    offered = [t.model_name for t in engine.requests[0].tools.offered]
    assert "vault__open_vault" in offered and "vault__add" in offered


def test_a_call_runs_and_the_model_answers_from_its_result(mcp_http: McpProcess) -> None:
    engine = ScriptedEngine(steps([OPEN], [ANSWER]))
    events = _stream(engine, {"input": "What word is in the vault?", "tools": [mcp(mcp_http)]})
    assert _shape(events) == ["created", "in_progress", *LISTING, *CALL, *MESSAGE, "completed"]
    call = _output(events)[1]
    assert call == {
        **call,
        "status": "completed",
        "server_label": "vault",
        "name": "open_vault",
        "arguments": '{"code": "1234"}',
        "output": f"The word inside the vault is {WORD}.",
        "error": None,
        "approval_request_id": None,
    }
    added = next(
        e
        for e in events
        if e["type"] == "response.output_item.added" and e["item"]["type"] == "mcp_call"
    )
    assert added["item"]["arguments"] == "" and added["item"]["status"] == "in_progress"
    second = engine.requests[-1].messages
    assert second[-1].role == "tool" and WORD in second[-1].content
    assert second[-2].tool_calls[0]["function"]["name"] == "vault__open_vault"
    golden = GOLDEN / "mcp_call_then_text.json"
    got = normalize_ids(json.loads(json.dumps(events).replace(mcp_http.base, "<server_url>")))
    if os.environ.get("OARS_UPDATE_GOLDEN"):
        golden.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(golden.read_text())


def test_two_calls_in_one_response_each_seen_by_the_next_step(mcp_http: McpProcess) -> None:
    add = _call("vault__add", {"a": 2, "b": 3})
    echo = _call("vault__echo", {"text": "five"})
    engine = ScriptedEngine(steps([add], [echo], ["It is five."]))
    events = _stream(engine, {"input": "add 2 and 3", "tools": [mcp(mcp_http)]})
    assert _shape(events) == [
        "created",
        "in_progress",
        *LISTING,
        *CALL,
        *CALL,
        *MESSAGE,
        "completed",
    ]
    calls = [i for i in _output(events) if i["type"] == "mcp_call"]
    assert [(c["name"], c["output"]) for c in calls] == [("add", "5"), ("echo", "five")]
    assert len(engine.requests) == 3
    tool_results = [m.content for m in engine.requests[2].messages if m.role == "tool"]
    assert tool_results == ["5", "five"]
    usage = events[-1]["response"]["usage"]
    assert usage["output_tokens"] == 3  # one token a step, summed


def test_two_calls_written_in_one_step_run_in_order(mcp_http: McpProcess) -> None:
    both = [_call("vault__add", {"a": 1, "b": 1}), "\n", _call("vault__add", {"a": 2, "b": 2})]
    engine = ScriptedEngine(steps(both, ["2 and 4."]))
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http)]})
    assert _shape(events) == [
        "created",
        "in_progress",
        *LISTING,
        *CALL,
        *CALL,
        *MESSAGE,
        "completed",
    ]
    assert [i.get("output") for i in _output(events)[1:3]] == ["2", "4"]


def test_a_tool_error_is_a_failed_call_the_model_reads(mcp_http: McpProcess) -> None:
    wrong = _call("vault__open_vault", {"code": "0000"})
    engine = ScriptedEngine(steps([wrong], ["The code was wrong."]))
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http)]})
    failed = [*CALL[:4], "mcp_call.failed", "output_item.done mcp_call"]
    assert _shape(events) == ["created", "in_progress", *LISTING, *failed, *MESSAGE, "completed"]
    call = _output(events)[1]
    assert call["status"] == "failed" and call["output"] is None
    assert call["error"]["type"] == "mcp_tool_execution_error"
    assert "wrong code" in call["error"]["content"][0]["text"]
    assert "wrong code" in engine.requests[-1].messages[-1].content


def test_arguments_that_are_not_an_object_fail_the_call_not_the_response(
    mcp_http: McpProcess,
) -> None:
    not_an_object = '<tool_call>{"name": "vault__echo", "arguments": [1, 2]}</tool_call>'
    engine = ScriptedEngine(steps([not_an_object], ["Sorry."]))
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http)]})
    call = _output(events)[1]
    assert call["error"]["type"] == "mcp_protocol_error" and call["error"]["code"] == -32602
    assert events[-1]["type"] == "response.completed"


def test_a_listing_that_fails_is_a_424_before_anything_is_streamed() -> None:
    dead = McpProcess.unused_url()
    r = _post(ScriptedEngine(), {"input": "x", "tools": [{**mcp_at(dead)}]})
    assert r.status_code == 424, r.text
    error = r.json()["error"]
    assert error["type"] == "external_connector_error" and error["param"] == "tools[0].server_url"
    assert error["message"].startswith("Error retrieving tool list from MCP server: 'vault'")


def test_a_listing_that_fails_mid_stream_fails_the_response() -> None:
    dead = McpProcess.unused_url()
    events = _stream(ScriptedEngine(), {"input": "x", "tools": [mcp_at(dead)]})
    assert _shape(events) == [
        "created",
        "in_progress",
        "output_item.added mcp_list_tools",
        "mcp_list_tools.in_progress",
        "mcp_list_tools.failed",
        "output_item.done mcp_list_tools",
        "error",
        "failed",
    ]
    listing = _output(events)[0]
    assert listing["tools"] == [] and "could not connect" in listing["error"]


def test_a_server_that_answers_garbage_fails_its_listing(mcp_http: McpProcess) -> None:
    r = _post(ScriptedEngine(), {"input": "x", "tools": [mcp_at(f"{mcp_http.base}/garbage")]})
    assert r.status_code == 424, r.text


def test_a_server_that_dies_mid_call_is_a_failed_call_and_the_model_goes_on() -> None:
    server = McpProcess("streamable-http")
    try:
        engine = ScriptedEngine(steps([_call("vault__crash", {})], ["It broke."]))
        events = _stream(engine, {"input": "x", "tools": [mcp(server)]})
    finally:
        server.stop()
    call = _output(events)[1]
    assert call["status"] == "failed" and call["error"]["type"] in (
        "http_error",
        "mcp_protocol_error",
    )
    assert events[-1]["type"] == "response.completed"
    assert _output(events)[-1]["content"][0]["text"] == "It broke."


def test_a_call_that_takes_too_long_fails_with_a_timeout(mcp_http: McpProcess) -> None:
    engine = ScriptedEngine(steps([_call("vault__slow", {"seconds": 5})], ["Too slow."]))
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http)]}, call_seconds=0.5)
    call = _output(events)[1]
    assert call["error"] == {**call["error"], "type": "http_error", "code": 504}


# ---- what the model may call ---------------------------------------------------------------------


def test_allowed_tools_by_name_narrow_the_listing_and_what_is_offered(mcp_http: McpProcess) -> None:
    engine = ScriptedEngine(["Hi"])
    tool = mcp(mcp_http, allowed_tools=["add", "echo"])
    events = _stream(engine, {"input": "x", "tools": [tool]})
    assert [t["name"] for t in _output(events)[0]["tools"]] == ["add", "echo"]
    assert [t.model_name for t in engine.requests[0].tools.offered] == ["vault__add", "vault__echo"]


def test_allowed_tools_read_only_keeps_the_read_only_ones(mcp_http: McpProcess) -> None:
    engine = ScriptedEngine(["Hi"])
    tool = mcp(mcp_http, allowed_tools={"read_only": True})
    events = _stream(engine, {"input": "x", "tools": [tool]})
    assert sorted(t["name"] for t in _output(events)[0]["tools"]) == ["add", "echo"]


def test_a_call_to_a_tool_not_allowed_stays_text(mcp_http: McpProcess) -> None:
    engine = ScriptedEngine([OPEN])
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http, allowed_tools=["add"])]})
    assert [i["type"] for i in _output(events)] == ["mcp_list_tools", "message"]


def test_tool_choice_forces_the_servers_tool_then_lets_the_model_answer(
    mcp_http: McpProcess,
) -> None:
    engine = ScriptedEngine(steps([OPEN], [ANSWER]))
    body = {
        "input": "x",
        "tools": [mcp(mcp_http)],
        "tool_choice": {"type": "mcp", "server_label": "vault", "name": "open_vault"},
    }
    events = _stream(engine, body)
    first, second = engine.plans
    assert first.tools.mode == "required"
    assert [t.model_name for t in first.tools.callable] == ["vault__open_vault"]
    assert first.constraint is not None and not first.constraint.triggers
    assert second.tools.mode == "auto"
    assert _output(events)[-1]["content"][0]["text"] == ANSWER
    assert events[-1]["response"]["tool_choice"] == body["tool_choice"]


def test_tool_choice_naming_a_tool_the_server_lacks_fails_the_response(
    mcp_http: McpProcess,
) -> None:
    body = {
        "input": "x",
        "tools": [mcp(mcp_http)],
        "tool_choice": {"type": "mcp", "server_label": "vault", "name": "nope"},
    }
    r = _post(ScriptedEngine(), body)
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    r = _post(ScriptedEngine(), {**body, "tool_choice": {"type": "mcp", "server_label": "other"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice.server_label"


def test_max_tool_calls_drops_the_calls_past_it_and_the_model_answers(mcp_http: McpProcess) -> None:
    add = _call("vault__add", {"a": 1, "b": 1})
    engine = ScriptedEngine(steps([add, "\n", add], ["Done."]))
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http)], "max_tool_calls": 1})
    assert [i["type"] for i in _output(events)] == ["mcp_list_tools", "mcp_call", "message"]
    response = events[-1]["response"]
    assert response["status"] == "completed" and response["incomplete_details"] is None
    assert response["max_tool_calls"] == 1
    assert engine.plans[-1].tools.callable == ()  # the budget is spent: nothing to call


def test_the_last_step_the_cap_allows_offers_the_tools_without_calls(mcp_http: McpProcess) -> None:
    add = _call("vault__add", {"a": 1, "b": 1})
    engine = ScriptedEngine(steps([add], [add], [add], ["Enough."]))
    tools = [mcp(mcp_http)]
    events = _stream(engine, {"input": "x", "tools": tools}, max_rounds=3)
    assert [i["type"] for i in _output(events)].count("mcp_call") == 2
    assert engine.plans[-1].tools.callable == () and engine.plans[-1].tools.offered
    assert events[-1]["type"] == "response.completed"


def test_a_client_call_in_the_same_step_ends_the_response_after_it(mcp_http: McpProcess) -> None:
    weather = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    both = [_call("vault__add", {"a": 1, "b": 1}), "\n", _call("get_weather", {})]
    engine = ScriptedEngine(steps(both, ["never"]))
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http), weather]})
    assert [i["type"] for i in _output(events)] == ["mcp_list_tools", "mcp_call", "function_call"]
    assert len(engine.requests) == 1


def test_an_mcp_tool_beside_a_function_of_the_same_name(mcp_http: McpProcess) -> None:
    echo = {"type": "function", "name": "echo", "parameters": {"type": "object"}}
    engine = ScriptedEngine(steps([_call("vault__echo", {"text": "a"})], [_call("echo", {})]))
    events = _stream(engine, {"input": "x", "tools": [echo, mcp(mcp_http)]})
    assert [i["type"] for i in _output(events)] == ["mcp_list_tools", "mcp_call", "function_call"]
    assert _output(events)[-1]["name"] == "echo"


def mcp_at(url: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": "mcp",
        "server_label": "vault",
        "server_url": url,
        "require_approval": "never",
        **fields,
    }


# ---- approvals -----------------------------------------------------------------------------------


def _approval_flow(
    mcp_http: McpProcess, tmp_path: Path, second: Callable[[dict[str, Any]], dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], ScriptedEngine]:
    """Response 1 asks for approval (OpenAI's default); response 2 is `second(response 1)`."""
    engine = ScriptedEngine(steps([OPEN], [ANSWER]))
    tool = {k: v for k, v in mcp(mcp_http).items() if k != "require_approval"}
    store = SqlStore(f"sqlite:///{tmp_path}/oars.db")

    async def go() -> tuple[str, str]:
        async with _client(engine, store=store) as client:
            first = await client.post(
                "/responses",
                json={"model": "m", "input": "open it", "tools": [tool], "stream": True},
            )
            body = second(validate_sse(first.text).events[-1]["response"])
            then = await client.post(
                "/responses", json={"model": "m", "tools": [tool], **body, "stream": True}
            )
            return first.text, then.text

    texts = asyncio.run(go())
    reports = [validate_sse(t) for t in texts]
    assert all(r.ok for r in reports), [r.text() for r in reports]
    return reports[0].events, reports[1].events, engine


def _approve(response: dict[str, Any], approve: bool = True) -> dict[str, Any]:
    request = next(i for i in response["output"] if i["type"] == "mcp_approval_request")
    answer = {
        "type": "mcp_approval_response",
        "approval_request_id": request["id"],
        "approve": approve,
    }
    return {"previous_response_id": response["id"], "input": [answer]}


def test_a_call_waits_for_approval_and_runs_once_approved(
    mcp_http: McpProcess, tmp_path: Path
) -> None:
    first, second, engine = _approval_flow(mcp_http, tmp_path, _approve)
    assert _shape(first) == [
        "created",
        "in_progress",
        *LISTING,
        "output_item.added mcp_approval_request",
        "output_item.done mcp_approval_request",
        "completed",
    ]
    request = _output(first)[1]
    assert request == {**request, "name": "open_vault", "arguments": '{"code": "1234"}'}
    assert request["id"].startswith("mcpr_")
    # the approved call runs at once, before the model writes anything, with the listing reused
    assert _shape(second) == ["created", "in_progress", *CALL, *MESSAGE, "completed"]
    call = _output(second)[0]
    assert call["approval_request_id"] == request["id"] and WORD in call["output"]
    assert _output(second)[1]["content"][0]["text"] == ANSWER
    assert len(engine.requests) == 2  # no second generation of the call


def test_a_declined_call_never_runs_and_the_model_is_told(
    mcp_http: McpProcess, tmp_path: Path
) -> None:
    _, second, engine = _approval_flow(mcp_http, tmp_path, lambda r: _approve(r, False))
    assert [i["type"] for i in _output(second)] == ["message"]
    last = engine.requests[-1].messages
    assert last[-1].role == "tool" and "declined" in last[-1].content
    assert last[-2].tool_calls[0]["function"]["name"] == "vault__open_vault"


def test_an_approval_by_replayed_input_runs_the_call(mcp_http: McpProcess, tmp_path: Path) -> None:
    def replayed(response: dict[str, Any]) -> dict[str, Any]:
        answer = _approve(response)["input"]
        history = [{"role": "user", "content": "open it"}, *response["output"]]
        return {"input": [*history, *answer], "store": False}

    _, second, _ = _approval_flow(mcp_http, tmp_path, replayed)
    assert [i["type"] for i in _output(second)] == ["mcp_call", "message"]


def test_an_approval_by_item_reference_runs_the_call(mcp_http: McpProcess, tmp_path: Path) -> None:
    def referenced(response: dict[str, Any]) -> dict[str, Any]:
        answer = _approve(response)["input"]
        request = answer[0]["approval_request_id"]
        return {
            "input": [
                {"role": "user", "content": "open it"},
                {"type": "item_reference", "id": request},
                *answer,
            ]
        }

    _, second, _ = _approval_flow(mcp_http, tmp_path, referenced)
    assert [i["type"] for i in _output(second)] == ["mcp_list_tools", "mcp_call", "message"]


def test_an_approval_for_no_request_is_a_400(mcp_http: McpProcess) -> None:
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_x", "approve": True}
    question = {"role": "user", "content": "open it"}
    r = _post(ScriptedEngine(), {"input": [question, answer], "tools": [mcp(mcp_http)]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "input[1].approval_request_id"


def test_approval_filters_ask_only_for_the_tools_they_name(mcp_http: McpProcess) -> None:
    add = _call("vault__add", {"a": 1, "b": 2})
    engine = ScriptedEngine(steps([add], [OPEN], ["x"]))
    tool = mcp(mcp_http, require_approval={"never": {"read_only": True}})
    events = _stream(engine, {"input": "x", "tools": [tool]})
    assert [i["type"] for i in _output(events)] == [
        "mcp_list_tools",
        "mcp_call",
        "mcp_approval_request",
    ]


def test_a_listing_in_the_context_is_used_again_not_fetched(
    mcp_http: McpProcess, tmp_path: Path
) -> None:
    engine = ScriptedEngine(["Hi"])
    store = SqlStore(f"sqlite:///{tmp_path}/oars.db")

    async def go() -> list[dict[str, Any]]:
        async with _client(engine, store=store) as client:
            first = await client.post(
                "/responses", json={"model": "m", "input": "a", "tools": [mcp(mcp_http)]}
            )
            lists = mcp_http.stats()["methods"].get("tools/list", 0)
            second = await client.post(
                "/responses",
                json={
                    "model": "m",
                    "input": "b",
                    "tools": [mcp(mcp_http)],
                    "previous_response_id": first.json()["id"],
                },
            )
            assert mcp_http.stats()["methods"].get("tools/list", 0) == lists
            return [first.json(), second.json()]

    first, second = asyncio.run(go())
    assert [i["type"] for i in first["output"]] == ["mcp_list_tools", "message"]
    assert [i["type"] for i in second["output"]] == ["message"]
    assert [t.model_name for t in engine.requests[-1].tools.offered][:2] == [
        "vault__add",
        "vault__echo",
    ]


# ---- transports, and what is reached -------------------------------------------------------------


def test_a_server_over_sse(mcp_sse: McpProcess) -> None:
    engine = ScriptedEngine(steps([_call("vault__add", {"a": 4, "b": 4})], ["8"]))
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_sse)]})
    assert _output(events)[1]["output"] == "8"


def test_an_operator_server_over_stdio_is_named_by_its_label() -> None:
    vault = OperatorServer("vault", command=(os.sys.executable, "-m", "tests.mcp_server", "stdio"))  # type: ignore[attr-defined]
    engine = ScriptedEngine(steps([OPEN], [ANSWER]))
    tool = {"type": "mcp", "server_label": "vault", "require_approval": "never"}
    events = _stream(engine, {"input": "x", "tools": [tool]}, allow=(), servers=[vault])
    assert WORD in _output(events)[1]["output"]
    assert "server_url" not in events[-1]["response"]["tools"][0]


def test_a_request_may_not_reach_loopback_unless_the_operator_allows_it(
    mcp_http: McpProcess,
) -> None:
    r = _post(ScriptedEngine(), {"input": "x", "tools": [mcp(mcp_http)]}, allow=())
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "tools[0].server_url"
    for url in ("http://10.1.2.3/mcp", "http://169.254.169.254/latest", "http://[::1]:1/mcp"):
        r = _post(ScriptedEngine(), {"input": "x", "tools": [mcp_at(url)]}, allow=())
        assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].server_url", url
    other_port = f"http://127.0.0.1:{mcp_http.port}"
    r = _post(
        ScriptedEngine(), {"input": "x", "tools": [mcp(mcp_http)]}, allow=(other_port + "/other",)
    )
    assert r.status_code == 400


def test_the_token_and_headers_reach_the_server_and_nowhere_else(
    mcp_http: McpProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    engine = ScriptedEngine(steps([OPEN], [ANSWER]))
    store = SqlStore(f"sqlite:///{tmp_path}/oars.db")
    tool = mcp(mcp_http, authorization="s3cret-token", headers={"X-Test": "h3ader"})
    caplog.set_level("DEBUG")

    async def go() -> tuple[dict[str, Any], str]:
        async with _client(engine, store=store) as client:
            r = await client.post(
                "/responses", json={"model": "m", "input": "x", "tools": [tool], "stream": True}
            )
            final = validate_sse(r.text).events[-1]["response"]
            kept = await client.get(f"/responses/{final['id']}")
            items = await client.get(f"/responses/{final['id']}/input_items")
            return kept.json(), r.text + items.text

    kept, streamed = asyncio.run(go())
    assert mcp_http.stats()["headers"] == {
        "authorization": "Bearer s3cret-token",
        "x-test": "h3ader",
    }
    assert kept["tools"][0]["headers"] is None and "authorization" not in kept["tools"][0]
    with open(f"{tmp_path}/oars.db", "rb") as db:
        assert b"s3cret" not in db.read() and b"h3ader" not in streamed.encode()
    assert "s3cret" not in streamed and "s3cret" not in caplog.text


@pytest.mark.parametrize(
    ("field", "value"),
    [("connector_id", "connector_gmail"), ("tunnel_id", "t_1"), ("defer_loading", True)],
)
def test_what_this_server_cannot_do_is_a_400(field: str, value: Any) -> None:
    tool = {
        "type": "mcp",
        "server_label": "x",
        "server_url": "https://example.com/mcp",
        field: value,
    }
    r = _post(ScriptedEngine(), {"input": "x", "tools": [tool]})
    assert r.status_code == 400 and r.json()["error"]["param"] == f"tools[0].{field}"


@pytest.mark.parametrize(
    ("tool", "param"),
    [
        ({"server_label": "a b", "server_url": "https://e.com/"}, "tools[0].server_label"),
        ({"server_label": "a", "server_url": "ftp://e.com/"}, "tools[0].server_url"),
        (
            {"server_label": "a", "server_url": "https://e.com/", "require_approval": "x"},
            "tools[0].require_approval",
        ),
        (
            {"server_label": "a", "server_url": "https://e.com/", "allowed_tools": {"x": 1}},
            "tools[0].allowed_tools",
        ),
        (
            {"server_label": "a", "server_url": "https://e.com/", "headers": {"a": 1}},
            "tools[0].headers",
        ),
    ],
)
def test_a_malformed_mcp_tool_is_a_400_naming_its_field(tool: dict[str, Any], param: str) -> None:
    r = _post(ScriptedEngine(), {"input": "x", "tools": [{"type": "mcp", **tool}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text


def test_calls_are_counted_by_server_and_outcome(mcp_http: McpProcess) -> None:
    wrong = _call("vault__open_vault", {"code": "0"})
    engine = ScriptedEngine(steps([OPEN], [wrong], ["x"]))

    async def go() -> str:
        async with _client(engine) as client:
            await client.post(
                "/responses", json={"model": "m", "input": "x", "tools": [mcp(mcp_http)]}
            )
            return (await client.get("/../metrics")).text

    text = asyncio.run(go())
    where = mcp_http.base  # the URL's scheme, host and port: a path may hold a secret
    assert f'oars_mcp_calls_total{{outcome="completed",server="{where}"}} 1.0' in text
    assert f'oars_mcp_calls_total{{outcome="failed",server="{where}"}} 1.0' in text
    assert f'oars_mcp_call_duration_seconds_count{{server="{where}"}} 2.0' in text


# ---- everywhere a response runs --------------------------------------------------------------


def test_cancelling_a_background_response_stops_its_call(
    mcp_http: McpProcess, tmp_path: Path
) -> None:
    engine = ScriptedEngine(steps([_call("vault__slow", {"seconds": 60})], ["late"]))
    config = McpConfig.of(allow=["http://127.0.0.1"])
    service = ResponsesService(engine, toolboxes=ToolboxFactory(config))
    app = create_app(service, SqlStore(f"sqlite:///{tmp_path}/oars.db"))
    with serving(app) as base:
        body = {"model": "m", "input": "x", "tools": [mcp(mcp_http)], "background": True}
        run = httpx.post(f"{base}/v1/responses", json=body).json()
        with httpx.stream("GET", f"{base}/v1/responses/{run['id']}?stream=true", timeout=30) as r:
            for line in r.iter_lines():  # the call is running once its arguments are out
                if line == "event: response.mcp_call_arguments.done":
                    break
        started = time.monotonic()
        cancelled = httpx.post(f"{base}/v1/responses/{run['id']}/cancel", timeout=30).json()
        took = time.monotonic() - started
        replay = httpx.get(f"{base}/v1/responses/{run['id']}?stream=true", timeout=30).text
    assert cancelled["status"] == "cancelled" and took < 5
    last = cancelled["output"][-1]
    assert last == {**last, "type": "mcp_call", "status": "incomplete", "output": None}
    report = validate_sse(replay)
    assert report.ok, report.text()
    assert report.events[-1]["type"] == "response.cancelled"


def test_a_call_over_a_websocket(mcp_http: McpProcess) -> None:
    from starlette.testclient import TestClient

    engine = ScriptedEngine(steps([OPEN], [ANSWER]))
    config = McpConfig.of(allow=["http://127.0.0.1"])
    app = create_app(ResponsesService(engine, toolboxes=ToolboxFactory(config)))
    with TestClient(app) as client, client.websocket_connect("/v1/responses") as ws:
        create = {"type": "response.create", "model": "m", "input": "x", "tools": [mcp(mcp_http)]}
        ws.send_text(json.dumps(create))
        frames: list[dict[str, Any]] = []
        while not frames or frames[-1]["type"] not in ("response.completed", "response.failed"):
            frames.append(json.loads(ws.receive_text()))
        again = {
            **create,
            "input": "and again?",
            "previous_response_id": frames[-1]["response"]["id"],
        }
        ws.send_text(json.dumps(again))
        second: list[dict[str, Any]] = []
        while not second or second[-1]["type"] not in ("response.completed", "response.failed"):
            second.append(json.loads(ws.receive_text()))
    from oars.validator import validate_events

    for events in (frames, second):
        report = validate_events(events)
        assert report.ok, report.text()
    assert [i["type"] for i in _output(frames)] == ["mcp_list_tools", "mcp_call", "message"]
    # the socket's last response holds the listing: the continuation does not list again
    assert _output(second)[0]["type"] != "mcp_list_tools"


def test_gateway_mode_offers_the_tools_as_functions_and_runs_the_calls(
    mcp_http: McpProcess,
) -> None:
    from oars.engines.upstream import UpstreamConfig, UpstreamEngine
    from tests.upstream_replay import Replay, Scenario, text_stream

    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up"}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "vault__open_vault", "arguments": ""},
    }
    calling = Scenario(
        [
            chunk({"role": "assistant", "content": None, "tool_calls": [call]}),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"code": "1234"}'}}]}),
            chunk({}, "tool_calls"),
        ]
    )
    with Replay() as upstream:
        upstream.play(calling, text_stream([ANSWER]))
        engine = UpstreamEngine(UpstreamConfig("up", upstream.url))
        service = ResponsesService(
            engine,
            strict_models=True,
            toolboxes=ToolboxFactory(McpConfig.of(allow=["http://127.0.0.1"])),
        )
        app = create_app(service)

        async def go() -> str:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as c:
                    body = {"model": "up", "input": "x", "tools": [mcp(mcp_http)], "stream": True}
                    return (await c.post("/responses", json=body, timeout=30)).text

        report = validate_sse(asyncio.run(go()))
        sent = upstream.bodies
    assert report.ok, report.text()
    assert [i["type"] for i in _output(report.events)] == ["mcp_list_tools", "mcp_call", "message"]
    names = [t["function"]["name"] for t in sent[0]["tools"]]
    assert "vault__open_vault" in names
    replayed = sent[-1]["messages"]  # (the one between counted the first step's tokens)
    assert replayed[-2]["tool_calls"][0]["function"]["name"] == "vault__open_vault"
    assert replayed[-1]["role"] == "tool" and WORD in replayed[-1]["content"]


def test_a_compaction_summarizes_the_calls(mcp_http: McpProcess) -> None:
    from oars.compactor import INSTRUCTIONS
    from oars.sealing import Sealer

    history = [
        {"type": "message", "role": "user", "content": "What is in the vault?"},
        {"type": "mcp_list_tools", "id": "mcpl_1", "server_label": "vault", "tools": []},
        {
            "type": "mcp_call",
            "id": "mcp_1",
            "server_label": "vault",
            "name": "open_vault",
            "arguments": '{"code": "1234"}',
            "output": "The word is aubergine.",
            "error": None,
            "status": "completed",
        },
        {"type": "message", "role": "assistant", "content": "It is aubergine."},
    ]

    def script(request: EngineRequest) -> Sequence[object]:
        return ["Task: read the vault."] if request.messages[0].content == INSTRUCTIONS else ["ok"]

    engine = ScriptedEngine(script)
    config = McpConfig.of(allow=["http://127.0.0.1"])
    service = ResponsesService(
        engine, sealer=Sealer(b"1" * 43 + b"="), toolboxes=ToolboxFactory(config)
    )
    app = create_app(service)

    async def go() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as c:
                return await c.post("/responses/compact", json={"model": "m", "input": history})

    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    summary_prompt = engine.requests[0].messages[1].content
    assert 'vault.open_vault({"code": "1234"})' in summary_prompt and "aubergine" in summary_prompt
    assert r.json()["output"][-1]["type"] == "compaction"


def test_a_long_result_is_cut_to_what_the_model_may_read(mcp_http: McpProcess) -> None:
    engine = ScriptedEngine(steps([_call("vault__echo", {"text": "x" * 500})], ["ok"]))
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http)]}, max_output_chars=100)
    output = _output(events)[1]["output"]
    assert output.startswith("x" * 100) and output.endswith("[… 400 more characters left out]")
    assert engine.requests[-1].messages[-1].content == output


def test_a_dead_replica_s_log_is_closed_into_a_valid_stream_wherever_it_stopped(
    mcp_http: McpProcess,
) -> None:
    """Cut mid-listing, mid-call or after: the replayed builder ends the log as it would have
    (a listing that had not finished gets its `.failed`)."""
    from oars.events.orphan import orphan_ending
    from oars.normalize import normalize
    from oars.testing import run_to_end
    from oars.validator import validate_events

    engine = ScriptedEngine(steps([OPEN], [ANSWER]))
    toolboxes = ToolboxFactory(McpConfig.of(allow=["http://127.0.0.1"]))
    body = {"model": "m", "input": "x", "tools": [mcp(mcp_http)]}
    whole = run_to_end(
        ResponsesService(engine, toolboxes=toolboxes), normalize(body, served_model="m")
    )
    assert validate_events(whole).ok
    for cut in range(len(whole) - 1):
        logged = whole[:cut]
        ending, final = orphan_ending(logged, whole[0]["response"], streamed=True)
        report = validate_events(logged + ending)
        assert report.ok, (cut, report.text())
        assert final["status"] == "failed" and ending[-1]["response"] == final


def test_an_approval_without_its_mcp_tool_is_a_400(mcp_http: McpProcess) -> None:
    request = {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "server_label": "vault",
        "name": "open_vault",
        "arguments": "{}",
    }
    answer = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    r = _post(ScriptedEngine(), {"input": [{"role": "user", "content": "x"}, request, answer]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools", r.text


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"authorization": "s3cret\n"}, "tools[0].authorization"),
        ({"authorization": "s3 cret"}, "tools[0].authorization"),
        ({"headers": {"X-Team": "s3cret\r\nX-Other: 1"}}, "tools[0].headers.X-Team"),
        ({"headers": {"X Team": "a"}}, "tools[0].headers"),
    ],
)
def test_a_token_or_header_http_cannot_carry_is_a_400_that_does_not_repeat_it(
    mcp_http: McpProcess, fields: dict[str, Any], param: str
) -> None:
    r = _post(ScriptedEngine(), {"input": "x", "tools": [mcp(mcp_http, **fields)]})
    assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    assert "s3cret" not in r.text


def test_approving_twice_runs_the_call_once(mcp_http: McpProcess, tmp_path: Path) -> None:
    def twice(response: dict[str, Any]) -> dict[str, Any]:
        body = _approve(response)
        return {**body, "input": body["input"] * 2}

    _, second, _ = _approval_flow(mcp_http, tmp_path, twice)
    assert [i["type"] for i in _output(second)] == ["mcp_call", "message"]


def test_a_call_cut_after_one_that_ran_ends_the_response(mcp_http: McpProcess) -> None:
    ran = _call("vault__add", {"a": 1, "b": 1})
    engine = ScriptedEngine(
        steps([ran, '\n<tool_call>\n{"name": "vault__add", "arguments": {"a":'], ["x"])
    )
    events = _stream(engine, {"input": "x", "tools": [mcp(mcp_http)]})
    assert [(i["type"], i.get("status")) for i in _output(events)] == [
        ("mcp_list_tools", None),
        ("mcp_call", "completed"),
        ("mcp_call", "incomplete"),
    ]
    assert events[-1]["type"] == "response.failed" and len(engine.requests) == 1


def test_approval_and_allowed_tools_filters_match_every_criterion_they_give() -> None:
    from oars.mcp.servers import parse_server

    raw = {
        "server_label": "v",
        "server_url": "https://e.com/mcp",
        "allowed_tools": {"tool_names": ["add", "open"], "read_only": True},
        "require_approval": {"never": {"tool_names": ["add"], "read_only": True}},
    }
    server = parse_server(raw, "tools[0]", frozenset())
    assert server.allows("add", True) and not server.allows("open", False)
    assert not server.allows("echo", True)
    assert not server.needs_approval("add", True)
    assert server.needs_approval("add", False) and server.needs_approval("open", True)
    always = parse_server({**raw, "require_approval": None}, "tools[0]", frozenset())
    assert always.needs_approval("add", True)  # OpenAI's default


def test_what_the_guard_calls_public_and_what_an_allowed_prefix_covers() -> None:
    from oars.mcp.guard import Reach, is_public

    for address in ("93.184.216.34", "2606:4700::1111"):
        assert is_public(address), address
    for address in (
        "127.0.0.1",
        "10.0.0.1",
        "169.254.169.254",
        "::1",
        "fe80::1",
        "::ffff:127.0.0.1",
        "64:ff9b::7f00:1",
        "2002:7f00:1::1",
        "::7f00:1",
        "::ffff:0:7f00:1",
        "100.64.0.1",
        "0.0.0.0",
        "224.0.0.1",
    ):
        assert not is_public(address), address
    reach = Reach(["http://127.0.0.1:9000/mcp"])
    assert reach.trusted("http://127.0.0.1:9000/mcp") and reach.trusted(
        "http://127.0.0.1:9000/mcp/x"
    )
    for url in (
        "http://127.0.0.1:9000/mcpx",
        "http://127.0.0.1:9000/mcp/../admin",
        "http://127.0.0.1:9000/mcp/%2e%2e/admin",
        "http://127.0.0.1:9001/mcp",
        "https://127.0.0.1:9000/mcp",
        "http://127.0.0.1:9000@evil.example/mcp",
    ):
        assert not reach.trusted(url), url
    assert Reach(["http://127.0.0.1"]).trusted("http://127.0.0.1:1234/anything")


def test_a_name_that_resolves_to_loopback_is_refused(mcp_http: McpProcess) -> None:
    url = f"http://localhost:{mcp_http.port}/mcp"
    r = _post(ScriptedEngine(), {"input": "x", "tools": [mcp_at(url)]}, allow=())
    assert r.status_code == 400 and r.json()["error"]["param"] == "tools[0].server_url"


# ---- a deferred server: its tools found by this server's tool search ---------------------------

SEARCH_VAULT = _call("tool_search", {"query": "open the vault with its code"})


def test_a_deferred_servers_tool_is_found_by_the_tool_search_then_runs(
    mcp_http: McpProcess,
) -> None:
    engine = ScriptedEngine(steps([SEARCH_VAULT], [OPEN], [ANSWER]))
    tools = [mcp(mcp_http, defer_loading=True), {"type": "tool_search"}]
    events = _stream(engine, {"input": "What word is in the vault?", "tools": tools})
    first, second, *_ = engine.requests
    assert [t.name for t in first.tools.offered] == ["tool_search"]
    assert "vault" in first.tools.offered[0].description
    assert "vault__open_vault" in [t.model_name for t in second.tools.offered]
    assert second.messages[-1].content == "Tools loaded: vault__open_vault."
    listing, search, found, call, answer = _output(events)
    assert [t["name"] for t in listing["tools"]] == ["add", "echo", "open_vault", "slow", "crash"]
    assert search["type"] == "tool_search_call" and search["execution"] == "server"
    assert found["tools"][0] == {
        "type": "mcp",
        "server_label": "vault",
        "allowed_tools": ["open_vault"],
    }
    assert call["type"] == "mcp_call" and call["output"].endswith(f"{WORD}.")
    assert answer["content"][0]["text"] == ANSWER


def test_a_deferred_server_needs_this_servers_tool_search(mcp_http: McpProcess) -> None:
    for tools in (
        [mcp(mcp_http, defer_loading=True)],
        [mcp(mcp_http, defer_loading=True), {"type": "tool_search", "execution": "client"}],
    ):
        r = _post(ScriptedEngine(), {"input": "x", "tools": tools})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == "tools[0].defer_loading"


def test_a_deferred_servers_tool_found_earlier_in_the_chain_is_offered(
    mcp_http: McpProcess, tmp_path: Path
) -> None:
    engine = ScriptedEngine(steps([SEARCH_VAULT], [OPEN], [ANSWER]))
    tools = [mcp(mcp_http, defer_loading=True), {"type": "tool_search"}]

    async def go() -> None:
        async with _client(engine, store=SqlStore(f"sqlite:///{tmp_path}/o.db")) as client:
            body = {"model": "m", "input": "What word is in the vault?", "tools": tools}
            first = (await client.post("/responses", json=body, timeout=60)).json()
            assert first["status"] == "completed", first
            again = {**body, "input": "Again?", "previous_response_id": first["id"]}
            r = await client.post("/responses", json=again, timeout=60)
            assert r.status_code == 200, r.text
        offered = [t.model_name for t in engine.requests[-1].tools.offered]
        assert "vault__open_vault" in offered and "vault__add" not in offered

    asyncio.run(go())


def test_a_deferred_server_cannot_be_forced(mcp_http: McpProcess) -> None:
    tools = [mcp(mcp_http, defer_loading=True), {"type": "tool_search"}]
    choice = {"type": "mcp", "server_label": "vault"}
    r = _post(ScriptedEngine(), {"input": "x", "tools": tools, "tool_choice": choice})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice", r.text
