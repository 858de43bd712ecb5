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
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oars.parsing.harmony import _TOKENS, HarmonyParser
from oars.parsing.segments import Segment, SegmentKind, merge

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "harmony").glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _raw(chunks: list[str]) -> list[Segment]:
    parser = HarmonyParser()
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
def test_arguments_are_json_and_tokens_never_leak(path: Path) -> None:
    segments = _raw(list(_load(path)["text"]))
    for arguments in _call_arguments(segments):
        assert isinstance(json.loads(arguments), dict)
    for seg in segments:
        assert not any(token in seg.text or token in seg.name for token in _TOKENS)


def test_fixtures_cover_the_required_shapes() -> None:
    names = {p.stem for p in FIXTURES}
    assert {
        "reasoning_then_final", "reasoning_then_call", "reasoning_preamble_call", "two_calls",
        "header_recipient",
    } <= names  # fmt: skip


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
    assert parser.feed("<|channel|>final<|message|>Hi <|") == [Segment(SegmentKind.TEXT, "Hi ")]
    assert parser.feed("> there") == [Segment(SegmentKind.TEXT, "<|> there")]
    assert parser.feed("<|return|>") == []


def test_missing_terminator_before_next_header_ends_the_message() -> None:
    text = "<|channel|>analysis<|message|>think<|start|>assistant<|channel|>final<|message|>hi"
    assert _parse([text]) == [
        Segment(SegmentKind.REASONING, "think"),
        Segment(SegmentKind.TEXT, "hi"),
    ]


def test_output_ending_inside_a_header_is_dropped() -> None:
    text = "<|channel|>analysis<|message|>think<|end|><|start|>assistant<|channel|>fin"
    assert _parse([text]) == [Segment(SegmentKind.REASONING, "think")]
