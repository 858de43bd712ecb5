"""A custom tool's grammar holds its input through llguidance's JSON string `pattern`: checked
against llguidance itself, driven byte by byte without a model."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oars.errors import InvalidRequest
from oars.families.hermes import call_grammar
from oars.input_pattern import input_pattern
from oars.tools import parse_tools

llguidance = pytest.importorskip("llguidance")

APPLY_PATCH = (
    Path(__file__).parent.parent / "fixtures" / "grammars" / "apply_patch.lark"
).read_text()


@cache
def _tokenizer() -> Any:
    return llguidance.LLTokenizer("byte")


@cache
def _matcher(grammar: str) -> Any:
    matcher = llguidance.LLMatcher(_tokenizer(), grammar, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _accepts(grammar: str, text: str) -> bool:
    matcher = _matcher(grammar).deep_copy()
    ok = matcher.consume_tokens(_tokenizer().tokenize_bytes(text.encode()))
    return bool(ok and not matcher.is_error() and matcher.is_accepting())


def _tool(definition: str, syntax: str = "lark") -> dict[str, Any]:
    return {
        "type": "custom",
        "name": "apply_patch",
        "format": {"type": "grammar", "syntax": syntax, "definition": definition},
    }


@cache
def _call_grammar(definition: str, syntax: str = "lark") -> str:
    source = call_grammar(parse_tools([_tool(definition, syntax)]), many=False, compact=True)
    return str(llguidance.LLMatcher.grammar_from_lark(source))


def _call(text: str) -> str:
    """A call as the model writes it; llguidance escapes DEL, which `json.dumps` leaves."""
    call = json.dumps({"name": "apply_patch", "arguments": {"input": text}}, ensure_ascii=False)
    return call.replace("\x7f", "\\u007f")


def writes(definition: str, text: str, syntax: str = "lark") -> bool:
    """The model may write `text` as the input of a forced call to the tool."""
    return _accepts(_call_grammar(definition, syntax), _call(text))


def agrees(definition: str, text: str) -> bool:
    """The grammar takes `text` as a call's input exactly when llguidance takes it as text."""
    original = str(llguidance.LLMatcher.grammar_from_lark(definition))
    expected = _accepts(original, text)
    assert writes(definition, text) == expected, text
    return expected


PATCH_ADD = (
    "*** Begin Patch\n"
    "*** Add File: src/say.py\n"
    '+def say(x):\n+\tprint("he said \\"hi\\"", x)  # C:\\path\\to\n+\n'
    "*** End Patch\n"
)
PATCH_UPDATE = (
    "*** Begin Patch\n"
    "*** Update File: a/b.txt\n"
    "*** Move to: a/c.txt\n"
    "@@ def main():\n"
    ' \tx = "1"\n'
    '-\ty = "\\\\"\n'
    "+\ty = '\\\\'\n"
    "@@\n"
    " end\n"
    "*** End of File\n"
    "*** Delete File: old name.txt\n"
    "*** End Patch"
)
PATCHES = [
    PATCH_ADD,
    PATCH_UPDATE,
    "*** Begin Patch\n*** Delete File: x\n*** End Patch\n",
    "*** Begin Patch\n*** Update File: x\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: x\n+\x00\x1f\x7f\u2028é😀\r\n*** End Patch\n",
]
NOT_PATCHES = [
    "",
    "*** Begin Patch\n*** End Patch\n",  # no hunk
    "*** Begin Patch\n*** Add File: x\n*** End Patch\n",  # an added file without lines
    "*** Begin Patch\n*** Add File: \n+a\n*** End Patch\n",  # no file name
    "*** Begin Patch\n*** Update File: x\nno prefix\n*** End Patch\n",
    "*** Begin Patch\n*** Delete File: x\n*** End Patch\n\n",
    PATCH_ADD.replace("+def", "def"),
    PATCH_ADD[:-1] + "\t",
]


