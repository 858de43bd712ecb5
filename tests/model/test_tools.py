"""Tool calls on the real default model: forced, auto, the round trip, Codex-shaped requests."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from tests.model.conftest import stream

pytestmark = pytest.mark.model

CAPTURES = Path(__file__).parent.parent / "fixtures" / "captures"
WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"location": {"type": "string"}},
    "required": ["location"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "strict": True,
    "description": "Get the current weather for a city.",
    "parameters": WEATHER_SCHEMA,
}
QUESTION = "What's the weather in Paris?"


def _the_call(report: Any) -> dict[str, Any]:
    calls = [i for i in report.final["output"] if i["type"] == "function_call"]
    assert len(calls) == 1, report.final["output"]
    deltas = [e for e in report.events if e["type"] == "response.function_call_arguments.delta"]
    assert len(deltas) >= 2, "arguments should stream as the model writes them"
    call: dict[str, Any] = calls[0]
    assert "".join(e["delta"] for e in deltas) == call["arguments"]
    return call


@pytest.mark.parametrize(
    "tool_choice", ["required", {"type": "function", "name": "get_weather"}, "auto"]
)
def test_weather_call_has_schema_valid_streamed_arguments(server: str, tool_choice: Any) -> None:
    body = {
        "model": "default",
        "input": QUESTION,
        "tools": [WEATHER],
        "tool_choice": tool_choice,
        "max_output_tokens": 60,
        "temperature": 0,
    }
    call = _the_call(stream(server, body))
    assert call["name"] == "get_weather" and call["call_id"].startswith("call_")
    args = json.loads(call["arguments"])
    jsonschema.validate(args, WEATHER_SCHEMA)
    assert "paris" in args["location"].lower()


def test_second_turn_with_tool_output_gives_a_message(server: str) -> None:
    first = stream(
        server,
        {
            "model": "default",
            "input": QUESTION,
            "tools": [WEATHER],
            "max_output_tokens": 60,
            "temperature": 0,
        },
    ).final
    call = next(i for i in first["output"] if i["type"] == "function_call")
    history = [
        {"role": "user", "content": QUESTION},
        {k: call[k] for k in ("type", "call_id", "name", "arguments")},
        {
            "type": "function_call_output",
            "call_id": call["call_id"],
            "output": json.dumps({"temp_c": 18, "condition": "light rain"}),
        },
    ]
    second = stream(
        server,
        {
            "model": "default",
            "input": history,
            "tools": [WEATHER],
            "max_output_tokens": 40,
            "temperature": 0,
        },
    ).final
    types = [i["type"] for i in second["output"]]
    assert types == ["message"], second["output"]
    assert second["output"][0]["content"][0]["text"].strip()


def test_tool_choice_none_never_calls(server: str) -> None:
    body = {
        "model": "default",
        "input": QUESTION,
        "tools": [WEATHER],
        "tool_choice": "none",
        "max_output_tokens": 30,
        "temperature": 0,
    }
    final = stream(server, body).final
    assert all(i["type"] == "message" for i in final["output"])


@pytest.mark.parametrize(
    "name",
    [
        "codex_gpt55meta_01",
        "codex_tool_02",
        "codex_patch_02",
        "codex_reasoning_02",
        "codex_tool_search_02",
    ],
)
def test_codex_requests_stream_validly(server: str, name: str) -> None:
    body = json.loads((CAPTURES / f"{name}.json").read_text())["body"]
    report = stream(server, {**body, "max_output_tokens": 96, "temperature": 0})
    assert report.events[-1]["type"] in ("response.completed", "response.incomplete")
    for item in report.final["output"]:
        if item["type"] == "function_call" and item["status"] == "completed":
            assert isinstance(json.loads(item["arguments"]), dict)


SEARCH = {
    "type": "tool_search",
    "execution": "client",
    "description": "Search for tools that are not loaded yet; the ones found can be called next.",
    "parameters": {
        "type": "object",
        "properties": {"query": {"type": "string", "description": "What the tool should do."}},
        "required": ["query"],
        "additionalProperties": False,
    },
}


def test_a_client_tool_search_then_the_tool_it_loaded(server: str) -> None:
    """Only `tool_search` offered and a call required: the model searches. The client's
    `tool_search_output` loads get_weather, which the model then calls (named: left to
    choose, the 0.5B model searches again)."""
    body = {
        "model": "default",
        "input": QUESTION,
        "tools": [SEARCH, {**WEATHER, "defer_loading": True}],
        "tool_choice": "required",
        "max_output_tokens": 40,
        "temperature": 0,
    }
    first = stream(server, body)
    (search,) = first.final["output"]
    assert search["type"] == "tool_search_call" and search["status"] == "completed"
    assert search["execution"] == "client" and isinstance(search["arguments"]["query"], str)
    loaded = {
        "type": "tool_search_output",
        "call_id": search["call_id"],
        "execution": "client",
        "status": "completed",
        "tools": [WEATHER],
    }
    again = {"role": "user", "content": QUESTION}
    chosen = {"type": "function", "name": "get_weather"}  # named, though only loaded
    second = stream(server, {**body, "input": [again, search, loaded], "tool_choice": chosen})
    call = _the_call(second)
    assert call["name"] == "get_weather"
    jsonschema.validate(json.loads(call["arguments"]), WEATHER_SCHEMA)


def test_this_servers_tool_search_finds_the_deferred_tool_the_question_needs(server: str) -> None:
    calendar = {
        "type": "function",
        "name": "list_events",
        "description": "The events in the user's calendar on a day.",
        "parameters": {"type": "object", "properties": {"day": {"type": "string"}}},
        "defer_loading": True,
    }
    body = {
        "model": "default",
        "input": QUESTION,
        "tools": [calendar, {**WEATHER, "defer_loading": True}, {"type": "tool_search"}],
        "tool_choice": "required",
        "max_output_tokens": 60,
        "temperature": 0,
    }
    report = stream(server, body)
    search, found, *after = report.final["output"]
    assert search["type"] == "tool_search_call" and search["execution"] == "server"
    assert isinstance(search["arguments"]["query"], str)
    assert found["type"] == "tool_search_output"
    assert "get_weather" in [t["name"] for t in found["tools"]], (search, found)
    assert after, "the model goes on with what the search loaded"


PATCH_LINE = re.compile(
    r"^(\*\*\* (Begin Patch|End Patch|Add File: .+|Delete File: .+|"
    r"Update File: .+|Move to: .+|End of File)|[+\- ].*|@@.*)$"
)


def test_custom_tool_input_follows_its_lark_grammar(server: str) -> None:
    grammar = (CAPTURES.parent / "grammars" / "apply_patch.lark").read_text()
    patch = {
        "type": "custom",
        "name": "apply_patch",
        "description": "Edit files with a patch.",
        "format": {"type": "grammar", "syntax": "lark", "definition": grammar},
    }
    body = {
        "model": "default",
        "input": "Create the file hello.txt containing the line: hi",
        "tools": [patch],
        "tool_choice": {"type": "custom", "name": "apply_patch"},
        "max_output_tokens": 60,
        "temperature": 0,
    }
    report = stream(server, body)
    (call,) = [i for i in report.final["output"] if i["type"] == "custom_tool_call"]
    deltas = [
        e["delta"] for e in report.events if e["type"] == "response.custom_tool_call_input.delta"
    ]
    assert len(deltas) >= 2 and "".join(deltas) == call["input"]
    lines = call["input"].split("\n")
    assert lines[0] == "*** Begin Patch" and lines[1].startswith("*** ")
    complete_lines = lines[:-1] if call["status"] == "incomplete" else lines
    assert all(PATCH_LINE.match(line) for line in complete_lines if line), lines


def test_structured_answer_right_after_a_tool_result(server: str) -> None:
    """An agent loop's last turn: the tool has answered, the reply must follow text.format."""
    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string", "maxLength": 80}},
        "required": ["summary"],
        "additionalProperties": False,
    }
    history = [
        {"role": "user", "content": QUESTION},
        {
            "type": "function_call",
            "call_id": "call_1",
            "name": "get_weather",
            "arguments": '{"location": "Paris"}',
        },
        {
            "type": "function_call_output",
            "call_id": "call_1",
            "output": json.dumps({"temp_c": 18, "condition": "light rain"}),
        },
    ]
    fmt = {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}
    final = stream(
        server,
        {
            "model": "default",
            "input": history,
            "tools": [WEATHER],
            "text": {"format": fmt},
            "max_output_tokens": 60,
            "temperature": 0,
        },
    ).final
    assert final["status"] == "completed", final["output"]
    message = next(i for i in final["output"] if i["type"] == "message")
    jsonschema.validate(json.loads(message["content"][0]["text"]), schema)


