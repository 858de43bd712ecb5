"""Shared machinery for parser tests: fixtures and the chunking that must not matter.

A fixture is `{"name", "text", "expect", ...}`; `expect` is the merged segment list, one
`[kind, value]` pair per segment: `kind` a `SegmentKind` value, `value` the tool name for
`call_start` and the text otherwise (`""` for `call_end`). A `text` entry may add a third
element, its message phase (harmony: `commentary`, `final_answer`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from oars.parsing.pipeline import Parser
from oars.parsing.segments import Segment, SegmentKind, merge

FIXTURES = Path(__file__).parent.parent / "fixtures"


def fixtures(family: str) -> list[Path]:
    return sorted((FIXTURES / family).glob("*.json"))


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())  # type: ignore[no-any-return]


def expected(fixture: dict[str, Any]) -> list[Segment]:
    out = []
    for kind, value, *phase in fixture["expect"]:
        k = SegmentKind(kind)
        out.append(
            Segment(k, name=value) if k is SegmentKind.CALL_START else Segment(k, value, *phase)
        )
    return out


def raw_parse(make: Callable[[], Parser], chunks: list[str]) -> list[Segment]:
    parser = make()
    out: list[Segment] = []
    for chunk in chunks:
        out += parser.feed(chunk)
    return out + parser.finish()


def parse(make: Callable[[], Parser], chunks: list[str]) -> list[Segment]:
    return merge(raw_parse(make, chunks))


def chunked(text: str, cuts: list[int]) -> list[str]:
    points = sorted({min(c, len(text)) for c in cuts})
    return [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]


def assert_chunking_invariant(make: Callable[[], Parser], fixture: dict[str, Any]) -> None:
    """One-shot == every two-way split == char by char == the expected segments."""
    text, want = fixture["text"], expected(fixture)
    assert parse(make, [text]) == want
    for i in range(len(text) + 1):
        assert parse(make, [text[:i], text[i:]]) == want, i
    assert parse(make, list(text)) == want


def call_arguments(segments: list[Segment]) -> list[str]:
    """Each finished call's arguments: its CALL_ARGS pieces joined (a call left open is not
    finished: its arguments may stop anywhere)."""
    calls: list[str] = []
    current = ""
    for seg in segments:
        if seg.kind is SegmentKind.CALL_START:
            current = ""
        elif seg.kind is SegmentKind.CALL_ARGS:
            current += seg.text
        elif seg.kind is SegmentKind.CALL_END:
            calls.append(current)
    return calls
