"""What a model family writes, in one place: its reasoning tags, how it writes tool calls, the
parser that reads its output, the grammar that constrains it, and the workarounds its small
models need. Both engines use it: the embedded one for all of it, an upstream one for the
parser it applies to content the upstream left unparsed.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from oars.generation import EngineRequest, OutputFormat
from oars.parsing import hermes
from oars.parsing.pipeline import OutputParser, markers_of, output_parser
from oars.tools import ToolSet, call_grammar

CALL_FORMATS = ("hermes", "qwen3_coder", "harmony")
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
    # The reply may not open with these (after whitespace): see `Family.guards`.
    opening_ban: tuple[str, ...] = ()
    template_kwargs: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Family:
    """A model family. `calls`: how it writes tool calls (None: the engine hands calls over
    already parsed, or the model makes none). `guards`: the workarounds small models of the
    family need (after a tool's output, no bare JSON call opens the reply, and a JSON
    `text.format` is the answer rather than another call)."""

    calls: str | None = "hermes"
    think_tags: tuple[str, str] | None = None
    guards: bool = False

    @property
    def markers(self) -> frozenset[str]:
        """The special strings its parser reads (an engine keeps them in the output)."""
        return markers_of(self.calls or "", self.think_tags)

    def parser(self, tools: ToolSet, *, in_reasoning: bool = False) -> OutputParser:
        """The parser for one reply that may call `tools`."""
        return output_parser(
            think_tags=self.think_tags,
            in_reasoning=in_reasoning,
            tool_names=tools.names,
            tool_format=self.calls,
            string_params={t.model_name: t.string_parameters for t in tools.callable},
        )

    def starts_in_reasoning(self, prompt: str) -> bool:
        """The template opened the reasoning block itself (the output starts inside it)."""
        return self.think_tags is not None and prompt.rstrip().endswith(self.think_tags[0])

    def plan(self, request: EngineRequest) -> Plan:
        """The grammar, callable tools, opening ban and template variables for one request."""
        tools, constraint = self._constraint(request)
        ban = BARE_CALL_OPENINGS if self._after_output_guard(request, tools) else ()
        return Plan(tools, constraint, ban, template_switches(request.reasoning_effort))

    def _after_output_guard(self, request: EngineRequest, tools: ToolSet) -> bool:
        return self.guards and request.after_tool_output and tools.mode == "auto"

    def _constraint(self, request: EngineRequest) -> tuple[ToolSet, Constraint | None]:
        """A forced call owns the reply. With a JSON `text.format`, the reply is the answer or
        one call (the answer alone right after a tool's output, under `guards`). Otherwise
        calls are constrained lazily, from the moment one starts."""
        tools, output = request.tools, request.output
        calls = self._calls(tools, parallel=request.parallel_tool_calls)
        answer = _json(output) if output is not None else None
        if answer is None:
            return tools, calls
        if self.guards and request.after_tool_output:
            return ToolSet(tools.offered, (), "none"), answer
        if self.calls != "hermes":
            return tools, answer  # its calls, in its own syntax, stay possible (unconstrained)
        if calls is None:
            return ToolSet(tools.offered, (), "none"), answer
        return tools, _answer_or_call(tools, answer)

    def _calls(self, tools: ToolSet, *, parallel: bool) -> Constraint | None:
        """Hermes calls: a forced call from the first token, `auto` lazily from a trigger on.
        Other families write calls in syntax the grammar does not cover: unconstrained."""
        if tools.mode == "none" or not tools.callable or self.calls != "hermes":
            return None
        forced = tools.mode == "required"
        many = forced and parallel
        return Constraint(
            GrammarKind.LARK,
            call_grammar(tools.callable, many=many, compact=forced),
            param="tools",
            triggers=() if forced else _hermes_triggers(self.guards),
            rearm=parallel,
            fallback=call_grammar(tools.callable, many=many, compact=forced, relaxed=True),
        )


# After a tool result, small models tend to repeat the call as a bare JSON object instead of
# answering: the reply may not open with these, while calls in the family's tags stay possible.
BARE_CALL_OPENINGS = ("{", "`", "(", "[", '"')


def _hermes_triggers(guards: bool) -> tuple[str, ...]:
    """Where a call object starts in free text: after a `<tool_call>` tag anywhere, and (the
    way small Qwen models answer) as the whole reply, bare or in a ```json fence."""
    tagged = re.escape(hermes.OPEN) + r"\s*(\{)"
    return (r"^\s*(?:```(?:json)?\s*)?(\{)", tagged) if guards else (tagged,)


def _json(output: OutputFormat) -> Constraint:
    return Constraint(GrammarKind.JSON_SCHEMA, json.dumps(output.schema), param=output.param)


def _answer_or_call(tools: ToolSet, answer: Constraint) -> Constraint:
    """The reply is the JSON answer or one call, whichever the model starts writing."""
    return Constraint(
        GrammarKind.LARK,
        call_grammar(tools.callable, many=False, compact=True, answer=answer.source),
        param=answer.param,
        fallback=call_grammar(
            tools.callable, many=False, compact=True, relaxed=True, answer=answer.source
        ),
    )


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


def family_of(chat_template: str, calls: str | None = None) -> Family:
    """A GGUF's family, from its chat template (`calls` overrides the guessed call format).
    The Hermes family is the small Qwen2.5 one oars ships: it gets the guards."""
    calls = calls or _call_format_of(chat_template)
    think = THINK_TAGS if THINK_TAGS[0] in chat_template else None
    return Family(calls, think, guards=calls == "hermes")


def _call_format_of(chat_template: str) -> str:
    if "<|channel|>" in chat_template:
        return "harmony"
    if "<function=" in chat_template:
        return "qwen3_coder"
    return "hermes"
