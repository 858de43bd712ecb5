"""The Qwen3-Coder XML tool-call parser gives the same segments however its input is chunked.

Fixtures are `tests/fixtures/qwen3_coder/*.json`: `{"name", "text", "expect"}`, where `text` is
the model's answer text and `expect` is the merged segment list, one `[kind, value]` pair per
segment: `kind` is a `SegmentKind` value (`"text"`, `"call_start"`, `"call_args"`,
`"call_end"`); `value` is the tool name for `call_start`, the text for the others (`""` for
`call_end`). A call's merged `call_args` is its whole JSON arguments text.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oars.parsing.qwen3_coder import Qwen3CoderParser
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

FIXTURES = fixtures("qwen3_coder")


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_one_shot_every_split_and_char_by_char(path: Path) -> None:
    assert_chunking_invariant(Qwen3CoderParser, load(path))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=25))
def test_random_chunkings(path: Path, cuts: list[int]) -> None:
    f = load(path)
    assert parse(Qwen3CoderParser, chunked(f["text"], cuts)) == expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_arguments_are_json_objects(path: Path) -> None:
    for arguments in call_arguments(raw_parse(Qwen3CoderParser, list(load(path)["text"]))):
        assert isinstance(json.loads(arguments), dict)


def test_fixtures_cover_the_required_shapes() -> None:
    names = {p.stem for p in FIXTURES}
    assert {
        "one_call",
        "text_then_call",
        "two_calls",
        "json_object_parameter",
        "multiline_string_parameter",
        "malformed_markup_is_text",
    } <= names


def test_arguments_stream_one_parameter_at_a_time() -> None:
    parser = Qwen3CoderParser()
    head = "Checking.\n\n<tool_call>\n<function=get_weather>\n<parameter=location>\nPar"
    assert parser.feed(head) == [
        Segment(SegmentKind.TEXT, "Checking."),
        Segment(SegmentKind.CALL_START, name="get_weather"),
    ]
    assert parser.feed("is\n</parameter>\n<parameter=days>\n3\n") == [
        Segment(SegmentKind.CALL_ARGS, '{"location": "Paris"'),
    ]
    assert parser.feed("</parameter>\n") == [Segment(SegmentKind.CALL_ARGS, ', "days": 3')]
    assert parser.feed("</function>\n</tool_call>") == [
        Segment(SegmentKind.CALL_ARGS, "}"),
        Segment(SegmentKind.CALL_END),
    ]
    assert parser.finish() == []


def test_malformed_markup_counts_as_degraded() -> None:
    parser = Qwen3CoderParser()
    out = parser.feed("<tool_call>\nnot a call") + parser.finish()
    assert merge(out) == [Segment(SegmentKind.TEXT, "<tool_call>\nnot a call")]
    assert parser.degraded == 1


@pytest.mark.parametrize(
    ("raw", "want"),
    [
        ("\n42\n", "42"),
        ("\n-1.5e3\n", "-1.5e3"),
        ("\ntrue\n", "true"),
        ("\n[1, 2]\n", "[1, 2]"),
        ("\nNaN\n", '"NaN"'),
        ("\n\n  indented\n\n", '"\\n  indented\\n"'),
        ('\n"x"\n', '"\\"x\\""'),
        ("\n{broken\n", '"{broken"'),
        ("", '""'),
    ],
)
def test_parameter_values(raw: str, want: str) -> None:
    text = f"<tool_call>\n<function=f>\n<parameter=v>{raw}</parameter>\n</function>\n</tool_call>"
    assert call_arguments(parse(Qwen3CoderParser, [text])) == ['{"v": ' + want + "}"]
    json.loads(call_arguments(parse(Qwen3CoderParser, [text]))[0])


@pytest.mark.parametrize(
    "text",
    [
        "<tool_call>\n<function=\nbroken>\n</tool_call>",
        "<tool_call>\n<function=>\n</tool_call>",
        "a <tool_call",
        "<tool_call>\n<function=f>\nstray words <parameter=a>\n1\n</parameter>\n</function>",
        "<tool_call>\n<function=f>\n</function>\nthen prose without a close",
        "<tool_call>\n<function=f>\n</function>\n</tool_c",
    ],
)
def test_odd_markup_never_raises_and_is_chunk_invariant(text: str) -> None:
    want = parse(Qwen3CoderParser, [text])
    assert parse(Qwen3CoderParser, list(text)) == want
    for arguments in call_arguments(want):
        json.loads(arguments)


def test_a_function_that_is_not_offered_is_text() -> None:
    text = "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call>"
    segments = parse(lambda: Qwen3CoderParser(frozenset({"get_weather"})), list(text))
    assert segments == [Segment(SegmentKind.TEXT, text)]


def test_string_parameters_stay_strings_whatever_they_look_like() -> None:
    """The schema decides: `cmd: true` is the string "true" when `cmd` is a string."""
    text = (
        "<tool_call>\n<function=exec>\n<parameter=cmd>\ntrue\n</parameter>\n"
        "<parameter=n>\n3\n</parameter>\n</function>\n</tool_call>"
    )
    parser = lambda: Qwen3CoderParser(None, {"exec": frozenset({"cmd"})})  # noqa: E731
    assert call_arguments(parse(parser, list(text))) == ['{"cmd": "true", "n": 3}']
