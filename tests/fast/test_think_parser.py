"""The think parser gives the same segments however its input is chunked."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oars.parsing import Segment, SegmentKind, ThinkParser
from oars.parsing.segments import merge

FIXTURES = sorted((Path(__file__).parent.parent / "fixtures" / "think").glob("*.json"))


def _load(path: Path) -> dict:  # type: ignore[type-arg]
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def _parse(chunks: list[str], in_reasoning: bool) -> list[Segment]:
    parser = ThinkParser(in_reasoning=in_reasoning)
    out: list[Segment] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return merge(out + parser.finish())


def _expected(fixture: dict) -> list[Segment]:  # type: ignore[type-arg]
    return [Segment(SegmentKind(kind), text) for kind, text in fixture["expect"]]


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_one_shot(path: Path) -> None:
    f = _load(path)
    assert _parse([f["text"]], f["in_reasoning"]) == _expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_every_two_way_split(path: Path) -> None:
    f = _load(path)
    text, want = f["text"], _expected(f)
    for i in range(len(text) + 1):
        assert _parse([text[:i], text[i:]], f["in_reasoning"]) == want, i


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_char_by_char(path: Path) -> None:
    f = _load(path)
    assert _parse(list(f["text"]), f["in_reasoning"]) == _expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@settings(max_examples=60, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=25))
def test_random_chunkings(path: Path, cuts: list[int]) -> None:
    f = _load(path)
    text = f["text"]
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    assert _parse(chunks, f["in_reasoning"]) == _expected(f)


def test_custom_tags() -> None:
    parser = ThinkParser("[THINK]", "[/THINK]")
    out = parser.feed("[THINK]hm[/THI") + parser.feed("NK]ok") + parser.finish()
    assert merge(out) == [Segment(SegmentKind.REASONING, "hm"), Segment(SegmentKind.TEXT, "ok")]
