"""The harmony family (gpt-oss): every part of a reply is a channel — `analysis` (reasoning),
`commentary to=functions.X` (a call), a commentary preamble and the `final` answer (messages
with their phase). Its parser reads the channels, reasoning included; its calls are not held to
a grammar."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from oars.families.base import Family
from oars.parsing import harmony
from oars.parsing.harmony import HarmonyParser
from oars.parsing.pipeline import OutputParser
from oars.tools import ToolSet


@dataclass(frozen=True)
class Harmony(Family):
    name: ClassVar[str | None] = "harmony"
    call_markers: ClassVar[tuple[str, ...]] = harmony.MARKERS

    @property
    def reasons(self) -> bool:
        return True  # its `analysis` channel, always

    @property
    def efforts(self) -> tuple[str, ...]:
        return ("low", "medium", "high")  # gpt-oss's template reads the level; none is not one

    def parser(self, tools: ToolSet, *, in_reasoning: bool = False) -> OutputParser:
        return HarmonyParser(tools.names)
