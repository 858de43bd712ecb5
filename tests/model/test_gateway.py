"""Gateway mode against a real third-party server: llama-cpp-python's OpenAI server on loopback,
serving the default GGUF; `oars serve --upstreams …` in front of it. Every stream goes through
the validator; the real clients run once through the gateway; two replicas share PostgreSQL."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest

from oars.validator import validate_sse
from tests.conftest import new_database
from tests.model import test_clients, test_codex
from tests.model.conftest import MODEL, _serve, serve_gateway, stream, upstreams_file

pytestmark = pytest.mark.model

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Get the weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


def _events(report: Any) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = report.events
    return events


def test_models_lists_the_upstream_model(gateway: str) -> None:
    models = httpx.get(f"{gateway}/models").json()["data"]
    assert [(m["id"], m["owned_by"]) for m in models] == [(MODEL, "upstream")]
    r = httpx.post(f"{gateway}/responses", json={"model": "other", "input": "x"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"


def test_streamed_text_through_the_gateway(gateway: str) -> None:
    report = stream(
        gateway, {"model": MODEL, "input": "Say hello in three words.", "max_output_tokens": 16}
    )
    final = _events(report)[-1]["response"]
    assert final["status"] in ("completed", "incomplete")
    assert final["output"][0]["content"][0]["text"].strip()
    assert final["usage"]["input_tokens"] > 0 and final["usage"]["output_tokens"] > 0


def test_unstreamed_response_agrees_with_its_stored_copy(gateway: str) -> None:
    body = {"model": MODEL, "input": "Name one planet.", "max_output_tokens": 12}
    created = httpx.post(f"{gateway}/responses", json=body, timeout=300).json()
    assert created["status"] in ("completed", "incomplete"), created
    stored = httpx.get(f"{gateway}/responses/{created['id']}").json()
    assert stored["output"] == created["output"] and stored["model"] == MODEL


def test_a_tool_call_through_the_gateway(gateway: str) -> None:
    body = {
        "model": MODEL,
        "input": "What is the weather in Paris? Use the tool.",
        "tools": [WEATHER],
        "max_output_tokens": 60,
    }
    final = _events(stream(gateway, body))[-1]["response"]
    calls = [item for item in final["output"] if item["type"] == "function_call"]
    assert calls, final["output"]
    assert calls[0]["name"] == "get_weather"
    assert "paris" in json.loads(calls[0]["arguments"])["city"].lower()


def test_json_output_through_the_gateway(gateway: str) -> None:
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    }
    fmt = {"type": "json_schema", "name": "person", "schema": schema, "strict": True}
    body = {
        "model": MODEL,
        "input": "Invent a person.",
        "text": {"format": fmt},
        "max_output_tokens": 60,
    }
    final = _events(stream(gateway, body))[-1]["response"]
    person = json.loads(final["output"][0]["content"][0]["text"])
    assert isinstance(person["name"], str) and isinstance(person["age"], int)


def test_openai_sdk_through_the_gateway(gateway: str, closing: contextlib.ExitStack) -> None:
    from openai import OpenAI

    client = closing.enter_context(OpenAI(base_url=gateway, api_key="unused", max_retries=0))
    with client.responses.stream(model=MODEL, input="Say hi.", max_output_tokens=12) as s:
        text = "".join(e.delta for e in s if e.type == "response.output_text.delta")
        final = s.get_final_response()
    assert text and final.output_text == text
    chained = client.responses.create(
        model=MODEL, input="Again.", max_output_tokens=12, previous_response_id=final.id
    )
    assert chained.previous_response_id == final.id and chained.output_text


def test_agents_sdk_through_the_gateway(gateway: str) -> None:
    test_clients.test_openai_agents_tool_loop(gateway, guarded=False)


def test_codex_through_the_gateway(gateway: str, tmp_path: Path) -> None:
    test_codex.test_codex_text_turn(gateway, tmp_path)


@pytest.fixture(scope="module")
def spaced_gateway(tmp_path_factory: pytest.TempPathFactory, llama_upstream: str) -> Iterator[str]:
    """The gateway reading its upstream's stream at most every 50 ms (20 reads a second, one
    stream open), as it does under load."""
    yield from serve_gateway(tmp_path_factory, llama_upstream, "--upstream-reads", "20")


def test_reads_spaced_out_give_the_text_read_token_by_token(
    gateway: str, spaced_gateway: str
) -> None:
    """Each read of the upstream's stream waits 50 ms (its socket paused meanwhile): the text
    is the one read as it comes (after a first request that warms the upstream's prompt
    cache: a cold prompt can decode otherwise), and the deltas make it up. A read brings one
    token or a few; how many join varies from run to run (none to three of 19 tokens, none in
    3 runs of 11), so the fast tests pin the join itself."""
    body = {
        "model": MODEL,
        "input": "Write the numbers from one to twenty in words, separated by commas.",
        "max_output_tokens": 40,
    }
    every: list[list[str]] = []
    for server in (gateway, gateway, spaced_gateway):
        events = _events(stream(server, body))
        every.append([e["delta"] for e in events if e["type"] == "response.output_text.delta"])
        final = events[-1]["response"]
        assert final["output"][0]["content"][0]["text"] == "".join(every[-1])
    _, as_they_came, spaced = every
    assert "".join(spaced) == "".join(as_they_came)
    assert all(spaced) and len(spaced) <= len(as_they_came)
    assert final["usage"]["output_tokens"] >= 10, final["usage"]


# ---- two replicas, one PostgreSQL, one upstream ----------------------------------------------


@pytest.fixture(scope="module")
def replicas(
    tmp_path_factory: pytest.TempPathFactory, llama_upstream: str, postgres_server: str
) -> Iterator[tuple[str, str]]:
    folder = tmp_path_factory.mktemp("replicas")
    store = new_database(postgres_server)
    common = [
        "--upstreams",
        str(upstreams_file(folder, llama_upstream)),
        "--store",
        store,
        "--temperature",
        "0",
    ]
    a = cast(Generator[str, None, None], _serve(tmp_path_factory, *common, "--replica", "a"))
    b = cast(Generator[str, None, None], _serve(tmp_path_factory, *common, "--replica", "b"))
    try:
        yield next(a), next(b)
    finally:
        a.close()
        b.close()


def test_a_response_made_on_one_replica_is_read_chained_and_resumed_on_another(
    replicas: tuple[str, str],
) -> None:
    a, b = replicas
    body = {
        "model": MODEL,
        "input": "Count from one to ten in words.",
        "stream": True,
        "background": True,
        "max_output_tokens": 30,
    }
    seen: list[dict[str, Any]] = []
    with httpx.stream("POST", f"{a}/responses", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(json.loads(line[6:]))
            if any(e["type"] == "response.output_text.delta" for e in seen):
                break  # the client goes away; the background response runs on
    response_id = seen[0]["response"]["id"]
    last = seen[-1]["sequence_number"]
    resumed = httpx.get(
        f"{b}/responses/{response_id}",
        params={"stream": "true", "starting_after": last},
        timeout=300,
    )
    rest = [json.loads(x[6:]) for x in resumed.text.splitlines() if x.startswith("data: ")]
    assert rest and rest[0]["sequence_number"] == last + 1
    assert rest[-1]["type"] in ("response.completed", "response.incomplete")
    whole = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in seen + rest)
    report = validate_sse(whole)
    assert report.ok, report.text()
    stored = httpx.get(f"{b}/responses/{response_id}").json()
    assert stored["output"] == rest[-1]["response"]["output"]
    chained = httpx.post(
        f"{b}/responses",
        timeout=300,
        json={
            "model": MODEL,
            "input": "And the next number?",
            "previous_response_id": response_id,
            "max_output_tokens": 8,
        },
    )
    assert chained.status_code == 200, chained.text
    items = httpx.get(f"{a}/responses/{chained.json()['id']}/input_items").json()["data"]
    assert items[0]["content"][0]["text"] == "And the next number?"
