"""Splitting `<think>…</think>` reasoning from the answer, incrementally."""

from __future__ import annotations

from oars.parsing.holdback import split_holdback
from oars.parsing.segments import Segment, SegmentKind


class ThinkParser:
    """Turns model text into REASONING and TEXT segments.

    `start`/`end` are the family's tags. `in_reasoning` starts true when the prompt already opened
    the reasoning block (templates that end the prompt with `<think>\\n`). Whitespace right after
    the closing tag is dropped: templates put it there as a separator, not as answer text.
    """

    def __init__(
        self, start: str = "<think>", end: str = "</think>", *, in_reasoning: bool = False
    ) -> None:
        self.start, self.end = start, end
        self.in_reasoning = in_reasoning
        self._buffer = ""
        self._strip_next = False

    def feed(self, text: str) -> list[Segment]:
        self._buffer += text
        out: list[Segment] = []
        while True:
            tag = self.end if self.in_reasoning else self.start
            pos = self._buffer.find(tag)
            if pos < 0:
                break
            self._emit(self._buffer[:pos], out)
            self._buffer = self._buffer[pos + len(tag) :]
            self._strip_next = self.in_reasoning
            self.in_reasoning = not self.in_reasoning
        tag = self.end if self.in_reasoning else self.start
        safe, self._buffer = split_holdback(self._buffer, (tag,))
        self._emit(safe, out)
        return out

    def finish(self) -> list[Segment]:
        out: list[Segment] = []
        self._emit(self._buffer, out)
        self._buffer = ""
        return out

    def _emit(self, text: str, out: list[Segment]) -> None:
        if self._strip_next and not self.in_reasoning:
            stripped = text.lstrip()
            if not stripped:
                return  # still only separator whitespace: keep stripping what comes next
            text, self._strip_next = stripped, False
        if text:
            kind = SegmentKind.REASONING if self.in_reasoning else SegmentKind.TEXT
            out.append(Segment(kind, text))
