"""Splitting `<think>…</think>` reasoning from the answer, incrementally."""

from __future__ import annotations

import enum

from oars.parsing.holdback import split_holdback
from oars.parsing.segments import Segment, SegmentKind


class _State(enum.Enum):
    BEFORE = "before"  # nothing but whitespace yet: a start tag may still come
    REASONING = "reasoning"
    ANSWER = "answer"  # reasoning is over (or never began); tags are plain text from here on


class ThinkParser:
    """Turns model text into REASONING and TEXT segments.

    Reasoning is the block a model writes first: `start` counts only before any answer text, and
    after `end` everything is answer, tags included. `in_reasoning` is true when the prompt
    already opened the block (templates that end the prompt with `<think>\\n`). Whitespace right
    after the closing tag is dropped: templates put it there as a separator.
    """

    def __init__(
        self, start: str = "<think>", end: str = "</think>", *, in_reasoning: bool = False
    ) -> None:
        self.start, self.end = start, end
        self._state = _State.REASONING if in_reasoning else _State.BEFORE
        self._buffer = ""
        self._strip = False

    @property
    def in_reasoning(self) -> bool:
        return self._state is _State.REASONING

    def feed(self, text: str) -> list[Segment]:
        self._buffer += text
        out: list[Segment] = []
        if self._state is _State.BEFORE:
            self._before()
        if self._state is _State.REASONING:
            pos = self._buffer.find(self.end)
            if pos < 0:
                safe, self._buffer = split_holdback(self._buffer, (self.end,))
                self._emit(SegmentKind.REASONING, safe, out)
                return out
            self._emit(SegmentKind.REASONING, self._buffer[:pos], out)
            self._buffer = self._buffer[pos + len(self.end) :]
            self._state, self._strip = _State.ANSWER, True
        if self._state is _State.ANSWER:
            text, self._buffer = self._buffer, ""
            self._emit(SegmentKind.TEXT, text, out)
        return out

    def _before(self) -> None:
        head = self._buffer.lstrip()
        if head.startswith(self.start):
            self._buffer = head[len(self.start) :]
            self._state = _State.REASONING
        elif not self.start.startswith(head):
            self._state = _State.ANSWER  # answer text came first: no reasoning block

    def finish(self) -> list[Segment]:
        out: list[Segment] = []
        kind = SegmentKind.REASONING if self.in_reasoning else SegmentKind.TEXT
        self._emit(kind, self._buffer, out)
        self._buffer = ""
        return out

    def _emit(self, kind: SegmentKind, text: str, out: list[Segment]) -> None:
        if self._strip and kind is SegmentKind.TEXT:
            text = text.lstrip()
            if not text:
                return  # still only separator whitespace: keep stripping what comes next
            self._strip = False
        if text:
            out.append(Segment(kind, text))
