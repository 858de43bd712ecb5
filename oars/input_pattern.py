"""A custom tool's input grammar as one regular expression: the `pattern` of a JSON string.

The model writes a custom tool's input inside a JSON string (`{"input": "…"}`), so the grammar
must hold for the string's content once unescaped. llguidance does that for a regex:
`%json {"type": "string", "pattern": …}` matches the JSON strings whose content the pattern
matches, each character escaped the one way `json.dumps(…, ensure_ascii=False)` does (except
DEL, written `\\u007f`), and the string is one lexeme, so a mask costs a fraction of a
millisecond. A Lark grammar is therefore flattened into one regex, every rule written out
where it is used.

That takes the grammars tools send (Codex's `apply_patch`: terminals and rules that never refer
back to themselves), not every Lark grammar: a rule that refers to itself describes a language
no regex can, and llguidance's own additions (`%json`, lexeme options, special tokens) have no
regex form. Those raise `Unsupported`, for a 400: a grammar is never dropped in silence. Read as
one regex, a grammar means the language it describes: where llguidance's lexer commits greedily
to a terminal (`start: /[^,]+/ "x"` refuses "abx"), the regex does not.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from oars.lark_grammar import (
    Alt,
    Grammar,
    Literal,
    Node,
    Range,
    Ref,
    Regex,
    Seq,
    Unsupported,
    is_terminal,
    parse,
    refs,
)

__all__ = ["MAX_PATTERN", "Unsupported", "input_pattern"]

MAX_PATTERN = 131_072  # characters of regex a grammar may become (inlining repeats rules)


def input_pattern(syntax: str, definition: str) -> str:
    """The anchored regex a custom tool's input must match; `syntax` is "lark" or "regex"."""
    if syntax == "regex":
        _check_regex(definition)
        pattern = f"^(?:{definition})$"
    else:
        pattern = f"^{_flatten(parse(definition))}$"
    _check_llguidance(pattern)
    return pattern


# ---- the tree as one regex ----------------------------------------------------------------

_ALT, _SEQ, _ATOM = 0, 1, 2  # how tightly a piece of regex binds
_META = set("\\.+*?()|[]{}^$#&-~")


@dataclass(frozen=True)
class _Rx:
    text: str
    binds: int

    def at_least(self, binds: int) -> str:
        return self.text if self.binds >= binds else f"(?:{self.text})"


def _rx(text: str, binds: int) -> _Rx:
    if len(text) > MAX_PATTERN:
        raise Unsupported(
            f"written out as one regex the grammar exceeds {MAX_PATTERN:,} characters"
        )
    return _Rx(text, binds)


def _char(c: str, *, in_class: bool = False) -> str:
    if in_class or not c.isprintable() or (c.isspace() and c != " "):
        return f"\\x{{{ord(c):x}}}"
    return "\\" + c if c in _META else c


def _flatten(grammar: Grammar) -> str:
    """Terminals first (they use only terminals), then `%ignore`, then rules, each written
    once and pasted where it is used."""
    if "start" not in grammar.rules:
        raise Unsupported("the grammar has no start rule")
    ignored = Alt(tuple(grammar.ignore))
    if not all(is_terminal(name) for name in refs(ignored)):
        raise Unsupported("%ignore may name terminals only")
    order = _order(grammar.rules, ["start", *refs(ignored)])
    done: dict[str, _Rx] = {}
    for name in filter(is_terminal, order):
        done[name] = _Writer(done, "").write(grammar.rules[name])
    gap = _Writer(done, "").write(ignored).at_least(_ATOM) + "*" if grammar.ignore else ""
    for name in itertools.filterfalse(is_terminal, order):
        done[name] = _Writer(done, gap).write(grammar.rules[name])
    # As llguidance reads `%ignore`: after any token, and not before the first.
    return f"{done['start'].at_least(_SEQ)}{gap}"


def _order(rules: dict[str, Node], roots: list[str]) -> list[str]:
    """The rules `roots` use, each after the rules it uses; `Unsupported` on a cycle."""
    order: list[str] = []
    state: dict[str, str] = {}
    stack = [(name, False) for name in roots]
    while stack:
        name, finished = stack.pop()
        if finished:
            state[name] = "done"
            order.append(name)
            continue
        if state.get(name) == "done":
            continue
        if name not in rules:
            raise Unsupported(f"'{name}' is used but not defined")
        state[name] = "open"
        stack.append((name, True))
        for ref in refs(rules[name]):
            if state.get(ref) == "open":
                raise Unsupported(
                    f"'{ref}' refers to itself, which no regular expression can describe"
                )
            if is_terminal(name) and not is_terminal(ref):
                raise Unsupported(f"the terminal {name} uses the rule '{ref}'")
            if state.get(ref) != "done":
                stack.append((ref, False))
    return order


