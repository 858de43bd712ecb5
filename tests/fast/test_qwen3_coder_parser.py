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
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oars.parsing.qwen3_coder import Qwen3CoderParser
from oars.parsing.segments import Segment, SegmentKind, merge

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "qwen3_coder").glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _raw(chunks: list[str]) -> list[Segment]:
    parser = Qwen3CoderParser()
    out: list[Segment] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out + parser.finish()


def _parse(chunks: list[str]) -> list[Segment]:
    return merge(_raw(chunks))


def _expected(f: dict[str, Any]) -> list[Segment]:
    out = []
    for kind, value in f["expect"]:
        k = SegmentKind(kind)
        out.append(Segment(k, name=value) if k is SegmentKind.CALL_START else Segment(k, value))
    return out


def _call_arguments(segments: list[Segment]) -> list[str]:
    """Each call's arguments: its CALL_ARGS pieces joined."""
    calls: list[str] = []
    for seg in segments:
        if seg.kind is SegmentKind.CALL_START:
            calls.append("")
        elif seg.kind is SegmentKind.CALL_ARGS:
            calls[-1] += seg.text
    return calls


def _chunks(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_one_shot(path: Path) -> None:
    f = _load(path)
    assert _parse([f["text"]]) == _expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_two_way_split(path: Path) -> None:
    f = _load(path)
    text, want = f["text"], _expected(f)
    for i in range(len(text) + 1):
        assert _parse([text[:i], text[i:]]) == want, i


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_char_by_char(path: Path) -> None:
    f = _load(path)
    assert _parse(list(f["text"])) == _expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=600), max_size=25))
def test_random_chunkings(path: Path, cuts: list[int]) -> None:
    f = _load(path)
    assert _parse(_chunks(f["text"], cuts)) == _expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_arguments_are_json_objects(path: Path) -> None:
    for arguments in _call_arguments(_raw(list(_load(path)["text"]))):
        assert isinstance(json.loads(arguments), dict)


def test_fixtures_cover_the_required_shapes() -> None:
    names = {p.stem for p in FIXTURES}
    assert {
        "one_call", "text_then_call", "two_calls", "json_object_parameter",
        "multiline_string_parameter", "malformed_markup_is_text",
    } <= names  # fmt: skip


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
    assert _call_arguments(_parse([text])) == ['{"v": ' + want + "}"]
    json.loads(_call_arguments(_parse([text]))[0])


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
    want = _parse([text])
    assert _parse(list(text)) == want
    for arguments in _call_arguments(want):
        json.loads(arguments)