def test_stop_sequences_do_not_cut_a_call(server: str) -> None:
    """`stop` ends free text; the call object (`{"name": …, "arguments": …}`) holds commas."""
    body = {
        "model": "default",
        "input": QUESTION,
        "tools": [WEATHER],
        "stop": [","],
        "max_output_tokens": 60,
        "temperature": 0,
    }
    call = _the_call(stream(server, body))
    assert json.loads(call["arguments"])["location"].lower().startswith("paris")


def test_with_a_json_text_format_the_model_may_still_call_a_tool(server: str) -> None:
    """An agent's first turn under --output-schema: a call (or the answer), always valid."""
    schema = {
        "type": "object",
        "properties": {"summary": {"type": "string", "maxLength": 80}},
        "required": ["summary"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "weather", "schema": schema, "strict": True}
    report = stream(
        server,
        {
            "model": "default",
            "input": QUESTION,
            "tools": [WEATHER],
            "text": {"format": fmt},
            "max_output_tokens": 60,
            "temperature": 0,
        },
    )
    assert report.final["status"] == "completed", report.final["output"]
    [item] = report.final["output"]
    assert item["type"] == "function_call", item  # what this model does with this question
    jsonschema.validate(json.loads(item["arguments"]), WEATHER_SCHEMA)


def test_a_configuration_update_sets_the_answers_format(server: str) -> None:
    """A `configuration_update` item's `text.format` holds the real model's answer to its
    schema, though the request itself asks for plain text."""
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 40}},
        "required": ["city"],
        "additionalProperties": False,
    }
    update = {
        "type": "configuration_update",
        "text": {"format": {"type": "json_schema", "name": "city", "schema": schema}},
    }
    body = {
        "model": "default",
        "input": [update, {"role": "user", "content": "Name the capital of France."}],
        "max_output_tokens": 40,
        "temperature": 0,
    }
    report = stream(server, body)
    (message,) = [i for i in report.final["output"] if i["type"] == "message"]
    jsonschema.validate(json.loads(message["content"][0]["text"]), schema)
