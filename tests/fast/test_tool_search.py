"""Deferred tools and a client's tool search: what is offered, the `tool_search_call` the model's
call becomes, and the tools a `tool_search_output` loads for the rest of the context (replayed
input, `previous_response_id`, conversations, item references and compaction alike)."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.testclient import TestClient

from oars.compactor import INSTRUCTIONS
from oars.generation import EngineRequest
from oars.http import common, create_app
from oars.mcp.config import McpConfig
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.tool_search import catalog, search
from oars.toolbox import ToolboxFactory
from oars.validator import validate_sse

CAPTURES = Path(__file__).parent.parent / "fixtures" / "captures"
KEY = b"2" * 43 + b"="
SEARCH = {"type": "tool_search", "execution": "client", "description": "Find tools."}
CALENDAR = {
    "type": "function",
    "name": "list_events",
    "description": "The calendar's events of a day.",
    "parameters": {"type": "object", "properties": {"day": {"type": "string"}}},
}
AGENTS = {
    "type": "namespace",
    "name": "multi_agent_v1",
    "description": "Tools for spawning and managing sub-agents.",
    "tools": [
        {
            "type": "function",
            "name": "spawn_agent",
            "description": "Start a sub-agent on a task.",
            "parameters": {
                "type": "object",
                "properties": {"task": {"type": "string"}},
                "required": ["task"],
            },
        }
    ],
}
SEARCH_CALL = (
    '<tool_call>\n{"name": "tool_search", "arguments": {"query": "sub-agents"}}\n</tool_call>'
)
SPAWN_CALL = '<tool_call>\n{"name": "spawn_agent", "arguments": {"task": "tests"}}\n</tool_call>'


def _offered(request: EngineRequest) -> list[str]:
    return [t.model_name for t in request.tools.offered]


def _agent(request: EngineRequest) -> list[str]:
    """Searches for tools until it has spawn_agent, then calls it, then answers."""
    if request.after_tool_output and "spawn_agent" in _offered(request):
        called = any(
            c["function"]["name"] == "spawn_agent" for m in request.messages for c in m.tool_calls
        )
        return ["Started."] if called else [SPAWN_CALL]
    return [SEARCH_CALL]


@asynccontextmanager
async def _client(
    engine: ScriptedEngine, store: SqlStore | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ResponsesService(engine, sealer=Sealer(KEY)), store)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
            yield client


def _run(test: Callable[[httpx.AsyncClient], Any], engine: ScriptedEngine, **kw: Any) -> None:
    async def go() -> None:
        async with _client(engine, **kw) as client:
            await test(client)

    asyncio.run(go())


async def _create(client: httpx.AsyncClient, body: dict[str, Any]) -> dict[str, Any]:
    r = await client.post("/responses", json={"model": "m", **body})
    assert r.status_code == 200, r.text
    response: dict[str, Any] = r.json()
    return response


def _output(call: dict[str, Any], tools: list[Any]) -> dict[str, Any]:
    return {
        "type": "tool_search_output",
        "call_id": call["call_id"],
        "execution": "client",
        "status": "completed",
        "tools": tools,
    }


def test_deferred_tools_are_declared_not_offered() -> None:
    engine = ScriptedEngine(["Hi."])

    async def test(client: httpx.AsyncClient) -> None:
        deferred = {**CALENDAR, "defer_loading": True}
        namespace = {**AGENTS, "tools": [{**AGENTS["tools"][0], "defer_loading": True}]}  # type: ignore[dict-item]
        response = await _create(client, {"input": "hi", "tools": [deferred, namespace, SEARCH]})
        assert _offered(engine.requests[-1]) == ["tool_search"]
        assert response["tools"][0]["defer_loading"] is True
        named = await client.post(
            "/responses",
            json={
                "model": "m",
                "input": "hi",
                "tools": [deferred, SEARCH],
                "tool_choice": {"type": "function", "name": "list_events"},
            },
        )
        assert named.status_code == 400 and named.json()["error"]["param"] == "tool_choice.name"

    _run(test, engine)


def test_a_codex_session_reaches_a_deferred_tool_in_two_turns() -> None:
    """Codex's own request (tool_search over deferred namespaces, web_search beside it), then
    its answer to the search with the tools it loaded, replayed as Codex sends it (no store)."""
    engine = ScriptedEngine(_agent)
    body = json.loads((CAPTURES / "codex_tool_search_01.json").read_text())["body"]

    async def test(client: httpx.AsyncClient) -> None:
        r = await client.post("/responses", json={**body, "stream": True})
        report = validate_sse(r.text)
        assert report.ok, report.text()
        offered = _offered(engine.requests[-1])
        assert "tool_search" in offered and "spawn_agent" not in offered
        assert report.final is not None
        (call,) = report.final["output"]
        assert call["type"] == "tool_search_call" and call["execution"] == "client"
        assert call["arguments"] == {"query": "sub-agents"} and call["status"] == "completed"
        replay = [*body["input"], call, _output(call, [AGENTS])]
        r = await client.post("/responses", json={**body, "input": replay, "stream": True})
        report = validate_sse(r.text)
        assert report.ok, report.text()
        assert "spawn_agent" in _offered(engine.requests[-1])
        assert engine.requests[-1].messages[-1].content == "Tools loaded: spawn_agent."
        assert report.final is not None
        (spawn,) = report.final["output"]
        assert spawn["type"] == "function_call" and spawn["name"] == "spawn_agent"
        assert spawn["namespace"] == "multi_agent_v1"

    _run(test, engine)


def test_loaded_tools_stay_offered_along_a_stored_chain(tmp_path: Path) -> None:
    engine = ScriptedEngine(_agent)

    async def test(client: httpx.AsyncClient) -> None:
        first = await _create(client, {"input": "Start an agent.", "tools": [SEARCH]})
        (call,) = first["output"]
        second = await _create(
            client,
            {
                "previous_response_id": first["id"],
                "input": [_output(call, [AGENTS])],
                "tools": [SEARCH],
            },
        )
        (spawn,) = second["output"]
        assert spawn["name"] == "spawn_agent"
        third = await _create(
            client,
            {
                "previous_response_id": second["id"],
                "input": [
                    {"type": "function_call_output", "call_id": spawn["call_id"], "output": "ok"}
                ],
                "tools": [SEARCH],
            },
        )
        assert "spawn_agent" in _offered(engine.requests[-1])
        assert third["output"][0]["content"][0]["text"] == "Started."
        items = await client.get(f"/responses/{second['id']}/input_items?order=asc")
        assert [i["type"] for i in items.json()["data"]][-1] == "tool_search_output"
        referenced = await _create(
            client,
            {
                "input": [
                    {"role": "user", "content": "Start an agent."},
                    {"type": "item_reference", "id": call["id"]},
                    {"type": "item_reference", "id": items.json()["data"][-1]["id"]},
                ],
                "tools": [SEARCH],
            },
        )
        assert referenced["output"][0]["name"] == "spawn_agent"

    _run(test, engine, store=SqlStore(f"sqlite:///{tmp_path}/oars.db"))


def test_loaded_tools_stay_offered_in_a_conversation(tmp_path: Path) -> None:
    engine = ScriptedEngine(_agent)

    async def test(client: httpx.AsyncClient) -> None:
        conversation = (await client.post("/conversations", json={})).json()["id"]
        first = await _create(
            client, {"conversation": conversation, "input": "Go.", "tools": [SEARCH]}
        )
        (call,) = first["output"]
        second = await _create(
            client,
            {
                "conversation": conversation,
                "input": [_output(call, [AGENTS])],
                "tools": [SEARCH],
            },
        )
        assert second["output"][0]["name"] == "spawn_agent"

    _run(test, engine, store=SqlStore(f"sqlite:///{tmp_path}/oars.db"))


def test_loaded_tools_survive_a_compaction() -> None:
    def script(request: EngineRequest) -> list[str]:
        if request.messages[0].content == INSTRUCTIONS:
            return ["The user wants an agent started; spawn_agent is loaded."]
        return _agent(request)

    engine = ScriptedEngine(script)

    async def test(client: httpx.AsyncClient) -> None:
        first = await _create(client, {"input": "Start an agent.", "tools": [SEARCH]})
        (call,) = first["output"]
        history = [
            {"role": "user", "content": "Start an agent."},
            call,
            _output(call, [AGENTS]),
            {"role": "assistant", "content": "Loaded."},
        ]
        r = await client.post("/responses/compact", json={"model": "m", "input": history})
        assert r.status_code == 200, r.text
        compacted = r.json()["output"]
        assert all(i["type"] != "tool_search_output" for i in compacted)
        after = await _create(
            client,
            {
                "input": [*compacted, {"role": "user", "content": "Now."}],
                "tools": [SEARCH],
            },
        )
        assert "spawn_agent" in _offered(engine.requests[-1])
        assert after["output"][0]["type"] == "tool_search_call"  # no tool output came last

    _run(test, engine)


def test_a_search_output_must_answer_a_search_and_hold_valid_tools(tmp_path: Path) -> None:
    engine = ScriptedEngine(_agent)

    async def test(client: httpx.AsyncClient) -> None:
        first = await _create(client, {"input": "Go.", "tools": [SEARCH]})
        (call,) = first["output"]
        cases = [
            (_output({"call_id": "call_never"}, [AGENTS]), "input[0].call_id"),
            (_output(call, [{"type": "function", "name": "bad name"}]), "input[0].tools[0].name"),
            (_output(call, [{"type": "code_interpreter", "container": "c"}]), "input[0].tools[0]"),
        ]
        for item, param in cases:
            body = {"model": "m", "previous_response_id": first["id"], "input": [item]}
            r = await client.post("/responses", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text

    _run(test, engine, store=SqlStore(f"sqlite:///{tmp_path}/oars.db"))


def test_web_search_is_counted_logged_once_and_never_forced(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Codex sends web_search with every request: each is counted, the first is logged."""
    engine = ScriptedEngine(["Hi."])
    web = {"type": "web_search", "external_web_access": True}
    app = create_app(ResponsesService(engine))
    common._TOLD.clear()  # said once a process: as if this were the first request
    with caplog.at_level(logging.WARNING, "oars.http"), TestClient(app) as client:
        for _ in range(2):
            r = client.post("/v1/responses", json={"model": "m", "input": "x", "tools": [web]})
            assert r.status_code == 200 and r.json()["tools"] == [web]
        forced = client.post(
            "/v1/responses",
            json={
                "model": "m",
                "input": "x",
                "tools": [web],
                "tool_choice": {"type": "web_search"},
            },
        )
        text = client.get("/metrics").text
    assert forced.status_code == 400 and "web search" in forced.json()["error"]["message"]
    assert 'oars_tools_ignored_total{type="web_search"} 2.0' in text
    told = [r for r in caplog.records if "web_search" in r.getMessage()]
    assert len(told) == 1, told


