"""Lark grammars, in llguidance's dialect, read into a tree of rules: the part of the dialect
that has a regex form (strings, regexes, ranges, rules, repetition, `%import common`, `%ignore`).
Anything else, such as `%json`, lexeme options or special tokens, raises `Unsupported` naming it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

MAX_DEPTH = 64  # parentheses and brackets nested in one rule

# Lark's common terminals, as llguidance defines them.
_COMMON = {
    "DIGIT": r"[0-9]",
    "HEXDIGIT": r"[a-fA-F0-9]",
    "INT": r"[0-9]+",
    "SIGNED_INT": r"(\+|-)?[0-9]+",
    "DECIMAL": r"([0-9]+\.[0-9]*)|(\.[0-9]+)",
    "_EXP": r"[eE](\+|-)?[0-9]+",
    "FLOAT": r"([0-9]+\.[0-9]*|\.[0-9]+)([eE](\+|-)?[0-9]+)?|[0-9]+[eE](\+|-)?[0-9]+",
    "SIGNED_FLOAT": r"(\+|-)?(([0-9]+\.[0-9]*|\.[0-9]+)([eE](\+|-)?[0-9]+)?|[0-9]+[eE](\+|-)?[0-9]+)",
    "NUMBER": r"([0-9]+)|([0-9]+\.[0-9]*|\.[0-9]+)([eE](\+|-)?[0-9]+)?|[0-9]+[eE](\+|-)?[0-9]+",
    "SIGNED_NUMBER": r"(\+|-)?(([0-9]+)|([0-9]+\.[0-9]*|\.[0-9]+)([eE](\+|-)?[0-9]+)?|[0-9]+[eE](\+|-)?[0-9]+)",
    "ESCAPED_STRING": r"\"([^\"\\]|\\.)*\"",
    "LCASE_LETTER": r"[a-z]",
    "UCASE_LETTER": r"[A-Z]",
    "LETTER": r"[A-Za-z]",
    "WORD": r"[A-Za-z]+",
    "CNAME": r"[_A-Za-z][_A-Za-z0-9]*",
    "WS_INLINE": r"[ \t]+",
    "WS": r"[ \t\f\r\n]+",
    "CR": r"\r",
    "LF": r"\n",
    "NEWLINE": r"(\r?\n)+",
    "SH_COMMENT": r"#[^\n]*",
    "CPP_COMMENT": r"//[^\n]*",
    "C_COMMENT": r"\/\*[^*]*\*+(?:[^/*][^*]*\*+)*\/",
    "SQL_COMMENT": r"--[^\n]*",
}


class Unsupported(ValueError):
    """The grammar has no form as one regex here; the message says why."""


# ---- the grammar's text -------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<skip>[ \t\r\f]+)|(?P<nl>\n)
    |(?P<string>"(?:\\.|[^"\\\n])*"i?)|(?P<regex>/(?:\\.|[^/\\])+/[a-z]*)
    |(?P<comment>(?://|\#)[^\n]*)|(?P<directive>%[a-z]+)
    |(?P<name>[_a-zA-Z][_a-zA-Z0-9]*(?:-[_a-zA-Z0-9]+)*)|(?P<number>[0-9]+)
    |(?P<op>->|\.\.|[^\s\w])""",
    re.VERBOSE,
)


@dataclass(frozen=True)
class _Token:
    kind: str
    text: str


def _tokens(text: str) -> list[_Token]:
    """The grammar's tokens, with line ends kept only where a statement ends (not inside
    brackets, nor before a line that goes on with `|`)."""
    out: list[_Token] = []
    depth, pos = 0, 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise Unsupported(f"cannot read the grammar at {text[pos : pos + 20]!r}")
        pos, kind = m.end(), m.lastgroup or ""
        if kind in ("skip", "comment") or (kind == "nl" and (depth or not out)):
            continue
        if kind == "op" and m.group() in "([":
            depth += 1
        elif kind == "op" and m.group() in ")]":
            depth -= 1
        elif kind == "op" and m.group() == "|":
            while out and out[-1].kind == "nl":
                out.pop()
        if not (kind == "nl" and out[-1].kind == "nl"):
            out.append(_Token(kind, m.group()))
    return out


# ---- the grammar as a tree ----------------------------------------------------------------


@dataclass(frozen=True)
class Literal:
    text: str
    insensitive: bool = False


@dataclass(frozen=True)
class Regex:
    body: str
    flags: str = ""


@dataclass(frozen=True)
class Range:
    lo: str
    hi: str


@dataclass(frozen=True)
class Ref:
    name: str


