"""Server limits: the output-token cap, concurrent responses per key (429 + Retry-After), a
generation's wall time, and a body that arrives too slowly."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import httpx

from oars.http import create_app
from oars.service import ResponsesService
from oars.settings import Limits, ServerSettings
from oars.testing import ScriptedEngine
from oars.validator import validate_sse

KEY_A, KEY_B = {"authorization": "Bearer a"}, {"authorization": "Bearer b"}


async def _with(limits: Limits, engine: ScriptedEngine, body: Any) -> Any:
    app = create_app(
        ResponsesService(engine), settings=ServerSettings(api_keys=("a", "b"), limits=limits)
    )
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as c:
        return await body(c)


def test_the_output_cap_refuses_more_and_limits_requests_that_ask_none() -> None:
    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        more = await c.post(
            "/v1/responses",
            headers=KEY_A,
            json={"model": "m", "input": "x", "max_output_tokens": 100},
        )
        none = await c.post("/v1/responses", headers=KEY_A, json={"model": "m", "input": "x"})
        return more, none

    more, none = asyncio.run(_with(Limits(max_output_tokens=5), ScriptedEngine(["a "] * 40), body))
    assert more.status_code == 400 and more.json()["error"]["param"] == "max_output_tokens"
    assert none.json()["status"] == "incomplete" and none.json()["usage"]["output_tokens"] == 5


def test_past_its_concurrent_responses_a_key_gets_a_429_and_nothing_accepted_is_lost() -> None:
    engine = ScriptedEngine(["a "] * 100, delay=0.01)

    async def body(c: httpx.AsyncClient) -> dict[str, Any]:
        post = {"model": "m", "input": "x", "stream": True}
        first = asyncio.create_task(c.post("/v1/responses", headers=KEY_A, json=post))
        while (await c.get("/health")).json()["running"] == 0:  # until the first has begun
            await asyncio.sleep(0.01)
        second = await c.post("/v1/responses", headers=KEY_A, json=post)
        other = await c.post("/v1/responses", headers=KEY_B, json=post)
        done = await first
        again = await c.post("/v1/responses", headers=KEY_A, json={**post, "stream": False})
        return {"first": done, "second": second, "other": other, "again": again}

    r = asyncio.run(_with(Limits(concurrent_per_key=1), engine, body))
    assert r["second"].status_code == 429 and r["second"].headers["retry-after"] == "1"
    error = r["second"].json()["error"]
    assert error["type"] == "rate_limit_error" and error["code"] == "rate_limit_exceeded"
    for name in ("first", "other"):
        report = validate_sse(r[name].text)
        assert report.ok and report.final is not None and report.final["status"] == "completed"
    assert r["again"].json()["status"] == "completed"


def test_a_generation_past_the_request_timeout_fails_cleanly() -> None:
    engine = ScriptedEngine(["a "] * 200, delay=0.01)

    async def body(c: httpx.AsyncClient) -> tuple[httpx.Response, httpx.Response]:
        post = {"model": "m", "input": "x"}
        plain = await c.post("/v1/responses", headers=KEY_A, json=post)
        streamed = await c.post("/v1/responses", headers=KEY_A, json={**post, "stream": True})
        return plain, streamed

    plain, streamed = asyncio.run(_with(Limits(request_timeout=0.2), engine, body))
    assert plain.status_code == 500 and "longer than" in plain.json()["error"]["message"]
    report = validate_sse(streamed.text)
    assert report.ok, report.text()
    assert report.final is not None and report.final["status"] == "failed"
    assert report.final["error"]["code"] == "server_error"  # the SDK's closed set of codes
    error = next(e for e in report.events if e["type"] == "error")
    assert error["code"] == "request_timeout" and "0.2 s" in error["message"]


def test_a_body_that_arrives_too_slowly_is_a_408() -> None:
    async def slow() -> AsyncIterator[bytes]:
        yield b'{"model": "m", '
        await asyncio.sleep(1)
        yield b'"input": "x"}'

    async def body(c: httpx.AsyncClient) -> httpx.Response:
        return await c.post("/v1/responses", headers=KEY_A, content=slow())

    r = asyncio.run(_with(Limits(body_seconds=0.2), ScriptedEngine(), body))
    assert r.status_code == 408 and r.json()["error"]["code"] == "request_timeout"


def test_a_silent_stream_gets_keep_alive_comments_and_stays_valid() -> None:
    """A long prefill is silent: past `keepalive_seconds` without an event, the stream gets an
    SSE comment, which clients skip."""
    engine = ScriptedEngine(["slow", " answer"], delay=0.5)
    limits = Limits(keepalive_seconds=0.15)
    app = create_app(ResponsesService(engine), settings=ServerSettings(limits=limits))

    async def go() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t", timeout=30) as c:
            body = {"model": "m", "input": "x", "stream": True}
            r = await c.post("/v1/responses", json=body)
            return r.text

    text = asyncio.run(go())
    assert text.count(": keep-alive\n\n") >= 4
    report = validate_sse(text)
    assert report.ok, report.violations
    assert '"text":"slow answer"' in text
