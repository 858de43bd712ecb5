"""The Hermes/bare-JSON tool-call parser gives the same segments however its input is chunked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oars.parsing import Segment, SegmentKind
from oars.parsing.hermes import HermesParser
from oars.parsing.segments import merge

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "hermes").glob("*.json"))


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _parse(chunks: list[str], names: list[str]) -> list[Segment]:
    parser = HermesParser(frozenset(names))
    out: list[Segment] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return merge(out + parser.finish())


def _expected(f: dict[str, Any]) -> list[Segment]:
    out = []
    for kind, value in f["expect"]:
        k = SegmentKind(kind)
        out.append(Segment(k, name=value) if k is SegmentKind.CALL_START else Segment(k, value))
    return out


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_one_shot_and_every_split(path: Path) -> None:
    f = _load(path)
    text, want = f["text"], _expected(f)
    assert _parse([text], f["names"]) == want
    for i in range(len(text) + 1):
        assert _parse([text[:i], text[i:]], f["names"]) == want, i
    assert _parse(list(text), f["names"]) == want


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=20))
def test_random_chunkings(path: Path, cuts: list[int]) -> None:
    f = _load(path)
    text = f["text"]
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert _parse(chunks, f["names"]) == _expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_arguments_parse_as_json(path: Path) -> None:
    for seg in _parse([_load(path)["text"]], _load(path)["names"]):
        if seg.kind is SegmentKind.CALL_ARGS:
            assert isinstance(json.loads(seg.text), dict)


def test_arguments_stream_before_the_call_ends() -> None:
    parser = HermesParser(frozenset({"get_weather"}))
    out = parser.feed('{"name": "get_weather", "arguments": {"location": "Pa')
    kinds = [s.kind for s in out]
    assert kinds == [SegmentKind.CALL_START, SegmentKind.CALL_ARGS]
    assert out[1].text == '{"location": "Pa'


def test_malformed_call_counts_as_degraded() -> None:
    parser = HermesParser(frozenset({"get_weather"}))
    parser.feed("<tool_call> not json")
    parser.finish()
    assert parser.degraded == 1


def test_no_tools_means_no_calls() -> None:
    text = '{"name": "get_weather", "arguments": {}}'
    assert _parse([text], []) == [Segment(SegmentKind.TEXT, text)]