@dataclass(frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(frozen=True)
class Repeat:
    item: Node
    lo: int
    hi: int | None


Node = Literal | Regex | Range | Ref | Seq | Alt | Repeat


@dataclass
class Grammar:
    """Rules and terminals by name (the common ones imported among them), and what `%ignore`
    lets come between tokens."""

    rules: dict[str, Node]
    ignore: list[Node]


def parse(text: str) -> Grammar:
    """The grammar `text` defines; `Unsupported` for what has no regex form."""
    parser = _Parser(_tokens(text))
    grammar = Grammar({}, [])
    while parser.peek() is not None:
        if parser.take("nl"):
            continue
        if parser.at("directive"):
            parser.directive(grammar)
            continue
        name, node = parser.definition()
        if name in grammar.rules:
            raise Unsupported(f"'{name}' is defined twice")
        grammar.rules[name] = node
    return grammar


class _Parser:
    def __init__(self, tokens: list[_Token]) -> None:
        self.tokens, self.pos, self.depth = tokens, 0, 0

    def peek(self) -> _Token | None:
        return self.tokens[self.pos] if self.pos < len(self.tokens) else None

    def at(self, kind: str, text: str | None = None) -> bool:
        token = self.peek()
        return token is not None and token.kind == kind and text in (None, token.text)

    def take(self, kind: str, text: str | None = None) -> str | None:
        if not self.at(kind, text):
            return None
        self.pos += 1
        return self.tokens[self.pos - 1].text

    def expect(self, kind: str, text: str | None = None) -> str:
        taken = self.take(kind, text)
        if taken is None:
            found = self.peek()
            raise Unsupported(
                f"expected {text or kind}, found {found.text if found else 'the end'!r}"
            )
        return taken

    def definition(self) -> tuple[str, Node]:
        if not self.take("op", "?"):
            self.take("op", "!")  # `?rule` and `!rule` shape the tree, not the language
        name = self.expect("name")
        if self.at("op", "[") or self.at("op", "{"):
            raise Unsupported(
                f"'{name}' has lexeme options or parameters, which have no regex form"
            )
        if self.take("op", "."):
            self.expect("number")  # a priority: the language is the same
        self.expect("op", ":")
        node = self.alternatives()
        self.end_of_statement()
        return name, node

    def end_of_statement(self) -> None:
        if self.peek() is not None and not self.take("nl"):
            raise Unsupported(f"unexpected {self.tokens[self.pos].text!r}")

    def alternatives(self) -> Node:
        items = [self.sequence()]
        while self.take("op", "|"):
            items.append(self.sequence())
        return items[0] if len(items) == 1 else Alt(tuple(items))

    def sequence(self) -> Node:
        items: list[Node] = []
        while (token := self.peek()) and not self._ends_sequence(token):
            items.append(self.repeated(self.atom()))
        if self.take("op", "->"):
            self.expect("name")  # an alias names the tree node: the language is the same
        return items[0] if len(items) == 1 else Seq(tuple(items))

    @staticmethod
    def _ends_sequence(token: _Token) -> bool:
        return token.kind == "nl" or (token.kind == "op" and token.text in ("|", ")", "]", "->"))

    def repeated(self, node: Node) -> Node:
        op = self.take("op", "?") or self.take("op", "*") or self.take("op", "+")
        if op:
            return Repeat(node, 1 if op == "+" else 0, 1 if op == "?" else None)
        if not self.take("op", "~"):
            return node
        lo = hi = int(self.expect("number"))
        if self.take("op", ".."):
            hi = int(self.expect("number"))
        if hi < lo:
            raise Unsupported(f"the repetition ~{lo}..{hi} is empty")
        return Repeat(node, lo, hi)

    def atom(self) -> Node:
        token = self.tokens[self.pos]
        self.pos += 1
        if token.kind == "op" and token.text in ("(", "["):
            return self.group(token.text)
        if token.kind == "string":
            return self.string(token.text)
        if token.kind == "regex":
            body, _, flags = token.text[1:].rpartition("/")
            return Regex(body, flags)
        if token.kind == "name" and not self.at("op", "{"):
            return Ref(token.text)
        what = {"<": "a special token", "@": "a grammar reference"}.get(
            token.text, repr(token.text)
        )
        raise Unsupported(f"{'a template' if token.kind == 'name' else what} has no regex form")

    def group(self, opening: str) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise Unsupported(f"brackets nest more than {MAX_DEPTH} deep")
        inner = self.alternatives()
        self.expect("op", ")" if opening == "(" else "]")
        self.depth -= 1
        return inner if opening == "(" else Repeat(inner, 0, 1)

    def string(self, token: str) -> Node:
        text = _unquote(token)
        if not self.take("op", ".."):
            return Literal(text, token.endswith("i"))
        hi = _unquote(self.expect("string"))
        if len(text) != 1 or len(hi) != 1 or hi < text:
            raise Unsupported(f"{token}..{hi!r} is not a range of characters")
        return Range(text, hi)

    def directive(self, grammar: Grammar) -> None:
        keyword = self.expect("directive")
        if keyword == "%ignore":
            grammar.ignore.append(self.alternatives())
        elif keyword == "%import":
            self.imports(grammar)
        else:
            raise Unsupported(f"{keyword} has no regex form")
        self.end_of_statement()

    def imports(self, grammar: Grammar) -> None:
        if self.expect("name") != "common":
            raise Unsupported("only the common terminals can be imported")
        if self.take("op", "."):
            name = self.expect("name")
            local = self.expect("name") if self.take("op", "->") else name
            grammar.rules[local] = _common(name)
            return
        self.expect("op", "(")
        while not self.take("op", ")"):
            name = self.expect("name")
            grammar.rules[name] = _common(name)
            self.take("op", ",")


def _common(name: str) -> Regex:
    if name not in _COMMON:
        raise Unsupported(f"common.{name} is not one of the common terminals")
    return Regex(_COMMON[name])


_ESCAPE = re.compile(r"\\(?:x([0-9a-fA-F]{2})|.)")


def _hex_as_unicode(m: re.Match[str]) -> str:
    return f"\\u00{m.group(1)}" if m.group(1) else m.group()


def _unquote(token: str) -> str:
    """A string literal's text (JSON syntax, plus `\\xHH`)."""
    body = _ESCAPE.sub(_hex_as_unicode, token.removesuffix("i"))
    try:
        text: str = json.loads(body)  # quoted, by the token's pattern: a string or an error
    except ValueError as exc:
        raise Unsupported(f"cannot read the string {token}") from exc
    return text


def refs(node: Node) -> list[str]:
    """The names a node uses."""
    if isinstance(node, Ref):
        return [node.name]
    if isinstance(node, Seq | Alt):
        return [name for item in node.items for name in refs(item)]
    if isinstance(node, Repeat):
        return refs(node.item)
    return []


def is_terminal(name: str) -> bool:
    return name.lstrip("_")[:1].isupper()