def test_tool_choice_may_name_a_tool_a_search_loaded(tmp_path: Path) -> None:
    engine = ScriptedEngine(_agent)

    async def test(client: httpx.AsyncClient) -> None:
        first = await _create(client, {"input": "Go.", "tools": [SEARCH]})
        (call,) = first["output"]
        chosen = {"type": "function", "name": "spawn_agent"}
        second = await _create(
            client,
            {
                "previous_response_id": first["id"],
                "input": [_output(call, [AGENTS])],
                "tools": [SEARCH],
                "tool_choice": chosen,
            },
        )
        assert [t.model_name for t in engine.requests[-1].tools.callable] == ["spawn_agent"]
        assert second["output"][0]["name"] == "spawn_agent"
        unloaded = await client.post(
            "/responses",
            json={"model": "m", "input": "Go.", "tools": [SEARCH], "tool_choice": chosen},
        )
        assert unloaded.status_code == 400
        assert unloaded.json()["error"]["param"] == "tool_choice.name"

    _run(test, engine, store=SqlStore(f"sqlite:///{tmp_path}/oars.db"))


# ---- this server's tool search ---------------------------------------------------------------

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather for a city.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    "defer_loading": True,
}
DEFERRED = [
    {**CALENDAR, "defer_loading": True},
    WEATHER,
    {**AGENTS, "tools": [{**AGENTS["tools"][0], "defer_loading": True}]},  # type: ignore[dict-item]
]
SERVER_SEARCH = {"type": "tool_search"}


