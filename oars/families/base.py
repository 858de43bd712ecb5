"""What every model family shares: the plan the embedded engine runs for one request, the
constraint it decodes under, and a family's common parts (reasoning tags, the JSON answer).

A family module says what its models write: its call syntax, the parser that reads it, and
how (if at all) a grammar holds its calls. `Family` here is a family that writes no calls of
its own (an upstream that hands calls over already parsed, or a plain model).
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from oars.generation import ChatMessage, EngineRequest, OutputFormat
from oars.parsing.pipeline import Chain, OutputParser, PassThrough
from oars.parsing.reasoning import ThinkParser
from oars.tools import ToolSet

THINK_TAGS = ("<think>", "</think>")


class GrammarKind(enum.Enum):
    JSON_SCHEMA = "json_schema"
    LARK = "lark"


@dataclass(frozen=True)
class Constraint:
    """Output must match a grammar, from the first token or (lazily) from a trigger on.

    With `triggers` (regexes), text is free until one matches the output; the grammar then applies
    from where the match's group 1 starts (the text already there is fed to it first). When the
    grammar completes, generation stops, unless `rearm` and the trigger can match again later.
    `param` names the request field the grammar came from, for error messages; `fallback` is a
    looser grammar to use when the compiler cannot take `source`.
    """

    kind: GrammarKind
    source: str  # the schema as JSON text, or the grammar text
    param: str = "text.format.schema"
    triggers: tuple[str, ...] = ()
    rearm: bool = False
    fallback: str | None = None


@dataclass(frozen=True)
class Plan:
    """How the embedded engine runs one request for a family."""

    tools: ToolSet  # what the model may call in this reply
    constraint: Constraint | None
    opening_ban: tuple[str, ...] = ()  # the reply may not open with these (after whitespace)
    template_kwargs: Mapping[str, Any] | None = None
    messages: tuple[ChatMessage, ...] = ()  # what the template renders


@dataclass(frozen=True)
class Family:
    """A model family. `think_tags`: where its models write their reasoning. `guards`: the
    workarounds of small models, which families whose small models need them define."""

    think_tags: tuple[str, str] | None = None
    guards: bool = False
    name: ClassVar[str | None] = None  # its call format (`--tool-format`); None: no calls
    call_markers: ClassVar[tuple[str, ...]] = ()

    @property
    def reasons(self) -> bool:
        """Its models write reasoning before their answer."""
        return self.think_tags is not None

    @property
    def efforts(self) -> tuple[str, ...]:
        """The `reasoning.effort` values its templates read (`template_switches`): `none` turns
        thinking off; the others turn it on (and name the level, for templates that read it)."""
        return ("none", "low", "medium", "high") if self.reasons else ()

    @property
    def markers(self) -> frozenset[str]:
        """The special strings its parser reads: an engine must keep them in the output even
        where the vocabulary marks them as control tokens (gpt-oss GGUFs mark all of harmony's)."""
        return frozenset(self.call_markers + (self.think_tags or ()))

    def parser(self, tools: ToolSet, *, in_reasoning: bool = False) -> OutputParser:
        """The parser for one reply that may call `tools`: reasoning first, then calls in the
        answer text."""
        calls = self._calls_parser(tools)
        if not self.think_tags:
            return calls  # (a chain behind a pass-through was a dozen calls a token for nothing)
        return Chain(ThinkParser(*self.think_tags, in_reasoning=in_reasoning), calls)

    def _calls_parser(self, tools: ToolSet) -> OutputParser:
        return PassThrough()

    def starts_in_reasoning(self, prompt: str) -> bool:
        """The template opened the reasoning block itself (the output starts inside it)."""
        return self.think_tags is not None and prompt.rstrip().endswith(self.think_tags[0])

    def plan(self, request: EngineRequest) -> Plan:
        """The grammar, callable tools, opening ban, template variables and messages for one
        request."""
        tools, constraint = self._constraint(request)
        ban = self._opening_ban(request, tools)
        switches = template_switches(request.reasoning_effort)
        return Plan(tools, constraint, ban, switches, self._messages(request.messages))

    def _messages(self, messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
        return messages

    def _constraint(self, request: EngineRequest) -> tuple[ToolSet, Constraint | None]:
        """A JSON `text.format` holds the answer; calls, in the family's own syntax, stay
        possible and unconstrained."""
        output = request.output
        return request.tools, (json_answer(output) if output is not None else None)

    def _opening_ban(self, request: EngineRequest, tools: ToolSet) -> tuple[str, ...]:
        return ()


def json_answer(output: OutputFormat) -> Constraint:
    return Constraint(GrammarKind.JSON_SCHEMA, json.dumps(output.schema), param=output.param)


def template_switches(effort: str | None) -> dict[str, Any]:
    """`reasoning.effort` → the chat-template variables model families read.

    Qwen3-style templates read `enable_thinking`; gpt-oss reads `reasoning_effort` (low, medium,
    high). Templates ignore variables they do not use, so both are set.
    """
    if effort is None:
        return {}
    if effort == "none":
        return {"enable_thinking": False}
    level = {"minimal": "low", "xhigh": "high", "max": "high"}.get(effort, effort)
    return {"enable_thinking": True, "reasoning_effort": level}
