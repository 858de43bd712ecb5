"""Rewrite a Lark grammar (llguidance dialect) so it matches its strings as JSON-escaped text.

A custom tool (e.g. Codex's ``apply_patch``) describes its raw input with a Lark grammar, but
the model writes that input inside a JSON string literal: ``{"input": "<escaped text>"}``.
:func:`json_string_grammar` turns the input grammar into rules that match exactly the
canonical escaping that ``json.dumps(s, ensure_ascii=False)`` produces (without the quotes).

Every escaped character ("code") is its own lexeme and all structure (including the insides
of regexes and terminal definitions) is expressed as parser rules. This is deliberate: the
JSON escapes share the prefix ``\\``, so a multi-character lexeme such as an escaped ``.*``
would have to look two bytes ahead to see where it ends (``\\`` then ``n``), which
llguidance's lexer does not do. With one code per lexeme no lexeme can outrun another.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

__all__ = ["json_string_grammar"]

_MAX_CHAR = 0x10FFFF
_MAX_REPEAT = 64

Ranges = tuple[tuple[int, int], ...]


class _Unsupported(Exception):
    """The grammar uses something outside the supported subset."""


# --- character sets (sorted, disjoint, inclusive code-point ranges) -------------------------


def _norm(ranges: list[tuple[int, int]]) -> Ranges:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return tuple(out)


def _complement(ranges: Ranges) -> Ranges:
    out: list[tuple[int, int]] = []
    nxt = 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= _MAX_CHAR:
        out.append((nxt, _MAX_CHAR))
    return tuple(out)


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    return _complement(_norm([*_complement(a), *_complement(b)]))


def _contains(ranges: Ranges, c: int) -> bool:
    return any(lo <= c <= hi for lo, hi in ranges)


_SPECIAL = [*range(0x20), ord('"'), ord("\\")]  # characters JSON must escape
_PLAIN = _complement(_norm([(0, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]))


def _code(c: int) -> str:
    """The canonical JSON escaping of one character (as json.dumps(ensure_ascii=False))."""
    return json.dumps(chr(c), ensure_ascii=False)[1:-1]


# --- expression tree -----------------------------------------------------------------------


@dataclass(frozen=True)
class _Set:  # exactly one character out of a set
    ranges: Ranges


@dataclass(frozen=True)
class _Lit:
    text: str


@dataclass(frozen=True)
class _Ref:
    name: str


@dataclass(frozen=True)
class _Seq:
    items: tuple[_Node, ...]


@dataclass(frozen=True)
class _Alt:
    items: tuple[_Node, ...]


@dataclass(frozen=True)
class _Rep:
    item: _Node
    lo: int
    hi: int | None


_Node = _Set | _Lit | _Ref | _Seq | _Alt | _Rep


# --- regex (Python `re` subset) ------------------------------------------------------------

_DIGIT = _norm([(0x30, 0x39)])
_WORD = _norm([(0x30, 0x39), (0x41, 0x5A), (0x61, 0x7A), (0x5F, 0x5F)])
_SPACE = _norm([(0x20, 0x20), (0x09, 0x0D)])
_CLASS_ESCAPES: dict[str, Ranges] = {
    "d": _DIGIT,
    "D": _complement(_DIGIT),
    "w": _WORD,
    "W": _complement(_WORD),
    "s": _SPACE,
    "S": _complement(_SPACE),
}
_CHAR_ESCAPES = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7, "0": 0}
_HEX_LEN = {"x": 2, "u": 4, "U": 8}


class _RegexParser:
    def __init__(self, src: str) -> None:
        self.s = src
        self.i = 0

    def parse(self) -> _Node:
        node = self._alt()
        if self.i != len(self.s):
            raise _Unsupported(f"regex: unexpected {self.s[self.i]!r}")
        return node

    def _peek(self) -> str:
        return self.s[self.i] if self.i < len(self.s) else ""

    def _alt(self) -> _Node:
        items = [self._seq()]
        while self._peek() == "|":
            self.i += 1
            items.append(self._seq())
        return items[0] if len(items) == 1 else _Alt(tuple(items))

    def _seq(self) -> _Node:
        items: list[_Node] = []
        while self._peek() not in ("", "|", ")"):
            items.append(self._quantified(self._atom()))
        return items[0] if len(items) == 1 else _Seq(tuple(items))

    def _quantified(self, node: _Node) -> _Node:
        while True:
            c = self._peek()
            if c in ("*", "+", "?"):
                self.i += 1
                node = _Rep(node, 1 if c == "+" else 0, None if c != "?" else 1)
            elif c == "{" and (m := re.compile(r"\{(\d+)(,(\d*))?\}").match(self.s, self.i)):
                self.i = m.end()
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                if hi is not None and hi < lo:
                    raise _Unsupported("regex: bad {m,n}")
                node = _Rep(node, lo, hi)
            else:
                return node
            if self._peek() in ("?", "+"):
                raise _Unsupported("regex: lazy/possessive quantifier")

    def _atom(self) -> _Node:
        c = self._peek()
        self.i += 1
        if c == "(":
            if self._peek() == "?":
                if self.s.startswith("?:", self.i):
                    self.i += 2
                else:
                    raise _Unsupported("regex: special group")
            node = self._alt()
            if self._peek() != ")":
                raise _Unsupported("regex: unbalanced (")
            self.i += 1
            return node
        if c == "[":
            return _Set(self._class())
        if c == ".":
            return _Set(_complement(((10, 10),)))
        if c == "\\":
            esc = self._escape(in_class=False)
            return _Set(esc) if isinstance(esc, tuple) else _Set(((esc, esc),))
        if c in ("^", "$", "*", "+", "?", ")"):
            raise _Unsupported(f"regex: {c!r}")
        return _Set(((ord(c), ord(c)),))

    def _escape(self, *, in_class: bool) -> Ranges | int:
        c = self._peek()
        if not c:
            raise _Unsupported("regex: trailing backslash")
        self.i += 1
        if c in _CLASS_ESCAPES:
            return _CLASS_ESCAPES[c]
        if c in _CHAR_ESCAPES and not (c == "0" and self._peek().isdigit()):
            return _CHAR_ESCAPES[c]
        if c == "b" and in_class:
            return 8
        if c in _HEX_LEN:
            digits = self.s[self.i : self.i + _HEX_LEN[c]]
            if len(digits) != _HEX_LEN[c] or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise _Unsupported("regex: bad hex escape")
            self.i += _HEX_LEN[c]
            value = int(digits, 16)
            if value > _MAX_CHAR:
                raise _Unsupported("regex: code point out of range")
            return value
        if c.isascii() and c.isalnum():
            raise _Unsupported(f"regex: escape \\{c}")  # anchors, backrefs, \p{..}, ...
        return ord(c)

    def _class(self) -> Ranges:
        negate = self._peek() == "^"
        if negate:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        first = True
        while True:
            c = self._peek()
            if not c:
                raise _Unsupported("regex: unterminated class")
            if c == "]" and not first:
                self.i += 1
                break
            first = False
            if c == "[" or self.s[self.i : self.i + 2] in ("&&", "--", "~~", "||"):
                raise _Unsupported("regex: nested class or set operation")
            lo = self._class_item()
            if isinstance(lo, tuple):
                ranges.extend(lo)
                continue
            if self._peek() == "-" and self.s[self.i + 1 : self.i + 2] not in ("]", ""):
                self.i += 1
                hi = self._class_item()
                if isinstance(hi, tuple) or hi < lo:
                    raise _Unsupported("regex: bad class range")
                ranges.append((lo, hi))
            else:
                ranges.append((lo, lo))
        result = _norm(ranges)
        return _complement(result) if negate else result

    def _class_item(self) -> Ranges | int:
        c = self._peek()
        self.i += 1
        if c == "\\":
            return self._escape(in_class=True)
        return ord(c)


# --- Lark grammar text ---------------------------------------------------------------------

_TOKEN = re.compile(
    r"""(?P<nl>\n)|(?P<ws>[ \t\r\f]+)|(?P<comment>//[^\n]*)|(?P<directive>%[^\n]*)
    |(?P<str>"(?:\\.|[^"\\\n])*"[a-z]*)|(?P<re>/(?:\\.|[^/\\\n])+/[a-z]*)
    |(?P<arrow>->)|(?P<name>[_a-zA-Z][_a-zA-Z0-9]*)|(?P<num>\d+)
    |(?P<op>\.\.|[:|()\[\]?*+~.!{},])""",
    re.VERBOSE,
)

_COMMON = r"""
LF: "\n"
CR: "\r"
NEWLINE: (CR? LF)+
WS: /[ \t\f\r\n]/+
WS_INLINE: (" "|/\t/)+
DIGIT: "0".."9"
INT: DIGIT+
LCASE_LETTER: "a".."z"
UCASE_LETTER: "A".."Z"
LETTER: UCASE_LETTER | LCASE_LETTER
"""


@dataclass
class _Tok:
    kind: str
    text: str
    line_start: bool


def _tokenize(text: str) -> list[_Tok]:
    toks: list[_Tok] = []
    pos = 0
    line_start = True
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise _Unsupported(f"grammar: cannot tokenize at {text[pos : pos + 20]!r}")
        pos = m.end()
        kind = m.lastgroup or ""
        if kind == "nl":
            line_start = True
        elif kind not in ("ws", "comment"):
            toks.append(_Tok(kind, m.group(), line_start))
            line_start = False
    return toks


_STR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a", "b": "\b"}
_STR_ESCAPES |= {"0": "\0", "\\": "\\", '"': '"', "'": "'"}


def _unquote(tok: str) -> str:
    if not tok.endswith('"'):
        raise _Unsupported("string literal flags")
    body = tok[1:-1]
    out: list[str] = []
    i = 0
    while i < len(body):
        c = body[i]
        i += 1
        if c != "\\":
            out.append(c)
            continue
        e = body[i]
        i += 1
        if e in _STR_ESCAPES:
            out.append(_STR_ESCAPES[e])
        elif e in _HEX_LEN:
            digits = body[i : i + _HEX_LEN[e]]
            i += _HEX_LEN[e]
            try:
                out.append(chr(int(digits, 16)))
            except ValueError as exc:
                raise _Unsupported("string: bad hex escape") from exc
        else:
            out.append("\\" + e)  # Python keeps unknown escapes verbatim
    return "".join(out)


class _GrammarParser:
    def __init__(self, toks: list[_Tok]) -> None:
        self.toks = toks
        self.i = 0

    def _peek(self, k: int = 0) -> _Tok | None:
        j = self.i + k
        return self.toks[j] if j < len(self.toks) else None

    def _is(self, text: str, k: int = 0) -> bool:
        t = self._peek(k)
        return t is not None and t.kind in ("op", "arrow") and t.text == text

    def _expect(self, text: str) -> None:
        if not self._is(text):
            raise _Unsupported(f"grammar: expected {text!r}")
        self.i += 1

    def _at_definition(self) -> bool:
        t = self._peek()
        if t is None or not t.line_start:
            return False
        k = 1 if (t.kind == "op" and t.text in ("?", "!")) else 0
        name = self._peek(k)
        return (
            name is not None
            and name.kind == "name"
            and (self._is(":", k + 1) or self._is(".", k + 1))
        )

    def definitions(self) -> list[tuple[str, _Node]]:
        defs: list[tuple[str, _Node]] = []
        while self._peek() is not None:
            if not self._at_definition():
                raise _Unsupported(f"grammar: unexpected {self.toks[self.i].text!r}")
            if self._is("?") or self._is("!"):
                self.i += 1
            name = self.toks[self.i].text
            self.i += 1
            if self._is("."):  # priority: does not change the language
                self.i += 1
                t = self._peek()
                if t is None or t.kind != "num":
                    raise _Unsupported("grammar: bad priority")
                self.i += 1
            self._expect(":")
            defs.append((name, self._expansions()))
        return defs

    def _expansions(self) -> _Node:
        items = [self._alias_expansion()]
        while self._is("|"):
            self.i += 1
            items.append(self._alias_expansion())
        return items[0] if len(items) == 1 else _Alt(tuple(items))

    def _alias_expansion(self) -> _Node:
        node = self._expansion()
        if self._is("->"):
            self.i += 1
            t = self._peek()
            if t is None or t.kind != "name":
                raise _Unsupported("grammar: bad alias")
            self.i += 1
        return node

    def _expansion(self) -> _Node:
        items: list[_Node] = []
        while True:
            t = self._peek()
            if t is None or self._at_definition():
                break
            if not (t.kind in ("str", "re", "name") or self._is("(") or self._is("[")):
                break
            items.append(self._expr())
        return items[0] if len(items) == 1 else _Seq(tuple(items))

    def _num(self) -> int:
        t = self._peek()
        if t is None or t.kind != "num":
            raise _Unsupported("grammar: expected number")
        self.i += 1
        return int(t.text)

    def _expr(self) -> _Node:
        node = self._atom()
        if self._is("?"):
            self.i += 1
            return _Rep(node, 0, 1)
        if self._is("*") or self._is("+"):
            lo = 0 if self._is("*") else 1
            self.i += 1
            return _Rep(node, lo, None)
        if self._is("~"):
            self.i += 1
            lo = self._num()
            hi = lo
            if self._is(".."):
                self.i += 1
                hi = self._num()
            if hi < lo:
                raise _Unsupported("grammar: bad ~ range")
            return _Rep(node, lo, hi)
        return node

    def _atom(self) -> _Node:
        t = self.toks[self.i]
        self.i += 1
        if t.kind == "op" and t.text in ("(", "["):
            inner = self._expansions()
            self._expect(")" if t.text == "(" else "]")
            return inner if t.text == "(" else _Rep(inner, 0, 1)
        if t.kind == "str":
            text = _unquote(t.text)
            if self._is(".."):
                self.i += 1
                end = self._peek()
                if end is None or end.kind != "str":
                    raise _Unsupported("grammar: bad range")
                self.i += 1
                hi_text = _unquote(end.text)
                if len(text) != 1 or len(hi_text) != 1 or hi_text < text:
                    raise _Unsupported("grammar: bad range")
                return _Set(((ord(text), ord(hi_text)),))
            return _Lit(text)
        if t.kind == "re":
            body, _, flags = t.text[1:].rpartition("/")
            if flags:
                raise _Unsupported("regex flags")
            return _RegexParser(body).parse()
        if t.kind == "name":
            if self._is("{"):
                raise _Unsupported("templates")
            return _Ref(t.text)
        raise _Unsupported(f"grammar: unexpected {t.text!r}")


def _directives(toks: list[_Tok]) -> tuple[list[_Tok], dict[str, str]]:
    """Drop `%import common...` lines; return the rest and {local name: common name}."""
    imports: dict[str, str] = {}
    rest: list[_Tok] = []
    for t in toks:
        if t.kind != "directive":
            rest.append(t)
            continue
        m = re.fullmatch(r"%import\s+common\.(\w+)(?:\s*->\s*(\w+))?\s*(//.*)?", t.text.strip())
        if m:
            imports[m.group(2) or m.group(1)] = m.group(1)
            continue
        m = re.fullmatch(r"%import\s+common\s*\(([\w\s,]+)\)\s*(//.*)?", t.text.strip())
        if m:
            for name in m.group(1).split(","):
                if name.strip():
                    imports[name.strip()] = name.strip()
            continue
        raise _Unsupported(f"directive {t.text.split()[0]}")
    return rest, imports


# --- emitting ------------------------------------------------------------------------------


def _lark_literal(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)  # a JSON string literal is a valid Lark literal


def _regex_char(c: int) -> str:
    ch = chr(c)
    return ch if (ch.isascii() and ch.isalnum()) else f"\\x{{{c:x}}}"


class _Emitter:
    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.terminals: dict[str, str] = {}  # regex -> terminal name

    def code_set(self, ranges: Ranges) -> str:
        if not ranges:
            raise _Unsupported("empty character set")
        if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
            return _lark_literal(_code(ranges[0][0]))
        alts: list[str] = []
        plain = _intersect(ranges, _PLAIN)
        if plain:
            parts = "".join(
                _regex_char(lo) if lo == hi else f"{_regex_char(lo)}-{_regex_char(hi)}"
                for lo, hi in plain
            )
            alts.append(f"[{parts}]")
        for c in _SPECIAL:
            if _contains(ranges, c):
                alts.append("".join(_regex_char(ord(ch)) for ch in _code(c)))
        regex = "(?:" + "|".join(alts) + ")"
        if regex not in self.terminals:
            self.terminals[regex] = f"{self.prefix.upper()}C{len(self.terminals)}"
        return self.terminals[regex]

    def expr(self, node: _Node, names: dict[str, str]) -> str:
        if isinstance(node, _Set):
            return self.code_set(node.ranges)
        if isinstance(node, _Lit):
            if not node.text:
                return '""'
            return " ".join(_lark_literal(_code(ord(c))) for c in node.text)
        if isinstance(node, _Ref):
            if node.name not in names:
                raise _Unsupported(f"undefined name {node.name}")
            return names[node.name]
        if isinstance(node, _Seq):
            if not node.items:
                return '""'
            return " ".join(self._group(i, names) for i in node.items)
        if isinstance(node, _Alt):
            return " | ".join(self.expr(i, names) for i in node.items)
        if node.lo > _MAX_REPEAT:
            raise _Unsupported("repetition too large")
        base = self._group(node.item, names, always=True)
        if node.hi is None:
            return " ".join([base] * max(node.lo - 1, 0) + [base + ("*" if node.lo == 0 else "+")])
        if node.hi > _MAX_REPEAT:
            raise _Unsupported("repetition too large")
        if node.hi == 0:
            return '""'
        out = ""
        for _ in range(node.hi - node.lo):
            out = f"[{base}{' ' + out if out else ''}]"
        return " ".join([base] * node.lo + ([out] if out else []))

    def _group(self, node: _Node, names: dict[str, str], always: bool = False) -> str:
        text = self.expr(node, names)
        simple = isinstance(node, _Ref | _Set) or (isinstance(node, _Lit) and len(node.text) == 1)
        if simple or not (always or isinstance(node, _Alt)):
            return text
        return f"({text})"


def _convert(lark: str, prefix: str) -> str:
    toks, imports = _directives(_tokenize(lark))
    defs = _GrammarParser(toks).definitions()
    common = dict(_GrammarParser(_tokenize(_COMMON)).definitions())
    table: dict[str, _Node] = {}
    for name, node in defs:
        if name in table:
            raise _Unsupported(f"duplicate definition {name}")
        table[name] = node
    pending = list(imports.items())
    while pending:
        local, name = pending.pop()
        if name not in common:
            raise _Unsupported(f"%import common.{name}")
        if local in table:
            continue
        table[local] = common[name] if local == name else _Ref(name)
        pending.extend((n, n) for n in _refs(common[name]))
        if local != name:
            pending.append((name, name))
    if "start" not in table:
        raise _Unsupported("no start rule")

    names: dict[str, str] = {}
    for name in table:
        is_terminal = name.lstrip("_")[:1].isupper()
        # terminals become rules too (see the module docstring)
        out = f"{prefix}t__{name.lower()}" if is_terminal else f"{prefix}{name}"
        if out in names.values():
            raise _Unsupported(f"name clash for {name}")
        names[name] = out

    emitter = _Emitter(prefix)
    lines: list[str] = []
    seen: set[str] = set()
    todo = ["start"]
    while todo:
        name = todo.pop(0)
        if name in seen:
            continue
        seen.add(name)
        lines.append(f"{names[name]}: {emitter.expr(table[name], names)}")
        todo.extend(r for r in _refs(table[name]) if r not in seen)
    lines.extend(f"{t}: /{rx}/" for rx, t in emitter.terminals.items())
    return "\n".join(lines) + "\n"


def _refs(node: _Node) -> list[str]:
    if isinstance(node, _Ref):
        return [node.name]
    if isinstance(node, _Seq | _Alt):
        return [r for i in node.items for r in _refs(i)]
    if isinstance(node, _Rep):
        return _refs(node.item)
    return []


def json_string_grammar(lark: str, prefix: str) -> str | None:
    """Rules matching the JSON-escaped form (no quotes) of the strings `lark` matches.

    The start rule is ``{prefix}start``; every generated name starts with `prefix` (rules) or
    ``prefix.upper()`` (terminals), so the result can be pasted into a larger grammar and
    referenced there as ``{prefix}start``. Returns None when `lark` uses something outside
    the supported subset. `prefix` must be a lowercase identifier such as ``"p0_"``.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", prefix):
        raise ValueError(f"bad prefix {prefix!r}")
    try:
        return _convert(lark, prefix)
    except (_Unsupported, RecursionError, IndexError):
        return None