@pytest.mark.parametrize("patch", PATCHES)
def test_a_patch_is_written_json_escaped(patch: str) -> None:
    assert writes(APPLY_PATCH, patch)
    assert agrees(APPLY_PATCH, patch)


@pytest.mark.parametrize("text", NOT_PATCHES)
def test_what_is_no_patch_cannot_be_written(text: str) -> None:
    assert not writes(APPLY_PATCH, text)
    assert not agrees(APPLY_PATCH, text)


def test_only_the_canonical_escaping_is_written() -> None:
    """One way to write each character, the way `json.dumps` does: a quote is `\\"`, never
    `\\u0022`; a raw newline, not escaped, ends nothing but the call."""
    grammar = _call_grammar(APPLY_PATCH)
    call = _call(PATCH_ADD)
    assert _accepts(grammar, call)
    for canonical, other in [
        ('print(\\"', "print(\\u0022"),
        ("\\n", "\n"),
        (" File", "\\u0020File"),
    ]:
        assert canonical in call and not _accepts(grammar, call.replace(canonical, other, 1))


QUOTES = r"""start: "say \"hi\"" SEP "back\\slash" ["\t" TAIL]
SEP: /[\t ]{1,2}/
TAIL: /(?:\\[nt]|[a-c])*/
"""
TABS = r"""?start: row+
row: cell ("\t" cell)* NEWLINE
cell: /[a-z0-9]*/ | "\"" /[^\t\r\n"]+/ "\""
%import common.NEWLINE
"""
RANGES = """start: WS_INLINE? INT ("a".."c")~2 _NL
_NL: NEWLINE
%import common (WS_INLINE, INT, NEWLINE)
"""
SMALL = {
    "quotes": (
        QUOTES,
        ['say "hi"\tback\\slash', 'say "hi" \tback\\slash\t\\nab\\t'],
        ['say "hi"back\\slash', 'say "hi"   back\\slash', 'say "hi" back\\slash\t\\x'],
    ),
    "tabs": (
        TABS,
        ["a\tb\n", "\t\n", 'x\t"q \\ "\r\n1\n', "a\r\n\n"],
        ["", "a\tb", "A\n", '"\t"\n', "a\r", '"a""\n'],
    ),
    "ranges": (RANGES, ["12ab\n", " \t7cc\r\n\n", " 1ca\r\n"], ["ab\n", "1abc\n", "1ab"]),
}


@pytest.mark.parametrize("name", sorted(SMALL))
def test_literals_escapes_ranges_and_common_terminals(name: str) -> None:
    definition, valid, invalid = SMALL[name]
    assert all(agrees(definition, text) for text in valid)
    assert not any(agrees(definition, text) for text in invalid)


_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list('"\\\t\n\r\x00\x1f ,+-@*abé😀')), st.characters(codec="utf-8")
    ),
    max_size=12,
)


@st.composite
def _near(draw: st.DrawFn, samples: list[str]) -> str:
    base = draw(st.sampled_from(samples))
    start = draw(st.integers(0, len(base)))
    end = draw(st.integers(start, min(len(base), start + 3)))
    return base[:start] + draw(_TEXT) + base[end:]


@pytest.mark.parametrize("name", ["apply_patch", *sorted(SMALL)])
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_near_misses_agree_with_the_grammar_itself(name: str, data: st.DataObject) -> None:
    definition, samples = (APPLY_PATCH, PATCHES) if name == "apply_patch" else SMALL[name][:2]
    agrees(definition, data.draw(st.one_of(_TEXT, _near(samples))))


def test_ignored_terminals_come_between_tokens_only() -> None:
    definition = (
        'start: "let" NAME "=" INT+\nNAME: /[a-z]+/\n%import common (INT, WS)\n%ignore WS\n'
    )
    for text in ["let x=1", "let  x = 1 2\n", "letx=12"]:
        assert agrees(definition, text), text
    for text in ["l et x=1", "let x=", "let x = 1 a", " let x=1"]:
        assert not agrees(definition, text), text


