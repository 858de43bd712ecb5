"""json_string_grammar: checked against llguidance itself, driven byte by byte without a model."""

from __future__ import annotations

import json
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from oars.json_lark import json_string_grammar

llguidance = pytest.importorskip("llguidance")

APPLY_PATCH = r"""start: begin_patch hunk+ end_patch
begin_patch: "*** Begin Patch" LF
end_patch: "*** End Patch" LF?

hunk: add_hunk | delete_hunk | update_hunk
add_hunk: "*** Add File: " filename LF add_line+
delete_hunk: "*** Delete File: " filename LF
update_hunk: "*** Update File: " filename LF change_move? change?

filename: /(.+)/
add_line: "+" /(.*)/ LF -> line

change_move: "*** Move to: " filename LF
change: (change_context | change_line)+ eof_line?
change_context: ("@@" | "@@ " /(.+)/) LF
change_line: ("+" | "-" | " ") /(.*)/ LF
eof_line: "*** End of File" LF

%import common.LF
"""

NEGATED = r"""start: item ("," item)*
item: /[^,"\\\n]+/ | QUOTED
// a quoted item may hold anything but a raw quote
QUOTED: "\"" /[^"]*/ "\""
"""

QUOTES = r"""start: "say \"hi\"" SEP "back\\slash" ["\t" TAIL]
SEP: /[\t ]{1,2}/
TAIL: /(?:\\[nt]|[a-c])*/
"""

TABS = r"""?start: row+
row: cell ("\t" cell)* NEWLINE
cell: /[a-z0-9]*/ | "\"" /[^\t\r\n"]+/ "\""
%import common.NEWLINE
"""

GRAMMARS = {"apply_patch": APPLY_PATCH, "negated": NEGATED, "quotes": QUOTES, "tabs": TABS}


@cache
def _tokenizer() -> Any:
    return llguidance.LLTokenizer("byte")


@cache
def _matcher(grammar: str) -> Any:
    m = llguidance.LLMatcher(_tokenizer(), grammar, log_level=0)
    assert not m.is_error(), m.get_error()
    return m


def accepts(grammar: str, s: str) -> bool:
    m = _matcher(grammar).deep_copy()
    tokens = _tokenizer().tokenize_bytes(s.encode("utf-8"))
    ok = m.consume_tokens(tokens)
    return bool(ok and not m.is_error() and m.is_accepting())


@cache
def _escaped(grammar: str) -> str:
    rules = json_string_grammar(grammar, "p0_")
    assert rules is not None
    return "start: p0_start\n" + rules


def check(grammar: str, s: str) -> bool:
    expected = accepts(grammar, s)
    assert accepts(_escaped(grammar), json.dumps(s, ensure_ascii=False)[1:-1]) == expected, s
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
PATCH_SAMPLES = [
    PATCH_ADD,
    PATCH_UPDATE,
    "*** Begin Patch\n*** Delete File: x\n*** End Patch\n",
    "*** Begin Patch\n*** Update File: x\n*** End Patch\n",
    "*** Begin Patch\n*** Add File: x\n+\x00\x1f\x7f\u2028é😀\r\n*** End Patch\n",
]
PATCH_INVALID = [
    "",
    "*** Begin Patch\n*** End Patch\n",  # no hunk
    "*** Begin Patch\n*** Add File: x\n*** End Patch\n",  # add without lines
    "*** Begin Patch\n*** Add File: \n+a\n*** End Patch\n",  # empty file name
    "*** Begin Patch\n*** Update File: x\nno prefix\n*** End Patch\n",
    "*** Begin Patch\n*** Delete File: x\n*** End Patch\n\n",
    PATCH_ADD.replace("+def", "def"),
    PATCH_ADD[:-1] + "\t",
]


@pytest.mark.parametrize("s", PATCH_SAMPLES)
def test_apply_patch_valid(s: str) -> None:
    assert check(APPLY_PATCH, s)


@pytest.mark.parametrize("s", PATCH_INVALID)
def test_apply_patch_invalid(s: str) -> None:
    assert not check(APPLY_PATCH, s)


