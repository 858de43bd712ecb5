"""The Qwen3-Coder family: calls as XML, `<tool_call><function=name><parameter=p>value
</parameter></function></tool_call>`. Its calls are not held to a grammar (the call grammar is
Hermes' JSON); a JSON `text.format` still holds the answer."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from oars.families.base import Family
from oars.parsing import qwen3_coder
from oars.parsing.pipeline import OutputParser
from oars.parsing.qwen3_coder import Qwen3CoderParser
from oars.tools import ToolSet


@dataclass(frozen=True)
class Qwen3Coder(Family):
    name: ClassVar[str | None] = "qwen3_coder"
    call_markers: ClassVar[tuple[str, ...]] = (qwen3_coder.OPEN, qwen3_coder.CLOSE)

    def _calls_parser(self, tools: ToolSet) -> OutputParser:
        """String-typed parameters keep their XML value as text; the others are read as JSON."""
        string_params = {t.model_name: t.string_parameters for t in tools.callable}
        return Qwen3CoderParser(tools.names, string_params)