class _Writer:
    """Writes a rule as regex; `gap` (a regex) may come between its tokens (`%ignore`)."""

    def __init__(self, done: dict[str, _Rx], gap: str) -> None:
        self.done, self.gap = done, gap

    def write(self, node: Node) -> _Rx:
        if isinstance(node, Ref):
            return self.done[node.name]
        if isinstance(node, Literal):
            return _literal(node)
        if isinstance(node, Regex):
            return _regex(node)
        if isinstance(node, Range):
            return _rx(f"[{_char(node.lo, in_class=True)}-{_char(node.hi, in_class=True)}]", _ATOM)
        if isinstance(node, Alt):
            return _rx("|".join(self.write(i).text for i in node.items), _ALT)
        if isinstance(node, Seq):
            parts = [self.write(i).at_least(_SEQ) for i in node.items]
            return _rx(self.gap.join(parts), _SEQ)
        return self.repeat(self.write(node.item).at_least(_ATOM), node.lo, node.hi)

    def repeat(self, item: str, lo: int, hi: int | None) -> _Rx:
        if hi == 0:
            return _rx("(?:)", _ATOM)
        if not self.gap:
            return _rx(item + _count(lo, hi), _SEQ)
        more = f"(?:{self.gap}{item}){_count(max(lo - 1, 0), None if hi is None else hi - 1)}"
        return _rx(f"{item}{more}" if lo else f"(?:{item}{more})?", _SEQ)


def _count(lo: int, hi: int | None) -> str:
    if hi is None:
        return {0: "*", 1: "+"}.get(lo, f"{{{lo},}}")
    if (lo, hi) == (0, 1):
        return "?"
    return f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}"


def _literal(node: Literal) -> _Rx:
    if not node.text:
        return _rx("(?:)", _ATOM)
    text = "".join(_char(c) for c in node.text)
    if node.insensitive:
        return _rx(f"(?i:{text})", _ATOM)
    return _rx(text, _ATOM if len(node.text) == 1 else _SEQ)


def _regex(node: Regex) -> _Rx:
    if set(node.flags) - set("imsux"):
        raise Unsupported(f"the regex flags {node.flags!r} (only i, m, s, u and x)")
    _check_regex(node.body)
    # An `x` regex may end in a comment, which runs to the end of the line.
    end = "\n" if "x" in node.flags else ""
    return _rx(f"(?{node.flags}:{node.body}{end})", _ATOM)


def _check_regex(body: str) -> None:
    """A regex must hold together on its own, or putting it in a group would change what it
    means (`a)|(b` is not a regex; inside `(?:…)` it would be)."""
    depth, i, in_class = 0, 0, 0
    while i < len(body):
        c = body[i]
        if c == "\\":
            i += 1
        elif in_class:
            in_class += {"[": 1, "]": -1}.get(c, 0)
        elif c == "[":
            in_class, i = 1, i + (body[i + 1 : i + 2] == "^")
            i += body[i + 1 : i + 2] == "]"  # `[]…]` and `[^]…]`: a literal `]`
        elif c in "()":
            depth += 1 if c == "(" else -1
            if depth < 0:
                break
        i += 1
    if depth or in_class:
        raise Unsupported(f"/{body[:80]}/ is not a regular expression (unbalanced brackets)")


# ---- what llguidance says ------------------------------------------------------------------


def _check_llguidance(pattern: str) -> None:
    """Compile the pattern as llguidance will (without a tokenizer: no model needed). Where
    llguidance is not installed no engine here follows grammars, and there is nothing to check."""
    try:
        from llguidance import LLMatcher
    except ImportError:
        return
    grammar = LLMatcher.grammar_from_json_schema({"type": "string", "pattern": pattern})
    error = LLMatcher.validate_grammar(grammar)
    if error and not error.startswith("WARNING"):
        raise Unsupported(f"llguidance cannot follow it as one regex: {_reason(error)}")


def _reason(error: str) -> str:
    """llguidance's error without the pattern it quotes in full."""
    lines = [line.strip() for line in error.splitlines()]
    said = [line.removeprefix("error:").strip() for line in lines if line.startswith("error:")]
    reason = said[0] if said else lines[0]
    return reason if len(reason) <= 200 else reason[:200] + "…"
