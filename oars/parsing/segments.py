"""What parsers produce: typed pieces of model output, in order."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SegmentKind(enum.Enum):
    TEXT = "text"
    REASONING = "reasoning"


@dataclass(frozen=True)
class Segment:
    kind: SegmentKind
    text: str


def merge(segments: list[Segment]) -> list[Segment]:
    """Join neighbours of the same kind and drop empty ones (for comparing parses)."""
    out: list[Segment] = []
    for seg in segments:
        if not seg.text:
            continue
        if out and out[-1].kind is seg.kind:
            out[-1] = Segment(seg.kind, out[-1].text + seg.text)
        else:
            out.append(seg)
    return out
