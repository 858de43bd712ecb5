"""`oars check` passes on a correct server and names the rule a broken stream breaks."""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from oars.check import Checker, table
from oars.events.builder import Event
from oars.http.sse import encode
from oars.normalize import normalize
from oars.service import ResponsesService
from oars.testing import ScriptedEngine, run_to_end


def _events(body: dict[str, Any]) -> list[Event]:
    script = (
        ['{"name": "get_weather", "arguments": {"location": "Paris"}}']
        if body.get("tool_choice", "") not in ("", "auto")
        else ["word "] * 20
    )
    service = ResponsesService(ScriptedEngine(script))
    return run_to_end(service, normalize(body, served_model="m"))


def _transport(breaker: Callable[[list[Event]], list[Event]]) -> httpx.MockTransport:
    """A server made of the scripted engine; `breaker` corrupts each stream it sends."""

    def handle(request: httpx.Request) -> httpx.Response:
        try:
            body = json.loads(request.content)
        except json.JSONDecodeError:
            return httpx.Response(400, json={"error": {"message": "bad json", "type": "x"}})
        app_error = _app_error(body)
        if app_error is not None:
            return app_error
        events = _events(body)
        if not body.get("stream"):
            return httpx.Response(200, json=events[-1]["response"])
        text = "".join(encode(e).decode() for e in breaker(copy.deepcopy(events)))
        return httpx.Response(200, text=text, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handle)


def _app_error(body: dict[str, Any]) -> httpx.Response | None:
    from oars.errors import ClientError
    from oars.turn import Turn

    try:
        asyncio.run(Turn.open(normalize(body, served_model="m"), None))
    except ClientError as exc:
        return httpx.Response(exc.status, json=exc.body())
    return None


def _run(breaker: Callable[[list[Event]], list[Event]]) -> dict[str, Any]:
    with httpx.Client(transport=_transport(breaker)) as client:
        results = Checker(client, "http://test/v1", "m").run()
    return {r.name: r for r in results}


def _renumber(events: list[Event]) -> list[Event]:
    for i, e in enumerate(events):
        e["sequence_number"] = i
    return events


def drift_content_index(ev: list[Event]) -> list[Event]:
    for n, e in enumerate(x for x in ev if x["type"] == "response.output_text.delta"):
        e["content_index"] = n
    return ev


def drop_item_done(ev: list[Event]) -> list[Event]:
    return _renumber([e for e in ev if e["type"] != "response.output_item.done"])


def change_id(ev: list[Event]) -> list[Event]:
    done = next(e for e in ev if e["type"] == "response.output_item.done")
    done["item"]["id"] = "msg_changed"
    return ev


def no_terminal(ev: list[Event]) -> list[Event]:
    return ev[:-1]


def truncation_as_success(ev: list[Event]) -> list[Event]:
    """What vLLM and llama.cpp do: the cut reply ends as `response.completed`, items `completed`."""
    for e in ev:
        for item in [e.get("item"), *((e.get("response") or {}).get("output") or [])]:
            if item and item.get("status") == "incomplete":
                item["status"] = "completed"
    terminal = ev[-1]
    if terminal["type"] == "response.incomplete":
        terminal["type"] = "response.completed"
        terminal["response"].update(status="completed", incomplete_details=None)
    return ev


def test_correct_server_passes() -> None:
    results = _run(lambda ev: ev)
    failed = {n: r.detail for n, r in results.items() if r.status == "failed"}
    assert not failed
    assert results["previous-response-id"].status == "skipped"
    assert table(list(results.values())).splitlines()[-1] == "10 passed, 0 failed"


def test_truncation_reported_as_success_fails_i10() -> None:
    results = _run(truncation_as_success)
    truncation = results["truncation"]
    assert truncation.status == "failed" and truncation.rule == "I10", truncation
    assert "expected response.incomplete" in truncation.detail


@pytest.mark.parametrize(
    ("breaker", "rule"),
    [(drift_content_index, "I5"), (drop_item_done, "I8"), (change_id, "I6"), (no_terminal, "I2")],
    ids=lambda x: getattr(x, "__name__", x),
)
def test_broken_stream_fails_naming_the_rule(
    breaker: Callable[[list[Event]], list[Event]], rule: str
) -> None:
    results = _run(breaker)
    streaming = results["streaming"]
    assert streaming.status == "failed" and streaming.rule == rule, streaming
    assert "failed" in table(list(results.values())).splitlines()[-1]
