"""`web_search` run by this server: the model's calls become `web_search_call` items, what the
backend found goes back to the model, and its links to the results become `url_citation`s.

The backend is a real SearXNG-compatible JSON API on loopback (`oars.testing.search_backend`:
SearXNG itself is in no registry this project installs from), which also serves the page the
model opens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from oars.events import ResponseBuilder
from oars.events.replay import replay
from oars.generation import EngineRequest
from oars.http import create_app
from oars.mcp.config import McpConfig
from oars.parsing import Segment, SegmentKind
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import DOCS, OTHER, ScriptedEngine, search_backend
from oars.testing import base_url as _base
from oars.toolbox import ToolboxFactory
from oars.validator import validate_events, validate_sse
from oars.web_search import web_search


@pytest.fixture(scope="module")
def backend() -> Iterator[ThreadingHTTPServer]:
    with search_backend() as server:
        yield server


def _call(name: str, **arguments: str) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def _tool_text(request: EngineRequest) -> str:
    return "\n".join(m.content for m in request.messages if m.role == "tool")


def _searcher(answer: str | list[str], *calls: str) -> Callable[[EngineRequest], list[str]]:
    """Makes `calls` in turn, one a step, then answers with `answer` (its chunks)."""

    def script(request: EngineRequest) -> list[str]:
        done = sum(1 for m in request.messages if m.role == "tool")
        if done < len(calls):
            return [calls[done]]
        return [answer] if isinstance(answer, str) else answer

    return script


@asynccontextmanager
async def _client(
    engine: ScriptedEngine, server: ThreadingHTTPServer | None, fetch: bool = True
) -> AsyncIterator[httpx.AsyncClient]:
    web = None
    if server is not None:
        web = web_search(f"searxng={_base(server)}", allow=[_base(server)], fetch=fetch)
    toolboxes = ToolboxFactory(McpConfig(), web=web)
    app = create_app(ResponsesService(engine, toolboxes=toolboxes))
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as client:
            yield client


def _stream(
    engine: ScriptedEngine, server: ThreadingHTTPServer | None, body: dict[str, Any]
) -> Any:
    async def go() -> httpx.Response:
        async with _client(engine, server) as client:
            return await client.post("/responses", json={"model": "m", "stream": True, **body})

    r = asyncio.run(go())
    assert r.status_code == 200, r.text
    report = validate_sse(r.text)
    assert report.ok, report.text()
    return report


WEB = {"type": "web_search"}
CITED = "It is heron-42 ([Deploy code words](https://docs.example.org/deploys))."


def test_a_forced_search_is_an_item_the_model_reads_and_cites(
    backend: ThreadingHTTPServer,
) -> None:
    engine = ScriptedEngine(_searcher(CITED, _call("web_search", query="deploy code word")))
    body = {"input": "What is the deploy code word?", "tools": [WEB], "tool_choice": WEB}
    report = _stream(engine, backend, body)
    final = report.final
    assert [i["type"] for i in final["output"]] == ["web_search_call", "message"]
    call = final["output"][0]
    assert call["status"] == "completed"
    assert call["action"] == {
        "type": "search",
        "query": "deploy code word",
        "queries": ["deploy code word"],
    }
    assert "deploy code word" in backend.queries  # type: ignore[attr-defined]
    kinds = [e["type"] for e in report.events]
    at = kinds.index("response.web_search_call.in_progress")
    assert kinds[at - 1 : at + 4] == [
        "response.output_item.added",
        "response.web_search_call.in_progress",
        "response.web_search_call.searching",
        "response.web_search_call.completed",
        "response.output_item.done",
    ]
    # the model read the results: the snippet, the URL to cite
    read = _tool_text(engine.requests[-1])
    assert "heron-42" in read and DOCS in read
    # the link to a result is a citation over its span, in the stream and the final object
    text = final["output"][1]["content"][0]
    assert text["text"] == CITED
    start = CITED.index("[Deploy")
    cited = {
        "type": "url_citation",
        "start_index": start,
        "end_index": start + len(f"[Deploy code words]({DOCS})"),
        "title": "Deploy code words",
        "url": DOCS,
    }
    assert text["annotations"] == [cited]
    added = [e for e in report.events if e["type"] == "response.output_text.annotation.added"]
    assert [(e["annotation"], e["annotation_index"]) for e in added] == [(cited, 0)]


def test_sources_are_shown_only_when_included(backend: ThreadingHTTPServer) -> None:
    def run(include: list[str]) -> dict[str, Any]:
        engine = ScriptedEngine(_searcher("Done.", _call("web_search", query="herons")))
        body = {"input": "x", "tools": [WEB], "tool_choice": WEB, "include": include}
        call: dict[str, Any] = _stream(engine, backend, body).final["output"][0]
        return call

    assert "sources" not in run([])["action"]
    sources = run(["web_search_call.action.sources"])["action"]["sources"]
    assert sources == [{"type": "url", "url": DOCS}, {"type": "url", "url": OTHER}]


def test_allowed_domains_keep_other_results_from_the_model(backend: ThreadingHTTPServer) -> None:
    engine = ScriptedEngine(
        _searcher(f"See [Birds]({OTHER}).", _call("web_search", query="herons"))
    )
    tool = {**WEB, "filters": {"allowed_domains": ["example.org"]}}
    body = {
        "input": "x",
        "tools": [tool],
        "tool_choice": WEB,
        "include": ["web_search_call.action.sources"],
    }
    final = _stream(engine, backend, body).final
    assert final["output"][0]["action"]["sources"] == [{"type": "url", "url": DOCS}]
    read = _tool_text(engine.requests[-1])
    assert DOCS in read and OTHER not in read and "shallow" not in read
    # a link to what was filtered out is no citation
    assert final["output"][1]["content"][0]["annotations"] == []


def test_a_backend_that_fails_is_a_failed_call_the_model_reads(
    backend: ThreadingHTTPServer,
) -> None:
    engine = ScriptedEngine(_searcher("No luck.", _call("web_search", query="boom")))
    report = _stream(engine, backend, {"input": "x", "tools": [WEB], "tool_choice": WEB})
    final = report.final
    assert final["status"] == "completed"
    assert final["output"][0]["status"] == "failed"
    assert "response.web_search_call.completed" not in [e["type"] for e in report.events]
    assert _tool_text(engine.requests[-1]).startswith("Error:")


def test_a_page_is_opened_and_searched_in(backend: ThreadingHTTPServer) -> None:
    page = f"{_base(backend)}/pages/deploys"
    engine = ScriptedEngine(
        _searcher(
            "heron-42",
            _call("open_page", url=page),
            _call("find_in_page", url=page, pattern="autumn release"),
        )
    )
    body = {"input": "x", "tools": [WEB], "max_tool_calls": 2}
    final = _stream(engine, backend, body).final
    calls = [i for i in final["output"] if i["type"] == "web_search_call"]
    assert [c["action"] for c in calls] == [
        {"type": "open_page", "url": page},
        {"type": "find_in_page", "url": page, "pattern": "autumn release"},
    ]
    assert [c["status"] for c in calls] == ["completed", "completed"]
    opened, found = [m.content for m in engine.requests[-1].messages if m.role == "tool"]
    assert "Deploy words" in opened and "heron-42" in opened
    assert "heron-42" in found and "rivers" not in found


def test_without_external_web_access_no_page_is_offered(backend: ThreadingHTTPServer) -> None:
    engine = ScriptedEngine(["Fine."])
    _stream(engine, backend, {"input": "x", "tools": [{**WEB, "external_web_access": False}]})
    assert [t.model_name for t in engine.requests[0].tools.offered] == ["web_search"]


def test_a_server_that_opens_no_pages_offers_only_the_search(
    backend: ThreadingHTTPServer,
) -> None:
    engine = ScriptedEngine(["Fine."])

    async def go() -> httpx.Response:
        async with _client(engine, backend, fetch=False) as client:
            body = {"model": "m", "input": "x", "tools": [WEB]}
            return await client.post("/responses", json=body)

    assert asyncio.run(go()).status_code == 200
    assert [t.model_name for t in engine.requests[0].tools.offered] == ["web_search"]


def test_a_page_on_another_domain_is_not_opened(backend: ThreadingHTTPServer) -> None:
    page = f"{_base(backend)}/pages/deploys"
    engine = ScriptedEngine(_searcher("No.", _call("open_page", url=page)))
    tool = {**WEB, "filters": {"allowed_domains": ["example.org"]}}
    final = _stream(engine, backend, {"input": "x", "tools": [tool]}).final
    assert final["output"][0]["status"] == "failed"
    assert "not on a domain" in _tool_text(engine.requests[-1])


def test_forcing_a_search_without_a_backend_names_the_flag() -> None:
    async def go() -> httpx.Response:
        async with _client(ScriptedEngine(), None) as client:
            body = {"model": "m", "input": "x", "tools": [WEB], "tool_choice": WEB}
            return await client.post("/responses", json=body)

    r = asyncio.run(go())
    assert r.status_code == 400 and "--web-search" in r.json()["error"]["message"]


def test_a_search_in_the_history_renders_for_the_next_turn(backend: ThreadingHTTPServer) -> None:
    """A replayed `web_search_call` (pydantic-ai sends them back) is the call and what is
    known of it: the sources it shows."""
    item = {
        "type": "web_search_call",
        "id": "ws_1",
        "status": "completed",
        "action": {"type": "search", "query": "herons", "sources": [{"type": "url", "url": DOCS}]},
    }
    engine = ScriptedEngine(["Ok."])
    _stream(engine, backend, {"input": [item, {"role": "user", "content": "And?"}]})
    messages = engine.requests[0].messages
    call = next(m for m in messages if m.tool_calls)
    assert call.tool_calls[0]["function"]["name"] == "web_search"
    assert DOCS in _tool_text(engine.requests[0])


def test_a_link_split_across_deltas_is_cited_after_the_delta_that_ends_it(
    backend: ThreadingHTTPServer,
) -> None:
    chunks = ["See [Deploy", " code words](https://docs.exa", "mple.org/deploys) and [x](", "y)."]
    engine = ScriptedEngine(_searcher(chunks, _call("web_search", query="deploy")))
    report = _stream(engine, backend, {"input": "x", "tools": [WEB], "tool_choice": WEB})
    kinds = [e["type"] for e in report.events]
    at = kinds.index("response.output_text.annotation.added")
    assert report.events[at - 1]["delta"] == "mple.org/deploys) and [x]("
    assert kinds.count("response.output_text.annotation.added") == 1
    (annotation,) = report.final["output"][1]["content"][0]["annotations"]
    text = "".join(chunks)
    assert (
        text[annotation["start_index"] : annotation["end_index"]] == f"[Deploy code words]({DOCS})"
    )


def test_a_response_ended_by_another_replica_keeps_its_citations(
    backend: ThreadingHTTPServer,
) -> None:
    """The log read back (a replica died after the citation): the ending keeps the text's
    annotations as they were sent."""
    engine = ScriptedEngine(_searcher([CITED, " More."], _call("web_search", query="deploy")))
    report = _stream(engine, backend, {"input": "x", "tools": [WEB], "tool_choice": WEB})
    kinds = [e["type"] for e in report.events]
    cut = kinds.index("response.output_text.annotation.added") + 1
    logged = report.events[:cut]
    builder = replay(logged, logged[0]["response"])
    ending = builder.fail("The server running this response stopped.")
    resumed = validate_events([*logged, *ending])
    assert resumed.ok, resumed.text()
    message = ending[-1]["response"]["output"][1]
    assert (
        message["content"][0]["annotations"]
        == report.final["output"][1]["content"][0]["annotations"]
    )


def test_through_the_gateway_the_upstream_sees_only_functions(
    backend: ThreadingHTTPServer,
) -> None:
    """A gateway runs the search itself: its upstream is offered `web_search` as a function,
    its call runs here, and the results go back to it as the tool's answer."""
    from oars.engines.upstream import UpstreamConfig, UpstreamEngine
    from tests.upstream_replay import Replay, Scenario, text_stream

    base = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "up"}
    call = {
        "index": 0,
        "id": "call_1",
        "type": "function",
        "function": {"name": "web_search", "arguments": '{"query": "deploy code word"}'},
    }
    calling = Scenario(
        [
            {**base, "choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        ]
    )
    with Replay() as upstream:
        # the second request counts the first step's tokens; the third is the answer
        upstream.play(calling, text_stream(["-"]), text_stream([CITED]))
        engine = UpstreamEngine(UpstreamConfig("up", upstream.url))
        web = web_search(f"searxng={_base(backend)}")
        service = ResponsesService(
            engine, strict_models=True, toolboxes=ToolboxFactory(McpConfig(), web=web)
        )
        app = create_app(service)

        async def go() -> str:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://t/v1") as c:
                    body = {"model": "up", "input": "x", "tools": [WEB], "stream": True}
                    return (await c.post("/responses", json=body, timeout=30)).text

        report = validate_sse(asyncio.run(go()))
        sent = upstream.bodies
    assert report.ok, report.text()
    assert report.final is not None
    output = report.final["output"]
    assert [i["type"] for i in output] == ["web_search_call", "message"]
    assert output[1]["content"][0]["annotations"][0]["url"] == DOCS
    assert [t["function"]["name"] for t in sent[0]["tools"]] == [
        "web_search",
        "open_page",
        "find_in_page",
    ]
    replayed = sent[-1]["messages"]
    assert replayed[-1]["role"] == "tool" and "heron-42" in replayed[-1]["content"]


def test_over_a_websocket_and_in_the_background(
    backend: ThreadingHTTPServer, tmp_path: Path
) -> None:
    """The socket and a background run take the same path: the search runs, the answer cites."""
    from starlette.testclient import TestClient

    web = web_search(f"searxng={_base(backend)}")
    engine = ScriptedEngine(_searcher(CITED, _call("web_search", query="deploy")))
    service = ResponsesService(engine, toolboxes=ToolboxFactory(McpConfig(), web=web))
    store = SqlStore(str(tmp_path / "oars.db"))
    body = {"model": "m", "input": "x", "tools": [WEB], "tool_choice": WEB}
    with TestClient(create_app(service, store)) as client:
        with client.websocket_connect("/v1/responses") as ws:
            ws.send_text(json.dumps({"type": "response.create", "store": False, **body}))
            frames: list[dict[str, Any]] = []
            while not frames or frames[-1]["type"] != "response.completed":
                frames.append(json.loads(ws.receive_text()))
        started = client.post("/v1/responses", json={**body, "background": True}).json()
        while (done := client.get(f"/v1/responses/{started['id']}").json())["status"] in (
            "queued",
            "in_progress",
        ):
            time.sleep(0.05)
    report = validate_events(frames)
    assert report.ok, report.text()
    for final in (frames[-1]["response"], done):
        assert [i["type"] for i in final["output"]] == ["web_search_call", "message"]
        assert final["output"][1]["content"][0]["annotations"][0]["url"] == DOCS


def test_a_search_that_completed_before_its_replica_died_ends_completed(
    backend: ThreadingHTTPServer,
) -> None:
    """The log read back ends after `web_search_call.completed`: the ending closes the call as
    the stream said it ended, not `incomplete`."""
    engine = ScriptedEngine(_searcher("Done.", _call("web_search", query="deploy")))
    report = _stream(engine, backend, {"input": "x", "tools": [WEB], "tool_choice": WEB})
    kinds = [e["type"] for e in report.events]
    logged = report.events[: kinds.index("response.web_search_call.completed") + 1]
    ending = replay(logged, logged[0]["response"]).fail("The server running it stopped.")
    resumed = validate_events([*logged, *ending])
    assert resumed.ok, resumed.text()
    assert ending[-1]["response"]["output"][0]["status"] == "completed"


def test_a_url_that_is_not_one_is_a_failed_call_the_model_reads(
    backend: ThreadingHTTPServer,
) -> None:
    filtered = {**WEB, "filters": {"allowed_domains": ["example.org"]}}
    for tool in (WEB, filtered):
        engine = ScriptedEngine(_searcher("No.", _call("open_page", url="http://[::1")))
        final = _stream(engine, backend, {"input": "x", "tools": [tool]}).final
        assert final["status"] == "completed"
        assert final["output"][0]["status"] == "failed"
        assert _tool_text(engine.requests[-1]).startswith("Error:")


def _annotations(url: str, chunks: list[str]) -> list[Any]:
    """The annotations of `chunks` of text written after a search that found `url`."""
    builder = ResponseBuilder({}, model="m")
    builder.web_search_call({"type": "search", "query": "q", "queries": ["q"]})
    builder.web_search_done(failed=False, sources={url: "Deploy words"})
    for chunk in chunks:
        builder.add(Segment(SegmentKind.TEXT, chunk))
    annotations: list[Any] = builder.output[-1]["content"][0]["annotations"]
    return annotations


def test_a_link_is_cited_however_the_text_is_split() -> None:
    """A '[' inside the cited URL is no new link: written a character at a time, the text has
    the citation it has written at once."""
    url = "https://docs.example.org/deploys?part[1]=a"
    text = f"See [1] and [Deploy words]({url}) for it."
    whole = _annotations(url, [text])
    assert [a["url"] for a in whole] == [url]
    assert _annotations(url, list(text)) == whole


def test_a_call_with_a_number_json_cannot_read_is_a_failed_call(
    backend: ThreadingHTTPServer,
) -> None:
    """An integer of 5000 digits is past what Python's JSON reads (a ValueError, not a
    JSONDecodeError): the call has no arguments the server can use, and the response goes on."""
    huge = '{"name": "web_search", "arguments": {"query": "herons", "page": %s}}' % ("9" * 5000)
    engine = ScriptedEngine(_searcher("No.", f"<tool_call>\n{huge}\n</tool_call>"))
    final = _stream(engine, backend, {"input": "x", "tools": [WEB], "tool_choice": WEB}).final
    assert final["status"] == "completed"
    assert final["output"][0]["status"] == "failed"


def test_the_added_event_keeps_the_action_it_was_sent_with() -> None:
    """The sources come with the done item only: the added event, which a reader may take
    from the log after the search answered, still shows the action as it was then."""
    builder = ResponseBuilder({}, model="m", include_sources=True)
    added = builder.web_search_call({"type": "search", "query": "q", "queries": ["q"]})
    done = builder.web_search_done(failed=False, sources={DOCS: "Deploy words"})
    assert "sources" not in added[0]["item"]["action"]
    assert done[-1]["item"]["action"]["sources"] == [{"type": "url", "url": DOCS}]
