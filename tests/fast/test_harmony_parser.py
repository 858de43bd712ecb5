"""The harmony (gpt-oss) parser gives the same segments however its input is chunked.

Fixtures are `tests/fixtures/harmony/*.json`: `{"name", "text", "expect"}`, where `text` is a
completion as the engine renders it (special tokens included) and `expect` is the merged segment
list, one `[kind, value]` pair per segment: `kind` is a `SegmentKind` value (`"text"`,
`"reasoning"`, `"call_start"`, `"call_args"`, `"call_end"`); `value` is the tool name for
`call_start`, the text for the others (`""` for `call_end`).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oars.parsing.harmony import MARKERS, HarmonyParser
from oars.parsing.segments import Segment, SegmentKind, merge
from tests.fast.parser_fixtures import (
    assert_chunking_invariant,
    call_arguments,
    chunked,
    expected,
    fixtures,
    load,
    parse,
    raw_parse,
)

FIXTURES = fixtures("harmony")


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_one_shot_every_split_and_char_by_char(path: Path) -> None:
    assert_chunking_invariant(HarmonyParser, load(path))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=25))
def test_random_chunkings(path: Path, cuts: list[int]) -> None:
    f = load(path)
    assert parse(HarmonyParser, chunked(f["text"], cuts)) == expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_arguments_are_json_and_tokens_never_leak(path: Path) -> None:
    segments = raw_parse(HarmonyParser, list(load(path)["text"]))
    for arguments in call_arguments(segments):
        assert isinstance(json.loads(arguments), dict)
    for seg in segments:
        assert not any(token in seg.text or token in seg.name for token in MARKERS)


def test_fixtures_cover_the_required_shapes() -> None:
    names = {p.stem for p in FIXTURES}
    assert {
        "reasoning_then_final",
        "reasoning_then_call",
        "reasoning_preamble_call",
        "two_calls",
        "header_recipient",
    } <= names


def test_arguments_stream_before_the_call_ends() -> None:
    parser = HarmonyParser()
    head = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>"
    assert parser.feed(head) == [Segment(SegmentKind.CALL_START, name="get_weather")]
    assert parser.feed('{"location":') == [Segment(SegmentKind.CALL_ARGS, '{"location":')]
    assert parser.feed('"Paris"}<|ca') == [Segment(SegmentKind.CALL_ARGS, '"Paris"}')]
    assert parser.feed("ll|>") == [Segment(SegmentKind.CALL_END)]
    assert parser.finish() == []


def test_text_streams_and_holds_back_only_a_partial_token() -> None:
    parser = HarmonyParser()
    final = "final_answer"
    assert parser.feed("<|channel|>final<|message|>Hi <|") == [
        Segment(SegmentKind.TEXT, "Hi ", final)
    ]
    assert parser.feed("> there") == [Segment(SegmentKind.TEXT, "<|> there", final)]
    assert parser.feed("<|return|>") == []


def test_missing_terminator_before_next_header_ends_the_message() -> None:
    text = "<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>hi"
    assert parse(HarmonyParser, [text]) == [
        Segment(SegmentKind.REASONING, "think"),
        Segment(SegmentKind.TEXT, "hi", "final_answer"),
    ]


def test_output_ending_inside_a_header_is_dropped() -> None:
    text = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>fin"
    assert parse(HarmonyParser, [text]) == [Segment(SegmentKind.REASONING, "think")]


def test_only_the_requests_tools_are_called() -> None:
    """A body addressed to anything else (a built-in, or tools under tool_choice none) is text."""
    text = load(next(p for p in FIXTURES if p.stem == "builtin_recipient"))["text"]
    parser = HarmonyParser(frozenset({"get_weather"}))
    assert merge(parser.feed(text) + parser.finish()) == [
        Segment(SegmentKind.REASONING, "Look it up on the web."),
        Segment(SegmentKind.TEXT, '{"query":"gpt-oss release date"}'),
    ]
    assert parser.degraded == 1
    call = "<|channel|>commentary to=functions.get_weather <|message|>{}<|call|>"
    assert parse(lambda: HarmonyParser(frozenset()), [call]) == [
        Segment(SegmentKind.TEXT, "{}", "commentary")
    ]


def test_a_preamble_and_the_final_answer_are_two_messages() -> None:
    text = (
        "<|channel|>commentary<|message|>Let me think.<|end|>"
        "<|start|>assistant<|channel|>final<|message|>Answer.<|return|>"
    )
    assert parse(HarmonyParser, list(text)) == [
        Segment(SegmentKind.TEXT, "Let me think.", "commentary"),
        Segment(SegmentKind.TEXT, "Answer.", "final_answer"),
    ]


def test_plain_text_that_mentions_to_is_text() -> None:
    text = "Use the flag to=stdout for output."
    assert parse(HarmonyParser, list(text)) == [Segment(SegmentKind.TEXT, text)]