SMALL_CASES = {
    "negated": (
        ["a", "a,b c", '"x,\\y\n\t"', '""', 'é,"😀"'],
        ["", "a,", ",a", 'a"b', "a\\b", "a\nb", '"x"y'],
    ),
    "quotes": (
        ['say "hi"\tback\\slash', 'say "hi" \tback\\slash\t\\nab\\t', 'say "hi"  back\\slash\t'],
        ['say "hi"back\\slash', 'say "hi"   back\\slash', 'say "hi" back\\slash\t\\x', "say hi"],
    ),
    "tabs": (
        ["a\tb\n", "\t\n", 'x\t"q \\ "\r\n1\n', "a\r\n\n"],
        ["", "a\tb", "A\n", '"\t"\n', "a\r", '"a""\n'],
    ),
}


@pytest.mark.parametrize("name", sorted(SMALL_CASES))
def test_small_grammars(name: str) -> None:
    valid, invalid = SMALL_CASES[name]
    for s in valid:
        assert check(GRAMMARS[name], s), s
    for s in invalid:
        assert not check(GRAMMARS[name], s), s


_TEXT = st.text(
    alphabet=st.one_of(
        st.sampled_from(list('"\\\t\n\r\x00\x1f ,+-@*abé😀')),
        st.characters(codec="utf-8"),
    ),
    max_size=12,
)


@st.composite
def _near_valid(draw: st.DrawFn, grammar: str) -> str:
    samples = {
        "apply_patch": PATCH_SAMPLES,
        "negated": SMALL_CASES["negated"][0],
        "quotes": SMALL_CASES["quotes"][0],
        "tabs": SMALL_CASES["tabs"][0],
    }[grammar]
    base = draw(st.sampled_from(samples))
    if draw(st.booleans()):
        return base
    i = draw(st.integers(0, len(base)))
    j = draw(st.integers(i, min(len(base), i + 3)))
    return base[:i] + draw(_TEXT) + base[j:]


@pytest.mark.parametrize("name", sorted(GRAMMARS))
@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_agrees_with_original(name: str, data: st.DataObject) -> None:
    s = data.draw(st.one_of(_TEXT, _near_valid(name)))
    check(GRAMMARS[name], s)


def test_start_rule_and_prefix() -> None:
    rules = json_string_grammar(APPLY_PATCH, "p3_")
    assert rules is not None
    assert rules.startswith("p3_start:")
    for line in rules.splitlines():
        assert line.startswith(("p3_", "P3_"))


@pytest.mark.parametrize(
    "grammar",
    [
        'start: "a" WS\n%import common.WS\n%ignore WS\n',
        "start: NUMBER\n%import common.NUMBER_THAT_DOES_NOT_EXIST\n",
        'start: "a"\n%import other.LF\n',
        "start: /a(?=b)b/\n",
        "start: /(?i)a/\n",
        "start: /a/i\n",
        "start: /^a$/\n",
        "start: /(a)\\1/\n",
        "start: /[[a]]/\n",
        "start: /a*?/\n",
        'start: "a"i\n',
        "start: undefined_rule\n",
        'rule: "a"\n',
        "start: list{x}\n",
        "start: (\n",
        "start: /a{1,1000}/\n",
    ],
)
def test_unsupported(grammar: str) -> None:
    assert json_string_grammar(grammar, "p0_") is None


def test_common_imports_and_ranges() -> None:
    grammar = 'start: WS_INLINE? INT ("a".."c")~2 _NL\n_NL: NEWLINE\n%import common (WS_INLINE, INT, NEWLINE)\n'
    for s in ["12ab\n", " \t7cc\r\n\n", "ab\n", "1abc\n", "1ab"]:
        check(grammar, s)
    assert check(grammar, " 1ca\r\n")


def test_no_greedy_lexing_artifacts() -> None:
    """llguidance lexes a regex terminal greedily; the rewrite works at the parser level.

    Here the original's /[^,]+/ swallows the final "x", so llguidance rejects "abx", while
    the rewritten rules accept it (the language the grammar describes, read as a CFG).
    """
    grammar = 'start: /[^,]+/ "x"\n'
    assert not accepts(grammar, "abx")
    assert accepts(_escaped(grammar), "abx")
