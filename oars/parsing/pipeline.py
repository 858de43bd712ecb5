"""Parsers composed: `Chain` feeds one parser's text through another (reasoning first, then
calls in the answer text; see `oars.families`)."""

from __future__ import annotations

from typing import Protocol

from oars.parsing.segments import Segment, SegmentKind


class Parser(Protocol):
    def feed(self, text: str) -> list[Segment]: ...
    def finish(self) -> list[Segment]: ...


class OutputParser(Parser, Protocol):
    @property
    def degraded(self) -> int:
        """How often call-like text turned out not to be a call (the caller warns)."""
        ...


class PassThrough:
    degraded = 0

    def feed(self, text: str) -> list[Segment]:
        return [Segment(SegmentKind.TEXT, text)] if text else []

    def finish(self) -> list[Segment]:
        return []


class Chain:
    """Feeds the TEXT segments of `first` through `second`; other segments pass unchanged."""

    def __init__(self, first: Parser, second: Parser) -> None:
        self.first, self.second = first, second

    @property
    def degraded(self) -> int:
        return int(getattr(self.second, "degraded", 0))

    def feed(self, text: str) -> list[Segment]:
        return self._through(self.first.feed(text))

    def finish(self) -> list[Segment]:
        return self._through(self.first.finish()) + self.second.finish()

    def _through(self, segments: list[Segment]) -> list[Segment]:
        out: list[Segment] = []
        for seg in segments:
            out += self.second.feed(seg.text) if seg.kind is SegmentKind.TEXT else [seg]
        return out
