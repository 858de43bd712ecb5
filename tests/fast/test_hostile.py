"""Hostile input, class by class: each is a 4xx naming the parameter, never a 500 or a hang."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from oars.http import create_app
from oars.normalize import MAX_INPUT_ITEMS, MAX_TOOLS
from oars.service import ResponsesService
from oars.settings import Limits, ServerSettings
from oars.store import SqlStore
from oars.testing import ScriptedEngine
from oars.tools import MAX_GRAMMAR

LONE = "\\ud800"  # as it appears in the raw JSON
FN = {"type": "function", "name": "f", "parameters": {"type": "object"}}


def _send(
    raw: bytes,
    path: str = "/v1/responses",
    *,
    max_body_bytes: int = 2**20,
    store: SqlStore | None = None,
) -> httpx.Response:
    app = create_app(
        ResponsesService(ScriptedEngine()),
        store,
        settings=ServerSettings(limits=Limits(max_body_bytes=max_body_bytes)),
    )

    async def go() -> httpx.Response:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
                return await asyncio.wait_for(
                    client.post(path, content=raw, headers={"content-type": "application/json"}), 10
                )

    return asyncio.run(go())


def _error(r: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert r.status_code == status, r.text[:300]
    error: dict[str, Any] = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    return error


# Every string field of a create body, with the lone surrogate where `@` is.
SURROGATE_FIELDS = [
    ('{"model": "m", "input": "a@b"}', "input"),
    ('{"model": "m", "input": "x", "instructions": "@"}', "instructions"),
    ('{"model": "m@", "input": "x"}', "model"),
    ('{"model": "m", "input": "x", "user": "@"}', "user"),
    ('{"model": "m", "input": "x", "metadata": {"@": "v"}}', "metadata"),
    ('{"model": "m", "input": "x", "metadata": {"k": "@"}}', "metadata.k"),
    (
        '{"model": "m", "input": "x", "tools": [{"type": "function", "name": "f@"}]}',
        "tools[0].name",
    ),
    (
        '{"model": "m", "input": "x", "tools": [{"type": "function", "name": "f", '
        '"description": "@"}]}',
        "tools[0].description",
    ),
    (
        '{"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", '
        '"text": "@"}]}]}',
        "input[0].content[0].text",
    ),
    ('{"model": "m", "input": "x", "previous_response_id": "resp_@"}', "previous_response_id"),
    ('{"model": "m", "input": "x", "prompt_cache_key": "@"}', "prompt_cache_key"),
    ('{"model": "m", "input": "x", "safety_identifier": "@"}', "safety_identifier"),
    ('{"model": "m", "input": [{"type": "item_reference", "id": "msg_@"}]}', "input[0].id"),
    (
        '{"model": "m", "input": "x", "text": {"format": {"type": "json_schema", "name": "a", '
        '"schema": {"type": "object", "description": "@"}}}}',
        "text.format.schema.description",
    ),
    (
        '{"model": "m", "input": "x", "stream": true, "tool_choice": {"type": "function", '
        '"name": "\\udfff"}}',
        "tool_choice.name",
    ),
]


@pytest.mark.parametrize(
    ("template", "param"), SURROGATE_FIELDS, ids=[p for _, p in SURROGATE_FIELDS]
)
@pytest.mark.parametrize("stream", [False, True])
def test_a_lone_surrogate_anywhere_is_a_400_naming_where(
    template: str, param: str, stream: bool
) -> None:
    body = json.loads(template.replace("@", "SURROGATE").replace("\\udfff", "SURROGATE"))
    body["stream"] = stream
    raw = json.dumps(body).replace("SURROGATE", LONE).encode()
    error = _error(_send(raw))
    assert error["param"] == param and error["code"] == "invalid_unicode"


@pytest.mark.parametrize("path", ["/v1/responses/input_tokens", "/v1/conversations"])
def test_lone_surrogates_are_refused_on_every_route_that_reads_a_body(
    path: str, tmp_path: Path
) -> None:
    raw = (
        (
            '{"model": "m", "input": "@", "items": [{"role": "user", "content": "@"}], '
            '"metadata": {"k": "@"}}'
        )
        .replace("@", LONE)
        .encode()
    )
    store = SqlStore(str(tmp_path / "o.db"))
    assert _error(_send(raw, path, store=store))["code"] == "invalid_unicode"


@pytest.mark.parametrize("text", ["\\ud83d\\ude00", "\\\\ud800", "plain"])
def test_paired_surrogates_and_escaped_backslashes_are_text(text: str) -> None:
    r = _send(b'{"model": "m", "input": "' + text.encode() + b'"}')
    assert r.status_code == 200, r.text


@pytest.mark.parametrize(
    "raw",
    [
        b'{"model": "m", "input": "\xff\xfe"}',
        b'{"model": "m\xc3", "input": "x"}',
        b'{"input": "\xed\xa0\x80"}',  # an encoded surrogate
        '{"input": "x"}'.encode("utf-16"),
    ],
)
def test_invalid_utf8_is_a_400(raw: bytes) -> None:
    assert _error(_send(raw))["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", 99999999999999999),
        ("seed", 2**32),
        ("seed", -1),
        ("seed", 10**400),
        ("max_output_tokens", 10**30),
        ("top_logprobs", 10**20),
        ("top_k", -(10**25)),
        ("max_tool_calls", 0),
        ("temperature", 1e308 * 10),
    ],
)
def test_out_of_range_numbers_are_a_400(field: str, value: Any) -> None:
    raw = json.dumps({"model": "m", "input": "x", field: value}).encode()
    r = _send(raw.replace(b"Infinity", b"1e999"))
    if field == "max_output_tokens":
        assert r.status_code == 200  # as many as the engine allows: the run ends at its limit
        return
    assert _error(r)["param"] == field


@pytest.mark.parametrize("name", ["f" * 65, "f" * 3000, "has space", "dot.ted", "", "naïve"])
@pytest.mark.parametrize("kind", ["function", "custom", "namespace"])
def test_tool_names_are_checked_as_openai_does(name: str, kind: str) -> None:
    tool: dict[str, Any] = {"type": kind, "name": name}
    if kind == "namespace":
        tool["tools"] = [FN]
    raw = json.dumps({"model": "m", "input": "x", "tools": [tool], "tool_choice": "auto"})
    error = _error(_send(raw.encode()))
    assert error["param"] == "tools[0].name"


def test_a_64_character_name_is_fine_and_a_bom_is_skipped() -> None:
    raw = json.dumps({"model": "m", "input": "x", "tools": [{**FN, "name": "a-b_" * 16}]})
    assert _send(raw.encode()).status_code == 200
    assert _send(b"\xef\xbb\xbf" + raw.encode()).status_code == 200


def test_a_custom_grammar_over_the_limit_is_a_400() -> None:
    definition = "start: " + " | ".join(f'"w{i}"' for i in range(MAX_GRAMMAR // 6))
    assert len(definition) > MAX_GRAMMAR
    tool = {
        "type": "custom",
        "name": "g",
        "format": {"type": "grammar", "syntax": "lark", "definition": definition},
    }
    error = _error(_send(json.dumps({"model": "m", "input": "x", "tools": [tool]}).encode()))
    assert error["param"] == "tools[0].format.definition"


def test_a_long_model_name_is_a_400_and_never_echoed() -> None:
    r = _send(
        json.dumps({"model": "m" * 5_000_000, "input": "x", "stream": True}).encode(),
        max_body_bytes=64 * 2**20,
    )
    error = _error(r)
    assert error["param"] == "model" and len(r.content) < 1000


def test_too_many_items_or_tools_is_a_400() -> None:
    items = [{"role": "user", "content": "hi"}] * (MAX_INPUT_ITEMS + 1)
    raw = json.dumps({"model": "m", "input": items}).encode()
    assert _error(_send(raw, max_body_bytes=64 * 2**20))["code"] == "too_many_items"
    tools = [{**FN, "name": f"f{i}"} for i in range(MAX_TOOLS + 1)]
    raw = json.dumps({"model": "m", "input": "x", "tools": tools}).encode()
    assert _error(_send(raw, max_body_bytes=64 * 2**20))["code"] == "too_many_tools"


def test_a_body_over_the_limit_is_a_413_read_no_further() -> None:
    limit = 1000
    raw = json.dumps({"model": "m", "input": "x" * 2000}).encode()
    declared = _error(_send(raw, max_body_bytes=limit), 413)
    assert declared["code"] == "request_too_large" and str(limit) in declared["message"]

    limits = Limits(max_body_bytes=limit)
    app = create_app(ResponsesService(ScriptedEngine()), settings=ServerSettings(limits=limits))
    sent = 0

    async def chunks() -> Any:  # no content-length: the body is counted as it comes
        nonlocal sent
        for _ in range(10_000):
            sent += 500
            yield b" " * 500

    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
            return await client.post("/v1/responses", content=chunks())

    assert _error(asyncio.run(go()), 413)["code"] == "request_too_large"
    assert sent < 10_000 * 500


def test_a_hosted_tool_must_be_what_its_type_says() -> None:
    """Hosted tools are echoed, never run: one that breaks its type would break the echo (found
    by the schemathesis run)."""
    bad = {"type": "code_interpreter", "container": {"type": "auto", "network_policy": {"x": [1]}}}
    error = _error(_send(json.dumps({"model": "m", "input": "x", "tools": [FN, bad]}).encode()))
    assert error["param"] == "tools[1]" and "code_interpreter" in error["message"]
    bad_search = {"type": "web_search", "filters": {"allowed_domains": "x.org"}}
    error = _error(_send(json.dumps({"model": "m", "input": "x", "tools": [bad_search]}).encode()))
    assert error["param"] == "tools[0]" and "web_search" in error["message"]
    fine = [{"type": "web_search", "filters": {"allowed_domains": ["x.org"]}}]
    r = _send(json.dumps({"model": "m", "input": "x", "tools": fine}).encode())
    assert r.status_code == 200 and r.json()["tools"] == fine


@pytest.mark.parametrize("kind", [[], {}, ["web_search"]])
def test_a_tool_choice_whose_type_is_not_a_string_is_a_400(kind: Any) -> None:
    body = {"model": "m", "input": "x", "tools": [FN], "tool_choice": {"type": kind}}
    assert _error(_send(json.dumps(body).encode()))["param"] == "tool_choice"


@pytest.mark.parametrize(
    "action",
    [{"type": []}, {"type": {"search": 1}}, {"type": "search", "query": "q", "sources": 5}],
)
def test_a_web_search_call_with_an_odd_action_is_a_400(action: Any) -> None:
    item = {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": action}
    body = {"model": "m", "input": [item, {"role": "user", "content": "And?"}]}
    assert _error(_send(json.dumps(body).encode()))["param"].startswith("input[0].action")