def _server_searching(query: str) -> Callable[[EngineRequest], list[str]]:
    """Searches first; once a search loaded a tool, calls the first one loaded."""

    def script(request: EngineRequest) -> list[str]:
        if not request.after_tool_output:
            arguments = json.dumps({"query": query})
            return [
                f'<tool_call>\n{{"name": "tool_search", "arguments": {arguments}}}\n</tool_call>'
            ]
        loaded = [t.name for t in request.tools.offered if t.name != "tool_search"]
        if not loaded:
            return ["Nothing found."]
        return [f'<tool_call>\n{{"name": "{loaded[0]}", "arguments": {{}}}}\n</tool_call>']

    return script


def _service(engine: ScriptedEngine) -> ResponsesService:
    return ResponsesService(engine, toolboxes=ToolboxFactory(McpConfig()))


def test_this_servers_search_loads_the_best_deferred_tool_and_the_model_calls_it() -> None:
    engine = ScriptedEngine(_server_searching("what is on my calendar today"))
    app = create_app(_service(engine))
    body = {"model": "m", "input": "Today?", "tools": [*DEFERRED, SERVER_SEARCH], "stream": True}
    with TestClient(app) as client:
        report = validate_sse(client.post("/v1/responses", json=body).text)
    assert report.ok, report.text()
    first, second = engine.requests
    (search_tool,) = first.tools.offered
    assert search_tool.name == "tool_search" and "list_events" in search_tool.description
    assert report.final is not None
    call, output, chosen = report.final["output"]
    assert call["type"] == "tool_search_call" and call["execution"] == "server"
    assert call["arguments"] == {"query": "what is on my calendar today"}
    assert output["type"] == "tool_search_output" and output["call_id"] == call["call_id"]
    assert output["tools"][0]["name"] == "list_events"
    assert "list_events" in [t.name for t in second.tools.offered]
    assert second.messages[-1].content.startswith("Tools loaded: list_events")
    assert chosen["type"] == "function_call" and chosen["name"] == "list_events"
    assert report.events[-1]["type"] == "response.completed"


