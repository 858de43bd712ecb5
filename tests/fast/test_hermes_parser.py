"""The Hermes/bare-JSON tool-call parser gives the same segments however its input is chunked."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oars.parsing import Segment, SegmentKind
from oars.parsing.hermes import HermesParser
from tests.fast.parser_fixtures import (
    assert_chunking_invariant,
    chunked,
    expected,
    fixtures,
    load,
    parse,
)

FIXTURES = fixtures("hermes")


def _make(f: dict[str, Any]) -> Callable[[], HermesParser]:
    return lambda: HermesParser(frozenset(f["names"]))


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_one_shot_every_split_and_char_by_char(path: Path) -> None:
    f = load(path)
    assert_chunking_invariant(_make(f), f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
@settings(max_examples=40, deadline=None)
@given(cuts=st.lists(st.integers(min_value=0, max_value=300), max_size=20))
def test_random_chunkings(path: Path, cuts: list[int]) -> None:
    f = load(path)
    assert parse(_make(f), chunked(f["text"], cuts)) == expected(f)


@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.stem)
def test_arguments_parse_as_json(path: Path) -> None:
    f = load(path)
    for seg in parse(_make(f), [f["text"]]):
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
    assert parse(lambda: HermesParser(frozenset()), [text]) == [Segment(SegmentKind.TEXT, text)]
