"""Golden event sequences (ids normalized) for the builder driven through the service."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from oars.families import THINK_TAGS, Harmony, Hermes, Qwen3Coder
from oars.generation import FinishReason
from oars.normalize import normalize
from oars.sealing import Sealer
from oars.service import ResponsesService
from oars.testing import ScriptedEngine, run_to_end
from oars.validator import validate_events
from tests.conftest import normalize_ids

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city",
    "parameters": {"type": "object", "properties": {"location": {"type": "string"}}},
}
PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Edit files",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"},
}
GOLDEN = Path(__file__).parent.parent / "fixtures" / "golden"
HARMONY = Harmony()
QWEN3_CODER = Qwen3Coder()
THINKER = Hermes(THINK_TAGS, guards=True)

CASES: dict[str, tuple[ScriptedEngine, dict[str, Any]]] = {
    "text": (ScriptedEngine(["Hel", "lo", "!"]), {}),
    "reasoning_then_text": (
        ScriptedEngine(["<think>", "plan", " it", "</think>\n\n", "Hi"], family=THINKER),
        {},
    ),
    "incomplete": (ScriptedEngine(["a", "b", "c"]), {"max_output_tokens": 2}),
    "incomplete_in_reasoning": (
        ScriptedEngine(["<think>", "hm", "m"], family=THINKER),
        {"max_output_tokens": 2},
    ),
    "failed_mid_stream": (ScriptedEngine(["a", ScriptedEngine.FAIL]), {}),
    "whitespace_only": (ScriptedEngine(["\n", "\n"]), {}),
    "logprobs": (
        ScriptedEngine(["Hi", " there"], logprobs=True),
        {"include": ["message.output_text.logprobs"], "top_logprobs": 0},
    ),
    "length_finish_from_engine": (ScriptedEngine(["x"], finish=FinishReason.LENGTH), {}),
    "function_call_bare": (
        ScriptedEngine(['{"name": "get_weather", ', '"arguments": {"location": ', '"Paris"}}']),
        {"tools": [WEATHER]},
    ),
    "text_then_two_calls": (
        ScriptedEngine(
            [
                "Checking.\n<tool_call>\n",
                '{"name": "get_weather", "arguments": ',
                '{"location": "Paris"}}\n</tool_call>\n<tool_call>\n{"name": ',
                '"get_weather", "arguments": {"location": "Rome"}}\n</tool_call>',
            ]
        ),
        {"tools": [WEATHER]},
    ),
    "parallel_false_keeps_first_call": (
        ScriptedEngine(
            [
                '<tool_call>{"name": "get_weather", "arguments": {"location": "A"}}',
                '</tool_call><tool_call>{"name": "get_weather", "arguments": {}}',
                "</tool_call>",
            ]
        ),
        {"tools": [WEATHER], "parallel_tool_calls": False},
    ),
    "custom_tool_call": (
        ScriptedEngine(
            [
                '{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\\n',
                '*** End Patch"}}',
            ]
        ),
        {"tools": [PATCH]},
    ),
    "tool_search_call": (
        ScriptedEngine(
            [
                '<tool_call>\n{"name": "tool_search", "arguments": ',
                '{"query": "weather", "limit": 2}}\n</tool_call>',
            ]
        ),
        {
            "tools": [
                {**WEATHER, "defer_loading": True},
                {"type": "tool_search", "execution": "client", "description": "Find tools."},
            ]
        },
    ),
    "shell_call": (
        ScriptedEngine(
            [
                '<tool_call>\n{"name": "shell", "arguments": {"commands": ',
                '["ls -l", "cat notes.txt"]}}\n</tool_call>',
            ]
        ),
        {"tools": [{"type": "shell", "environment": {"type": "local"}}]},
    ),
    "local_shell_call": (
        ScriptedEngine(['<tool_call>\n{"name": "local_shell", "arguments": {"command": ["ls"]}}']),
        {"tools": [{"type": "local_shell"}]},
    ),
    "apply_patch_call": (
        ScriptedEngine(
            [
                '<tool_call>\n{"name": "apply_patch", "arguments": {"operation": "create_file", ',
                '"path": "notes.txt", "diff": "+hi\\n"}}\n</tool_call>',
            ]
        ),
        {"tools": [{"type": "apply_patch"}], "tool_choice": {"type": "apply_patch"}},
    ),
    "apply_patch_call_cut_by_max_output_tokens": (
        ScriptedEngine(
            [
                '<tool_call>\n{"name": "apply_patch", "arguments": {"operation": "create_file", ',
                '"path": "notes.txt", "diff": "+hi',
                '\\n"}}\n</tool_call>',
            ]
        ),
        {"tools": [{"type": "apply_patch"}], "max_output_tokens": 2},
    ),
    "namespace_call": (
        ScriptedEngine(['{"name": "spawn_agent", "arguments": {"task": "x"}}']),
        {
            "tools": [
                {
                    "type": "namespace",
                    "name": "multi_agent",
                    "description": "d",
                    "tools": [
                        {
                            "type": "function",
                            "name": "spawn_agent",
                            "parameters": {"type": "object"},
                        }
                    ],
                }
            ]
        },
    ),
    "call_cut_by_max_output_tokens": (
        ScriptedEngine(['{"name": "get_weather", ', '"arguments": {"loc', 'ation": "P"}}']),
        {"tools": [WEATHER], "max_output_tokens": 2},
    ),
    "harmony_reasoning_then_call": (
        ScriptedEngine(
            [
                "<|channel|>analysis<|message|>Need the",
                " weather.<|end|><|start|>",
                "assistant<|channel|>commentary to=functions.get_weather <|constrain|>",
                'json<|message|>{"location":',
                '"Paris"}<|call|>',
            ],
            family=HARMONY,
        ),
        {"tools": [WEATHER]},
    ),
    "qwen3_coder_call": (
        ScriptedEngine(
            [
                "Checking.\n<tool_call>\n<function=get_weather>\n<parameter=",
                "location>\nParis\n</parameter>\n</function>\n</tool_call>",
            ],
            family=QWEN3_CODER,
        ),
        {"tools": [WEATHER]},
    ),
    "reasoning_then_call": (
        ScriptedEngine(
            [
                "<think>",
                "Use the tool.",
                "</think>\n\n<tool_call>\n",
                '{"name": "get_weather", "arguments": {"location": "Oslo"}}',
                "\n</tool_call>",
            ],
            family=THINKER,
        ),
        {"tools": [WEATHER]},
    ),
    "qwen3_coder_call_cut_by_max_output_tokens": (
        ScriptedEngine(
            [
                "<tool_call>\n<function=get_weather>\n<parameter=",
                "location>\nPar",
                "is\n</parameter>\n",
            ],
            family=QWEN3_CODER,
        ),
        {"tools": [WEATHER], "max_output_tokens": 2},
    ),
    "qwen3_coder_call_under_tool_choice_none_is_text": (
        ScriptedEngine(
            [
                "<tool_call>\n<function=get_weather>\n<parameter=location>\nParis",
                "\n</parameter>\n</function>\n</tool_call>",
            ],
            family=QWEN3_CODER,
        ),
        {"tools": [WEATHER], "tool_choice": "none"},
    ),
    "harmony_preamble_then_final": (
        ScriptedEngine(
            [
                "<|channel|>analysis<|message|>Easy.<|end|><|start|>assistant",
                "<|channel|>commentary<|message|>Let me think.<|end|><|start|>",
                "assistant<|channel|>final<|message|>Answer.",
                "<|return|>",
            ],
            family=HARMONY,
        ),
        {},
    ),
    "call_cut_by_end_of_generation": (
        ScriptedEngine(['<tool_call>\n{"name": "get_weather", ', '"arguments": {"location": "Pa']),
        {"tools": [WEATHER]},
    ),
    "unknown_tool_name_stays_text": (
        ScriptedEngine(['{"name": "add", "arguments": {"a": 1}}']),
        {"tools": [WEATHER]},
    ),
}


def _events(engine: ScriptedEngine, extra: dict[str, Any]) -> list[dict[str, Any]]:
    service = ResponsesService(engine)
    return run_to_end(service, normalize({"input": "hi", "model": "m", **extra}, served_model="m"))


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden(name: str) -> None:
    engine, extra = CASES[name]
    _check_golden(name, _events(engine, extra))


def test_golden_compaction_trigger() -> None:
    """A `compaction_trigger`: the summary is sampled under `response.compaction.compacting`,
    then the compaction is the one output item."""
    history = [
        {"role": "user", "content": "Fix calc.py."},
        {"type": "message", "role": "assistant", "content": "It subtracts; fixed."},
    ]
    service = ResponsesService(ScriptedEngine(["Summary."]), sealer=Sealer(b"1" * 43 + b"="))
    body = {"model": "m", "input": [*history, {"type": "compaction_trigger"}]}
    events = run_to_end(service, normalize(body, served_model="m"))
    for event in events:  # sealed with a fresh nonce each time
        for item in [event.get("item"), *event.get("response", {}).get("output", [])]:
            if item and item.get("type") == "compaction":
                item["encrypted_content"] = "<sealed>"
    _check_golden("compaction_trigger", events)


def _check_golden(name: str, events: list[dict[str, Any]]) -> None:
    report = validate_events(events)
    assert report.ok, report.text()
    got = normalize_ids(events)
    path = GOLDEN / f"{name}.json"
    if os.environ.get("OARS_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


def test_logprobs_of_a_delta_spell_its_text_after_reasoning() -> None:
    """`</think>` and the separators after it are the reasoning's tokens, not the answer's."""
    engine = ScriptedEngine(
        ["<think>", "plan", "</think>", "\n\n", "Hi", "!"], family=THINKER, logprobs=True
    )
    events = _events(engine, {"include": ["message.output_text.logprobs"]})
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all(
        "".join(lp["token"] for lp in d["logprobs"]) == d["delta"] for d in deltas
    ), deltas
    usage = events[-1]["response"]["usage"]
    assert usage["output_tokens_details"]["reasoning_tokens"] == 4  # up to the answer's "Hi"
    assert usage["output_tokens"] == 6


@pytest.mark.parametrize("tools", [[WEATHER], []])
def test_logprobs_of_a_delta_spell_its_text_when_a_parser_holds_back(tools: list[Any]) -> None:
    """The call parser holds a `<` that might open `<tool_call>`: the token ` <` is split."""
    engine = ScriptedEngine(["Use a", " <", "b", "> tag"], logprobs=True)
    events = _events(engine, {"include": ["message.output_text.logprobs"], "tools": tools})
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert "".join(d["delta"] for d in deltas) == "Use a <b> tag"
    for d in deltas:
        assert "".join(lp["token"] for lp in d["logprobs"]) == d["delta"], deltas
    assert validate_events(events).ok


def test_text_held_for_its_logprobs_is_kept_when_the_engine_fails() -> None:
    """The space of the token ` <` waits for its `<` (which the call parser holds): a failure
    then still sends it. (The parser's own held `<` is not flushed on failure.)"""
    engine = ScriptedEngine(["Use a", " <", ScriptedEngine.FAIL], logprobs=True)
    events = _events(engine, {"include": ["message.output_text.logprobs"]})
    assert validate_events(events).ok
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["output"][0]["content"][0]["text"] == "Use a "


def test_phases_survive_text_held_for_its_logprobs() -> None:
    engine = ScriptedEngine(
        [
            "<|channel|>commentary<|message|>Let me <",
            "|end|><|start|>assistant",
            "<|channel|>final<|message|>Answer.<|return|>",
        ],
        family=HARMONY,
        logprobs=True,
    )
    events = _events(engine, {"include": ["message.output_text.logprobs"]})
    assert validate_events(events).ok
    output = events[-1]["response"]["output"]
    assert [(i["phase"], i["content"][0]["text"]) for i in output] == [
        ("commentary", "Let me "),
        ("final_answer", "Answer."),
    ]
