"""The operator's surface on the scripted engine: /metrics, request ids and JSON logs."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from oars import logs
from oars.http import create_app
from oars.service import ResponsesService
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from tests.conftest import serving


@asynccontextmanager
async def _client(
    engine: ScriptedEngine | None = None, store: SqlStore | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(ResponsesService(engine or ScriptedEngine()), store)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            yield client


def scrape(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape: (name, labels) → value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str, **labels: str
) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_move_by_what_the_requests_did() -> None:
    async def go() -> tuple[list[dict[str, Any]], str]:
        async with _client() as client:
            bodies = [
                (await client.post("/v1/responses", json={"model": "m", "input": text})).json()
                for text in ("hi", "say more words")
            ]
            streamed = await client.post(
                "/v1/responses", json={"model": "m", "input": "x", "stream": True}
            )
            assert streamed.status_code == 200
            assert (await client.post("/v1/responses", json={"model": "m"})).status_code == 400
            assert (await client.get("/nowhere/at/all")).status_code == 404
            return bodies, (await client.get("/metrics")).text

    bodies, text = asyncio.run(go())
    m = scrape(text)
    posted = {"method": "POST", "route": "/v1/responses"}
    assert value(m, "oars_requests_total", **posted, status="200") == 3
    assert value(m, "oars_requests_total", **posted, status="400") == 1
    assert value(m, "oars_requests_total", method="GET", route="other", status="404") == 1
    assert value(m, "oars_request_duration_seconds_count", **posted) == 4
    assert value(m, "oars_responses_total", model="scripted", status="completed") == 3
    inputs = sum(b["usage"]["input_tokens"] for b in bodies) + 2  # the streamed one: "user: x"
    assert value(m, "oars_tokens_total", model="scripted", kind="input") == inputs
    assert value(m, "oars_tokens_total", model="scripted", kind="output") == 9  # 3 × 3 tokens
    assert value(m, "oars_time_to_first_token_seconds_count", model="scripted") == 3
    assert value(m, "oars_inter_token_latency_seconds_count", model="scripted") == 6
    buckets = [
        v for (name, labels), v in m.items() if name == "oars_inter_token_latency_seconds_bucket"
    ]
    assert max(buckets) == 6  # cumulative: the +Inf bucket holds every gap
    assert value(m, "oars_generations_running", model="scripted") == 0


def test_a_running_generation_is_a_gauge_while_it_streams() -> None:
    engine = ScriptedEngine(script=["a"] * 40, delay=0.02)
    with serving(create_app(ResponsesService(engine))) as base:
        body = {"model": "m", "input": "x", "stream": True}
        with httpx.stream("POST", f"{base}/v1/responses", json=body) as r:
            lines = r.iter_lines()  # kept: a generator closed early would close the stream
            for line in lines:
                if "output_text.delta" in line:
                    break
            during = httpx.get(f"{base}/metrics").text
        deadline = time.monotonic() + 5
        while "cancelled" not in (after := httpx.get(f"{base}/metrics").text):
            assert time.monotonic() < deadline, after
            time.sleep(0.02)
    assert value(scrape(during), "oars_generations_running", model="scripted") == 1
    assert value(scrape(during), "oars_generations_queued", model="scripted") == 0
    assert value(scrape(after), "oars_generations_running", model="scripted") == 0
    assert value(scrape(after), "oars_responses_total", model="scripted", status="cancelled") == 1


def test_store_operations_are_timed(tmp_path: Path) -> None:
    async def go() -> str:
        async with _client(store=SqlStore(str(tmp_path / "oars.db"))) as client:
            r = await client.post(
                "/v1/responses", json={"model": "m", "input": "hi", "store": True}
            )
            assert (await client.get(f"/v1/responses/{r.json()['id']}")).status_code == 200
            return (await client.get("/metrics")).text

    m = scrape(asyncio.run(go()))
    # the response kept as it starts, then as it ends; the read
    assert value(m, "oars_store_duration_seconds_count", operation="write") == 2
    assert value(m, "oars_store_duration_seconds_count", operation="get") >= 1


def test_a_sane_client_request_id_is_kept_and_others_replaced() -> None:
    async def go() -> list[str]:
        async with _client() as client:
            ids = []
            for sent in ("trace-42.abc", "", "x" * 300, "bad id"):
                r = await client.get("/health", headers={"x-request-id": sent})
                ids.append(r.headers["x-request-id"])
            return ids

    kept, *replaced = asyncio.run(go())
    assert kept == "trace-42.abc"
    assert all(rid.startswith("req_") for rid in replaced)


def test_json_logs_carry_the_request_and_the_response(caplog: pytest.LogCaptureFixture) -> None:
    formatter = logs.JsonFormatter()
    caplog.handler.addFilter(logs._RequestIdFilter())

    async def go() -> dict[str, Any]:
        async with _client() as client:
            r = await client.post(
                "/v1/responses",
                json={"model": "m", "input": "hi"},
                headers={"x-request-id": "trace-7"},
            )
            return dict(r.json())

    with caplog.at_level(logging.INFO):
        body = asyncio.run(go())
    lines = [json.loads(formatter.format(record)) for record in caplog.records]
    ended = next(line for line in lines if line.get("response_id") == body["id"])
    assert ended["request_id"] == "trace-7" and ended["status"] == "completed"
    assert ended["model"] == "scripted" and ended["level"] == "info"
    assert ended["output_tokens"] == body["usage"]["output_tokens"] == 3
    assert ended["input_tokens"] == body["usage"]["input_tokens"]
    assert ended["ttft_ms"] >= 0 and ended["duration_ms"] >= ended["ttft_ms"]
    access = next(line for line in lines if line["logger"] == "oars.access")
    assert access["request_id"] == "trace-7" and access["status"] == 200
    assert access["method"] == "POST" and access["path"] == "/v1/responses"
    assert access["time"].endswith("Z")


def test_oars_serve_logs_json_lines(tmp_path: Path) -> None:
    """The real CLI, in gateway mode (no model needed): every line on stderr is a JSON object,
    uvicorn's own included, and a response's line carries the client's request id."""
    import subprocess
    import sys

    from tests.conftest import free_port
    from tests.upstream_replay import Replay, text_stream

    port = free_port()
    with Replay() as upstream:
        upstream.play(text_stream(["Hi", "!"]))
        cmd = [
            sys.executable,
            "-m",
            "oars.cli",
            "serve",
            "--upstream",
            f"up={upstream.url}",
            "--port",
            str(port),
            "--store",
            "none",
            "--log-format",
            "json",
        ]
        env = {**os.environ, "OARS_HOME": str(tmp_path)}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 30
            while True:
                try:
                    httpx.get(f"{base}/health", timeout=1)
                    break
                except httpx.TransportError:
                    assert time.monotonic() < deadline and proc.poll() is None
                    time.sleep(0.1)
            r = httpx.post(
                f"{base}/v1/responses",
                json={"model": "up", "input": "x"},
                headers={"x-request-id": "trace-json"},
                timeout=30,
            )
            assert r.status_code == 200 and r.headers["x-request-id"] == "trace-json"
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=20)
    lines = [json.loads(line) for line in err.decode().splitlines() if line.strip()]
    assert lines and all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert any(line["logger"].startswith("uvicorn") for line in lines)
    ended = next(line for line in lines if line.get("response_id") == r.json()["id"])
    assert ended["request_id"] == "trace-json" and ended["model"] == "up"
    assert ended["output_tokens"] == 2 and ended["status"] == "completed"