def test_a_namespace_member_is_loaded_within_its_namespace() -> None:
    engine = ScriptedEngine(_server_searching("start a sub-agent"))
    app = create_app(_service(engine))
    body = {"model": "m", "input": "Go.", "tools": [*DEFERRED, SERVER_SEARCH]}
    with TestClient(app) as client:
        response = client.post("/v1/responses", json=body).json()
    _, output, spawn = response["output"]
    (group, *_) = output["tools"]
    assert group["type"] == "namespace" and group["name"] == "multi_agent_v1"
    assert [t["name"] for t in group["tools"]] == ["spawn_agent"]
    assert spawn["name"] == "spawn_agent" and spawn["namespace"] == "multi_agent_v1"


def test_a_search_that_finds_nothing_loads_nothing_and_the_model_goes_on() -> None:
    engine = ScriptedEngine(_server_searching("quantum chromodynamics"))
    app = create_app(_service(engine))
    body = {"model": "m", "input": "Go.", "tools": [*DEFERRED, SERVER_SEARCH]}
    with TestClient(app) as client:
        response = client.post("/v1/responses", json=body).json()
    _, output, answer = response["output"]
    assert output["tools"] == [] and answer["content"][0]["text"] == "Nothing found."
    assert engine.requests[-1].messages[-1].content.startswith("No tools were found.")


def test_a_search_counts_against_max_tool_calls() -> None:
    engine = ScriptedEngine(_server_searching("weather in a city"))
    app = create_app(_service(engine))
    body = {
        "model": "m",
        "input": "Weather?",
        "tools": [*DEFERRED, SERVER_SEARCH],
        "max_tool_calls": 1,
    }
    with TestClient(app) as client:
        response = client.post("/v1/responses", json=body).json()
    types = [i["type"] for i in response["output"]]
    assert types[:2] == ["tool_search_call", "tool_search_output"]
    assert "tool_search" not in engine.requests[-1].tools.names  # the budget is spent


def test_a_server_search_replayed_as_input_keeps_its_tools() -> None:
    """The Agents SDK sends a response's output back as input (no store)."""
    engine = ScriptedEngine(_server_searching("weather in a city"))
    app = create_app(_service(engine))
    body = {"model": "m", "input": "Weather?", "tools": [*DEFERRED, SERVER_SEARCH]}
    with TestClient(app) as client:
        first = client.post("/v1/responses", json=body).json()
        call, output, weather = first["output"]
        answered = {"type": "function_call_output", "call_id": weather["call_id"], "output": "sun"}
        replay = ["Weather?", call, output, weather, answered]
        items = [{"role": "user", "content": replay[0]}, *replay[1:]]
        r = client.post("/v1/responses", json={**body, "input": items})
    assert r.status_code == 200, r.text
    assert "get_weather" in [t.name for t in engine.requests[-1].tools.offered]


def test_ranking_prefers_the_tool_whose_words_match() -> None:
    entries = catalog(DEFERRED)
    assert [e.tool["name"] for e in entries] == ["list_events", "get_weather", "spawn_agent"]
    assert [t["name"] for t in search(entries, "weather forecast for Paris", 5)] == ["get_weather"]
    assert search(entries, "calendar events of the day", 1)[0]["name"] == "list_events"
    assert search(entries, "", 5) == [] and search([], "weather", 5) == []


def test_additional_tools_items_add_tools_from_where_they_are() -> None:
    engine = ScriptedEngine(["Hi."])
    app = create_app(ResponsesService(engine))
    added = {"type": "additional_tools", "role": "developer", "tools": [CALENDAR]}
    with TestClient(app) as client:
        hi = {"role": "user", "content": "hi"}
        ok = client.post("/v1/responses", json={"model": "m", "input": [added, hi]})
        assert ok.status_code == 200, ok.text
        assert _offered(engine.requests[-1]) == ["list_events"]
        assert [m.content for m in engine.requests[-1].messages] == ["hi"]
        by_user = client.post(
            "/v1/responses", json={"model": "m", "input": [{**added, "role": "user"}, hi]}
        )
    assert by_user.status_code == 400 and by_user.json()["error"]["param"] == "input[0].role"


