"""What parsers produce: typed pieces of model output, in order.

A tool call is three kinds of segment: CALL_START (carrying the tool `name` as the model wrote
it), any number of CALL_ARGS (argument text, streamed as it is generated: concatenated, they
are the call's arguments, a JSON object for function tools), and CALL_END. A TEXT segment's
`name` is the phase of the message it belongs to, where the family marks one (harmony:
`commentary` for a preamble, `final_answer`); text of another phase starts another message.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class SegmentKind(enum.Enum):
    TEXT = "text"
    REASONING = "reasoning"
    CALL_START = "call_start"
    CALL_ARGS = "call_args"
    CALL_END = "call_end"


@dataclass(frozen=True)
class Segment:
    kind: SegmentKind
    text: str = ""
    name: str = ""


def merge(segments: list[Segment]) -> list[Segment]:
    """Join neighbours of the same text kind (and phase) and drop empty ones (for comparing
    parses)."""
    out: list[Segment] = []
    joinable = (SegmentKind.TEXT, SegmentKind.REASONING, SegmentKind.CALL_ARGS)
    for seg in segments:
        if seg.kind in joinable and not seg.text:
            continue
        if out and (out[-1].kind, out[-1].name) == (seg.kind, seg.name) and seg.kind in joinable:
            out[-1] = Segment(seg.kind, out[-1].text + seg.text, seg.name)
        else:
            out.append(seg)
    return out
