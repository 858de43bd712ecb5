"""`Family`: what a model family writes, and the plan the embedded engine runs for a request."""

from __future__ import annotations

from oars.family import THINK_TAGS, Family, GrammarKind, family_of, template_switches
from oars.generation import ChatMessage, EngineRequest, OutputFormat
from oars.parsing import SegmentKind
from oars.tools import parse_tools, resolve

WEATHER = {
    "type": "function",
    "name": "get_weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
}
SMALL_QWEN = Family("hermes", guards=True)
ANSWER = OutputFormat({"type": "object", "properties": {"a": {"type": "integer"}}})


def _request(
    choice: str = "auto", *, output: OutputFormat | None = None, after_output: bool = False
) -> EngineRequest:
    tools = resolve(parse_tools([WEATHER]), choice)
    return EngineRequest(
        (ChatMessage("user", "q"),), tools=tools, output=output, after_tool_output=after_output
    )


def test_families_are_read_from_chat_templates() -> None:
    assert family_of("{{ '<tool_call>' }}") == Family("hermes", None, guards=True)
    assert family_of("<think>{{ x }}<function=") == Family("qwen3_coder", THINK_TAGS)
    assert family_of("<|channel|>").calls == "harmony"
    assert family_of("<|channel|>", "hermes").calls == "hermes"  # the operator's word wins


def test_hermes_calls_are_lazy_in_auto_and_forced_from_the_first_token() -> None:
    lazy = SMALL_QWEN.plan(_request()).constraint
    assert lazy is not None and lazy.kind is GrammarKind.LARK and len(lazy.triggers) == 2
    forced = SMALL_QWEN.plan(_request("required")).constraint
    assert forced is not None and forced.triggers == ()
    capable = Family("hermes").plan(_request()).constraint
    assert capable is not None and capable.triggers == (r"<tool_call>\s*(\{)",)  # tags only


def test_families_with_their_own_call_syntax_get_no_call_grammar() -> None:
    for calls in ("qwen3_coder", "harmony"):
        family = Family(calls)
        assert family.plan(_request("required")).constraint is None
        json_only = family.plan(_request(output=ANSWER)).constraint
        assert json_only is not None and json_only.kind is GrammarKind.JSON_SCHEMA


def test_the_small_model_guards_apply_only_to_families_that_need_them() -> None:
    plan = SMALL_QWEN.plan(_request(after_output=True))
    assert "{" in plan.opening_ban and "`" in plan.opening_ban
    assert Family("hermes").plan(_request(after_output=True)).opening_ban == ()
    answer = SMALL_QWEN.plan(_request(output=ANSWER, after_output=True))
    assert answer.tools.mode == "none" and answer.constraint is not None
    assert answer.constraint.kind is GrammarKind.JSON_SCHEMA
    either = Family("hermes").plan(_request(output=ANSWER, after_output=True)).constraint
    assert either is not None and "start: call | answer" in either.source


def test_parser_reads_the_family_syntax_for_the_callable_tools() -> None:
    tools = resolve(parse_tools([WEATHER]), "auto")
    text = '<think>hm</think><tool_call>{"name": "get_weather", "arguments": {}}</tool_call>'
    parser = Family("hermes", THINK_TAGS).parser(tools)
    kinds = [s.kind for s in parser.feed(text) + parser.finish()]
    assert kinds[0] is SegmentKind.REASONING and SegmentKind.CALL_START in kinds
    plain = Family(None).parser(tools)
    assert [s.kind for s in plain.feed(text) + plain.finish()] == [SegmentKind.TEXT]


def test_reasoning_effort_becomes_template_switches() -> None:
    assert template_switches(None) == {}
    assert template_switches("none") == {"enable_thinking": False}
    assert template_switches("xhigh") == {"enable_thinking": True, "reasoning_effort": "high"}


def test_other_families_keep_their_calls_beside_a_json_format() -> None:
    plan = Family("qwen3_coder").plan(_request(output=ANSWER))
    assert plan.tools.mode == "auto" and plan.constraint is not None
    assert plan.constraint.kind is GrammarKind.JSON_SCHEMA
