"""The parser a model family needs: reasoning first, then tool calls in the answer text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from oars.parsing import harmony, hermes, qwen3_coder
from oars.parsing.harmony import HarmonyParser
from oars.parsing.hermes import HermesParser
from oars.parsing.qwen3_coder import Qwen3CoderParser
from oars.parsing.reasoning import ThinkParser
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


_CALL_MARKERS = {
    "hermes": (hermes.OPEN, hermes.CLOSE),
    "qwen3_coder": (qwen3_coder.OPEN, qwen3_coder.CLOSE),
    "harmony": harmony.MARKERS,
}


def markers_of(tool_format: str, think_tags: tuple[str, str] | None) -> frozenset[str]:
    """The special strings a family's parser reads: an engine must keep them in the output even
    where the vocabulary marks them as control tokens (gpt-oss GGUFs mark all of harmony's)."""
    return frozenset(_CALL_MARKERS.get(tool_format, ()) + (think_tags or ()))


def output_parser(
    *,
    think_tags: tuple[str, str] | None,
    in_reasoning: bool,
    tool_names: frozenset[str],
    tool_format: str | None = "hermes",
    string_params: Mapping[str, frozenset[str]] | None = None,
) -> OutputParser:
    """The parser for one generation: calls are recognized only for `tool_names` (none with
    no `tool_format`); `string_params` (per tool, its string-typed parameters) types
    Qwen3-Coder's XML values."""
    if tool_format == "harmony":  # channels carry reasoning, answer and calls alike
        return HarmonyParser(tool_names)
    first: Parser = (
        ThinkParser(*think_tags, in_reasoning=in_reasoning) if think_tags else (PassThrough())
    )
    second: Parser = (
        Qwen3CoderParser(tool_names, string_params)
        if tool_format == "qwen3_coder"
        else HermesParser(tool_names)
        if tool_format == "hermes"
        else PassThrough()
    )
    return Chain(first, second)