def test_a_regex_goes_straight_into_the_pattern() -> None:
    definition = r'\d{3}-"[a-z\\]+"'
    assert input_pattern("regex", definition) == rf"^(?:{definition})$"
    assert writes(definition, '123-"ab\\c"', "regex")
    assert not writes(definition, '12-"ab"', "regex")
    assert not writes(definition, '123-"ab" ', "regex")


def test_the_call_grammar_holds_the_input_to_the_pattern() -> None:
    (tool,) = parse_tools([_tool(APPLY_PATCH)])
    source = call_grammar([tool], many=False, compact=True)
    assert tool.pattern is not None and tool.pattern.startswith("^\\*\\*\\* Begin Patch")
    assert json.dumps(tool.pattern) in source
    relaxed = call_grammar([tool], many=False, compact=True, relaxed=True)
    assert json.dumps(tool.pattern) in relaxed  # checked when read: it outlives a fallback
    assert tool.to_template()["function"]["parameters"]["properties"] == {
        "input": {"type": "string"}
    }  # the model's prompt shows no regex


CHAIN = "\n".join(["start: r0", *(f'r{i}: "a" r{i + 1} | "b"' for i in range(300)), 'r300: "z"'])
DOUBLING = "\n".join(["start: a0", *(f"a{i}: a{i + 1} a{i + 1}" for i in range(15)), "a15: /x+/"])
REFUSED = {
    "written out too long": (DOUBLING, "exceeds 131,072 characters"),
    "recursion": ('start: a\na: "(" a ")" | "x"\n', "'a' refers to itself"),
    "%json": ('start: "x" %json {"type": "object"}\n', "'%json' has no regex form"),
    "%llguidance": ('%llguidance {}\nstart: "x"\n', "%llguidance has no regex form"),
    "lexeme options": ('start: x\nx[lazy]: /.*/ "!"\n', "lexeme options"),
    "special token": ("start: <|end|>\n", "a special token"),
    "undefined": ("start: nowhere\n", "'nowhere' is used but not defined"),
    "no start": ('begin: "x"\n', "no start rule"),
    "unbalanced regex": ("start: /a)|(b/\n", "unbalanced"),
    "lookaround": ("start: /a\\bb/\n", "llguidance cannot follow it"),
    "depth": (CHAIN, "nested parentheses"),
    "terminal uses a rule": ('start: X\nX: "a" y\ny: "b"\n', "the terminal X uses the rule 'y'"),
}


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_a_grammar_that_cannot_be_followed_is_a_400(name: str) -> None:
    definition, reason = REFUSED[name]
    namespace = {
        "type": "namespace",
        "name": "ns",
        "tools": [{"type": "function", "name": "f"}, _tool(definition)],
    }
    with pytest.raises(InvalidRequest) as caught:
        parse_tools([namespace])
    assert caught.value.param == "tools[0].tools[1].format.definition"
    assert reason in caught.value.message and len(caught.value.message) < 500


@pytest.mark.parametrize(
    ("fmt", "param"),
    [
        ({"type": "grammar", "definition": "start: /x/"}, "syntax"),
        ({"type": "grammar", "syntax": "ebnf", "definition": "start: /x/"}, "syntax"),
        ({"type": "grammar", "syntax": "lark"}, "definition"),
        ({"type": "grammar", "syntax": "regex", "definition": "(a"}, "definition"),
    ],
)
def test_a_grammar_format_that_is_not_whole_is_a_400(fmt: dict[str, Any], param: str) -> None:
    with pytest.raises(InvalidRequest) as caught:
        parse_tools([{"type": "custom", "name": "t", "format": fmt}])
    assert caught.value.param == f"tools[0].format.{param}"


def test_a_free_form_custom_tool_has_no_pattern() -> None:
    for tool in (
        {"type": "custom", "name": "t"},
        {"type": "custom", "name": "t", "format": {"type": "text"}},
    ):
        assert parse_tools([tool])[0].pattern is None
