"""Properties over arbitrary model output, not only recorded transcripts: the parsers never
raise and do not depend on how the text is split, and neither does the response the builder
makes of it (whose every stream passes the validator)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oars.families import THINK_TAGS, Hermes
from oars.normalize import normalize
from oars.parsing.harmony import HarmonyParser
from oars.parsing.hermes import HermesParser
from oars.parsing.holdback import split_holdback
from oars.parsing.pipeline import Parser
from oars.parsing.qwen3_coder import Qwen3CoderParser
from oars.parsing.reasoning import ThinkParser
from oars.service import ResponsesService
from oars.testing import ScriptedEngine, run_to_end
from oars.validator import validate_events
from tests.conftest import normalize_ids
from tests.fast.parser_fixtures import chunked, parse

NAMES = frozenset({"get_weather", "search"})
FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<think>",
    "</think>",
    "{",
    "}",
    "[",
    "]",
    '"name"',
    ":",
    '"get_weather"',
    '"search"',
    '"arguments"',
    '"city"',
    ",",
    " ",
    "\n",
    "hello",
    '"',
    "\\",
    "<",
    ">",
    "/",
    "<function=get_weather>",
    "<function=",
    "</function>",
    "<parameter=city>",
    "</parameter>",
    "<|channel|>",
    "<|message|>",
    "<|end|>",
    "<|start|>",
    "<|call|>",
    "assistant",
    "commentary",
    "final",
    "analysis",
    " to=functions.get_weather",
    "é",
    "😀",
    "\\u00e9",
    "null",
    "1.5e3",
    "true",
]
texts = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=3), max_size=40).map("".join)
cuts = st.lists(st.integers(min_value=0, max_value=400), max_size=12)

PARSERS: dict[str, Callable[[], Parser]] = {
    "hermes": lambda: HermesParser(NAMES),
    "qwen3_coder": lambda: Qwen3CoderParser(NAMES),
    "harmony": lambda: HarmonyParser(NAMES),
    "think": lambda: ThinkParser(*THINK_TAGS),
}


@settings(max_examples=300, deadline=None)
@given(text=texts, cuts=cuts, family=st.sampled_from(sorted(PARSERS)))
def test_parsers_never_raise_and_ignore_the_split(text: str, cuts: list[int], family: str) -> None:
    make = PARSERS[family]
    assert parse(make, chunked(text, cuts)) == parse(make, [text])


TOOL = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}


def _final(chunks: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    engine = ScriptedEngine(chunks, family=Hermes(THINK_TAGS, guards=True))
    request = normalize({"model": "m", "input": "x", "tools": [TOOL]}, served_model="m")
    events = run_to_end(ResponsesService(engine), request)
    report = validate_events(events)
    assert report.ok, report.text()
    return events, events[-1]["response"]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=texts, cuts=cuts)
def test_the_response_does_not_depend_on_the_split(text: str, cuts: list[int]) -> None:
    pieces = [c for c in chunked(text, cuts) if c]
    _, whole = _final([text] if text else [])
    _, split = _final(pieces)
    assert normalize_ids(split["output"]) == normalize_ids(whole["output"])
    assert split["status"] == whole["status"]


def _held_by_definition(buffer: str, tags: tuple[str, ...]) -> tuple[str, str]:
    """The longest suffix of fewer characters than the longest tag that begins some tag."""
    longest = max((len(t) for t in tags), default=0)
    for size in range(min(len(buffer), longest - 1), 0, -1):
        if any(tag.startswith(buffer[-size:]) for tag in tags):
            return buffer[:-size], buffer[-size:]
    return buffer, ""


TAG_SETS = st.sampled_from(
    [("<tool_call>",), ("<|channel|>", "<|end|>", "<|call|>"), ("STOP", "ST", "</s>"), ("aa",), ()]
)


@settings(max_examples=500, deadline=None)
@given(text=texts, tags=TAG_SETS | st.lists(st.text(max_size=4), max_size=3).map(tuple))
def test_held_back_text_is_the_longest_tail_that_begins_a_tag(
    text: str, tags: tuple[str, ...]
) -> None:
    assert split_holdback(text, tags) == _held_by_definition(text, tags)
