"""Pure, synchronous, incremental parsers of model output: `feed(text)` / `finish()` -> segments."""

from oars.parsing.holdback import split_holdback
from oars.parsing.reasoning import ThinkParser
from oars.parsing.segments import Segment, SegmentKind

__all__ = ["Segment", "SegmentKind", "ThinkParser", "split_holdback"]
