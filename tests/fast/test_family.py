"""`Family`: what a model family writes, and the plan the embedded engine runs for a request."""

from __future__ import annotations

from oars.families import (
    THINK_TAGS,
    Family,
    GrammarKind,
    Hermes,
    Qwen3Coder,
    family_of,
    make,
    template_switches,
)
from oars.families.detect import parameters
from oars.families.hermes import RESULT_HINT
from oars.generation import ChatMessage, EngineRequest, OutputFormat
from oars.parsing import SegmentKind
from oars.tools import parse_tools, resolve

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SMALL_QWEN = Hermes(guards=True)
ANSWER = OutputFormat({"type": "object", "properties": {"a": {"type": "integer"}}})


def _request(
    choice: str = "auto", *, output: OutputFormat | None = None, after_output: bool = False
) -> EngineRequest:
    tools = resolve(parse_tools([WEATHER]), choice)
    return EngineRequest(
        (ChatMessage("user", "q"),), tools=tools, output=output, after_tool_output=after_output
    )


def test_families_are_read_from_chat_templates() -> None:
    assert family_of("{{ '<tool_call>' }}") == Hermes(None, guards=False)
    assert family_of("<think>{{ x }}<function=") == Qwen3Coder(THINK_TAGS)
    assert family_of("<|channel|>").name == "harmony"
    assert family_of("<|channel|>", "hermes").name == "hermes"  # the operator's word wins


def test_the_small_model_guards_follow_the_model_size_not_the_call_format() -> None:
    template = "{{ '<tool_call>' }}"
    assert family_of(template, size=parameters("0.5B")).guards
    assert not family_of(template, size=parameters("7B")).guards
    assert not family_of(template, size=None).guards  # a size the GGUF does not say
    assert not family_of(template, size=parameters("0.5B"), guards=False).guards
    assert family_of(template, size=parameters("7B"), guards=True).guards
    assert not family_of("<function=", size=parameters("0.5B")).guards  # Hermes' own workaround
    assert [parameters(s) for s in ("494M", "8x7B", "1.5b", "big")] == [4.94e8, 5.6e10, 1.5e9, None]


def test_hermes_calls_are_lazy_in_auto_and_forced_from_the_first_token() -> None:
    lazy = SMALL_QWEN.plan(_request()).constraint
    assert lazy is not None and lazy.kind is GrammarKind.LARK and len(lazy.triggers) == 2
    forced = SMALL_QWEN.plan(_request("required")).constraint
    assert forced is not None and forced.triggers == ()
    capable = Hermes().plan(_request()).constraint
    assert capable is not None and capable.triggers == (r"<tool_call>\s*(\{)",)  # tags only


def test_families_with_their_own_call_syntax_get_no_call_grammar() -> None:
    for calls in ("qwen3_coder", "harmony"):
        family = make(calls)
        assert family.plan(_request("required")).constraint is None
        json_only = family.plan(_request(output=ANSWER)).constraint
        assert json_only is not None and json_only.kind is GrammarKind.JSON_SCHEMA


def test_the_small_model_guards_apply_only_to_families_that_need_them() -> None:
    plan = SMALL_QWEN.plan(_request(after_output=True))
    assert "{" in plan.opening_ban and "`" in plan.opening_ban
    assert Hermes().plan(_request(after_output=True)).opening_ban == ()
    answer = SMALL_QWEN.plan(_request(output=ANSWER, after_output=True))
    assert answer.tools.mode == "none" and answer.constraint is not None
    assert answer.constraint.kind is GrammarKind.JSON_SCHEMA
    either = Hermes().plan(_request(output=ANSWER, after_output=True)).constraint
    assert either is not None and "start: call | answer" in either.source


def test_parser_reads_the_family_syntax_for_the_callable_tools() -> None:
    tools = resolve(parse_tools([WEATHER]), "auto")
    text = '<think>hm</think><tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    parser = Hermes(THINK_TAGS).parser(tools)
    kinds = [s.kind for s in parser.feed(text) + parser.finish()]
    assert kinds[0] is SegmentKind.REASONING and SegmentKind.CALL_START in kinds
    plain = Family().parser(tools)
    assert [s.kind for s in plain.feed(text) + plain.finish()] == [SegmentKind.TEXT]


def test_reasoning_effort_becomes_template_switches() -> None:
    assert template_switches(None) == {}
    assert template_switches("none") == {"enable_thinking": False}
    assert template_switches("xhigh") == {"enable_thinking": True, "reasoning_effort": "high"}


def test_other_families_keep_their_calls_beside_a_json_format() -> None:
    plan = Qwen3Coder().plan(_request(output=ANSWER))
    assert plan.tools.mode == "auto" and plan.constraint is not None
    assert plan.constraint.kind is GrammarKind.JSON_SCHEMA


def test_the_guards_end_each_tool_result_with_a_hint_to_answer() -> None:
    messages = (
        ChatMessage("user", "q"),
        ChatMessage("assistant", "", tool_calls=({"type": "function", "id": "c"},)),
        ChatMessage("tool", "18C", tool_call_id="c"),
    )
    request = EngineRequest(messages, after_tool_output=True)
    hinted = Hermes(guards=True).plan(request).messages
    assert hinted[-1].content == f"18C\n\n{RESULT_HINT}" and hinted[:2] == messages[:2]
    assert Hermes().plan(request).messages == messages
    assert Qwen3Coder().plan(request).messages == messages