def test_a_required_call_is_still_required_after_a_search() -> None:
    """`tool_choice: required` asks for a call of a tool, which a search only finds: the step
    after it must call one of what the search loaded."""
    engine = ScriptedEngine(_server_searching("weather in a city"))
    app = create_app(_service(engine))
    body = {"model": "m", "input": "Weather?", "tools": [*DEFERRED, SERVER_SEARCH]}
    with TestClient(app) as client:
        client.post("/v1/responses", json={**body, "tool_choice": "required"})
        after_search = engine.requests[-1].tools
        assert after_search.mode == "required" and after_search.names == {"get_weather"}
        client.post("/v1/responses", json=body)
        assert engine.requests[-1].tools.mode == "auto"


def _calling(*calls: str) -> Callable[[EngineRequest], list[str]]:
    """Writes the n-th of `calls` after n tool results, then answers."""

    def script(request: EngineRequest) -> list[str]:
        results = sum(m.role == "tool" for m in request.messages)
        return [calls[results]] if results < len(calls) else ["Done."]

    return script


def _tool_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


def test_a_loaded_member_named_like_an_offered_tool_is_offered_by_its_namespace() -> None:
    plain = {"type": "function", "name": "spawn_agent", "parameters": {"type": "object"}}
    engine = ScriptedEngine(
        _calling(
            _tool_call("tool_search", '{"query": "start a sub-agent on a task"}'),
            _tool_call("multi_agent_v1.spawn_agent", '{"task": "x"}'),
        )
    )
    body = {"model": "m", "input": "Go.", "tools": [plain, DEFERRED[2], SERVER_SEARCH]}
    with TestClient(create_app(_service(engine))) as client:
        response = client.post("/v1/responses", json=body).json()
    offered = [t.model_name for t in engine.requests[-1].tools.offered]
    assert offered == ["spawn_agent", "tool_search", "multi_agent_v1.spawn_agent"]
    call = response["output"][-1]
    assert (call["name"], call["namespace"]) == ("spawn_agent", "multi_agent_v1")


def test_a_limit_the_model_writes_out_of_range_is_the_default() -> None:
    engine = ScriptedEngine(
        _calling(_tool_call("tool_search", '{"query": "weather", "limit": 1e999}'))
    )
    body = {"model": "m", "input": "Go.", "tools": [*DEFERRED, SERVER_SEARCH]}
    with TestClient(create_app(_service(engine))) as client:
        r = client.post("/v1/responses", json=body)
    assert r.status_code == 200 and r.json()["status"] == "completed", r.text
    assert r.json()["output"][1]["tools"][0]["name"] == "get_weather"


def test_a_required_call_after_a_search_that_found_nothing_may_be_an_answer() -> None:
    engine = ScriptedEngine(_calling(_tool_call("tool_search", '{"query": "quantum"}')))
    body = {"model": "m", "input": "Go.", "tools": [*DEFERRED, SERVER_SEARCH]}
    with TestClient(create_app(_service(engine))) as client:
        r = client.post("/v1/responses", json={**body, "tool_choice": "required"})
    assert len(engine.requests) == 2 and engine.requests[-1].tools.mode == "auto"
    assert r.json()["output"][-1]["content"][0]["text"] == "Done."


def test_two_tools_of_one_name_are_a_400_and_loaded_twice_are_offered_once() -> None:
    engine = ScriptedEngine(["Hi."])
    named = {"type": "function", "name": "tool_search", "parameters": {"type": "object"}}
    with TestClient(create_app(ResponsesService(engine))) as client:
        for tools in ([named, SEARCH], [{**named, "name": "shell"}, {"type": "shell"}]):
            r = client.post("/v1/responses", json={"model": "m", "input": "x", "tools": tools})
            assert r.status_code == 400 and r.json()["error"]["code"] == "duplicate_tool_name"
        twice = {"type": "additional_tools", "role": "developer", "tools": [CALENDAR, CALENDAR]}
        hi = {"role": "user", "content": "hi"}
        r = client.post("/v1/responses", json={"model": "m", "input": [twice, hi]})
    assert r.status_code == 200, r.text
    assert _offered(engine.requests[-1]) == ["list_events"]
