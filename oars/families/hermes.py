"""The Hermes family (Qwen2.5, Qwen3, and templates the detector does not recognize): calls as
`<tool_call>{"name": …, "arguments": {…}}</tool_call>`.

Its calls can be held to a grammar: a forced call from the first token; under `auto`, free text
until a call object starts, then the rest held to a valid call of an offered tool. The grammar
is one call object per tool (`call_grammar`), in llguidance's Lark, with each tool's arguments
under its JSON schema.

`guards`: the workarounds of the family's small models (measured on the default 0.5B, see
`detect`). They write calls as a bare JSON object or one in a ```json fence: that is read as a
call too. After a tool's result they write the call again instead of answering. There, the
reply may not open with a bare object (`BARE_CALL_OPENINGS`; calls in the tags stay possible),
a JSON `text.format` is the answer rather than another call, and each tool result ends with
`RESULT_HINT`: with the ban alone the 0.5B model wrote the call after a stray first token
(`>{"name": …}`, `Mark the function name as …`); with the hint as well it answered with the
result (the weather and vault replays of `tests/model/test_tools.py`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import ClassVar

from oars.families.base import Constraint, Family, GrammarKind, json_answer
from oars.generation import ChatMessage, EngineRequest
from oars.parsing import hermes
from oars.parsing.hermes import HermesParser
from oars.parsing.pipeline import OutputParser
from oars.tools import ANY_OBJECT, COMPACT_JSON, Tool, ToolSet

# After a tool result, small models tend to repeat the call as a bare JSON object instead of
# answering: under the guards, the reply may not open with these.
BARE_CALL_OPENINGS = ("{", "`", "(", "[", '"')
RESULT_HINT = "Answer the question now, in words, with this result."


@dataclass(frozen=True)
class Hermes(Family):
    name: ClassVar[str | None] = "hermes"
    call_markers: ClassVar[tuple[str, ...]] = (hermes.OPEN, hermes.CLOSE)

    def _calls_parser(self, tools: ToolSet) -> OutputParser:
        return HermesParser(tools.names)

    def _constraint(self, request: EngineRequest) -> tuple[ToolSet, Constraint | None]:
        """A forced call owns the reply. With a JSON `text.format`, the reply is the answer or
        one call (the answer alone right after a tool's output, under `guards`). Otherwise
        calls are constrained lazily, from the moment one starts."""
        tools, output = request.tools, request.output
        calls = self._calls(tools, parallel=request.parallel_tool_calls)
        if output is None:
            return tools, calls
        answer = json_answer(output)
        if calls is None or (self.guards and request.after_tool_output):
            return ToolSet(tools.offered, (), "none"), answer
        return tools, _answer_or_call(tools, answer)

    def _messages(self, messages: tuple[ChatMessage, ...]) -> tuple[ChatMessage, ...]:
        if not self.guards:
            return messages
        return tuple(
            replace(m, content=f"{m.content}\n\n{RESULT_HINT}") if m.role == "tool" else m
            for m in messages
        )

    def _opening_ban(self, request: EngineRequest, tools: ToolSet) -> tuple[str, ...]:
        guarded = self.guards and request.after_tool_output and tools.mode == "auto"
        return BARE_CALL_OPENINGS if guarded else ()

    def _calls(self, tools: ToolSet, *, parallel: bool) -> Constraint | None:
        """A forced call from the first token, `auto` lazily from a trigger on."""
        if tools.mode == "none" or not tools.callable:
            return None
        forced = tools.mode == "required"
        many = forced and parallel
        return Constraint(
            GrammarKind.LARK,
            call_grammar(tools.callable, many=many, compact=forced),
            param="tools",
            triggers=() if forced else _triggers(self.guards),
            rearm=parallel,
            fallback=call_grammar(tools.callable, many=many, compact=forced, relaxed=True),
        )


def _triggers(guards: bool) -> tuple[str, ...]:
    """Where a call object starts in free text: after a `<tool_call>` tag anywhere, and (the
    way small Qwen models answer) as the whole reply, bare or in a ```json fence."""
    tagged = re.escape(hermes.OPEN) + r"\s*(\{)"
    return (r"^\s*(?:```(?:json)?\s*)?(\{)", tagged) if guards else (tagged,)


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


def _lark_string(text: str) -> str:
    return json.dumps(json.dumps(text))  # a Lark literal matching the JSON string `"text"`


def call_grammar(
    tools: Sequence[Tool],
    *,
    many: bool,
    relaxed: bool = False,
    compact: bool = False,
    answer: str | None = None,
) -> str:
    """Lark (llguidance flavour): one call object `{"name": …, "arguments": {…}}` per tool.

    Arguments follow the tool's JSON schema (`relaxed`: any object, for schemas the grammar
    compiler cannot take); a custom tool's `input` follows its own grammar where one is given.
    `many` allows further calls after the first. `compact` fixes the layout (forced calls);
    otherwise whitespace is free, to follow a model that already began a pretty-printed object.
    `answer` (a JSON schema's text) allows, instead of a call, a JSON answer that follows it.
    """
    gap, space = ("", '" "') if compact else ("WS?", "WS?")
    rules = []
    for i, tool in enumerate(tools):
        rules.append(
            f'call_{i}: "{{" {gap} "\\"name\\"" {gap} ":" {space} {_lark_string(tool.model_name)} {gap} '
            f'"," {space} "\\"arguments\\"" {gap} ":" {space} args_{i} {gap} "}}"\n'
            + _arguments_rule(tool, f"args_{i}", relaxed=relaxed, compact=compact)
        )
    calls = " | ".join(f"call_{i}" for i in range(len(tools)))
    sep = '"\\n"' if compact else "WS?"
    start = f"start: call ({sep} call)*\n" if many else "start: call\n"
    if answer is not None:
        schema = json.dumps({**json.loads(answer), "x-guidance": COMPACT_JSON})
        start = f"start: call | answer\nanswer: %json {schema}\n"
    return start + f"call: {calls}\n" + "".join(rules) + "WS: /[ \\t\\n]{1,16}/\n"


def _arguments_rule(tool: Tool, rule: str, *, relaxed: bool, compact: bool) -> str:
    # `relaxed` is for schemas the compiler cannot take; a custom tool's pattern was checked
    # when the request was read, so it stays.
    schema = tool.call_schema if tool.pattern is not None or not relaxed else ANY_OBJECT
    schema = {**schema, "x-guidance": COMPACT_JSON if compact else {"whitespace_flexible": True}}
    return f"{rule}: %json {json.dumps(schema)}\n"
