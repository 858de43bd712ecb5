"""Streaming one string field out of a JSON object as it is written.

Custom tools are offered to the model as a function with one argument, `input`; the call's
arguments arrive as JSON text (`{"input": "*** Begin Patch\\n…`). `StringField` decodes the value
of that field incrementally, so the input can stream as `custom_tool_call_input.delta`.
"""

from __future__ import annotations

import re

_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}


class StringField:
    """Feed JSON object text; get back the decoded text of one string field, as it arrives."""

    def __init__(self, key: str) -> None:
        self._opening = re.compile(r'"' + re.escape(key) + r'"\s*:\s*"')
        self._raw = ""  # the object text before the value started
        self._pending = ""  # undecoded value text (an escape may be cut)
        self.started = False
        self.closed = False

    def feed(self, text: str) -> str:
        if self.closed:
            return ""
        if not self.started:
            self._raw += text
            found = self._opening.search(self._raw)
            if found is None:
                return ""
            self.started, text = True, self._raw[found.end() :]
        self._pending += text
        return self._decode()

    def _decode(self) -> str:
        out: list[str] = []
        i, pending = 0, self._pending
        while i < len(pending):
            char = pending[i]
            if char == '"':
                self.closed = True
                break
            if char != "\\":
                out.append(char)
                i += 1
                continue
            step = self._escape(pending, i, out)
            if step == 0:
                break  # a cut escape: wait for the rest
            i += step
        self._pending = "" if self.closed else pending[i:]
        return "".join(out)

    @staticmethod
    def _escape(pending: str, i: int, out: list[str]) -> int:
        """Decode the escape at `i` into `out`; its length, or 0 if it is not complete yet.

        Unconstrained models write broken escapes too: a bad `\\u` or a lone surrogate
        decodes to U+FFFD rather than to text no UTF-8 stream can carry.
        """
        if i + 1 >= len(pending):
            return 0
        code = pending[i + 1]
        if code != "u":
            out.append(_ESCAPES.get(code, code))
            return 2
        unit = _hex4(pending, i + 2)
        if unit is None:
            if len(pending) < i + 6 and _HEX.fullmatch(pending[i + 2 :]):
                return 0
            out.append(_REPLACEMENT)
            return 2
        if not 0xD800 <= unit < 0xE000:
            out.append(chr(unit))
            return 6
        return _surrogates(pending, i, unit, out)


def _surrogates(pending: str, i: int, unit: int, out: list[str]) -> int:
    """A high surrogate and the low one that must follow it as a second escape: one character."""
    if unit < 0xDC00:
        second = pending[i + 6 : i + 12]
        if len(second) < 6 and "\\u".startswith(second[:2]):
            return 0  # the second escape may still be on its way
        low = _hex4(second, 2) if second.startswith("\\u") else None
        if low is not None and 0xDC00 <= low < 0xE000:
            out.append(chr(0x10000 + ((unit - 0xD800) << 10) + (low - 0xDC00)))
            return 12
    out.append(_REPLACEMENT)
    return 6


_HEX = re.compile(r"[0-9A-Fa-f]{0,4}")
_REPLACEMENT = "\ufffd"


def _hex4(text: str, at: int) -> int | None:
    digits = text[at : at + 4]
    return int(digits, 16) if len(digits) == 4 and _HEX.fullmatch(digits) else None
