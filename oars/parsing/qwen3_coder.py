"""Qwen3-Coder's XML tool calls, turned into calls with JSON object arguments.

    I'll check the weather.

    <tool_call>
    <function=get_weather>
    <parameter=location>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

becomes TEXT "I'll check the weather." and a call to `get_weather` with arguments
`{"location": "Paris", "days": 3}`. A value loses one leading and one trailing newline; it goes
in as a JSON string when the tool's schema says the parameter is a string, else as JSON when it
is a JSON number, literal, object or array (else as a string). Its type is known only once it
closes, so arguments stream one parameter at a time. Whitespace before a `<tool_call>` and after
a `</tool_call>` separates text from calls and is dropped. Markup that is not a call
(`<tool_call>` not followed by `<function=…>` naming an offered tool) stays text, as written. A
call the output ends inside is left open (no CALL_END): its arguments are not whole.
"""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping

from oars.parsing.holdback import split_holdback
from oars.parsing.segments import Segment, SegmentKind

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, END_FUNCTION = "<function=", "</function>"
PARAMETER, END_PARAMETER = "<parameter=", "</parameter>"
_VALUE_END = re.compile("|".join(re.escape(t) for t in (END_PARAMETER, END_FUNCTION, CLOSE)))
_LONGEST_END = max(len(END_PARAMETER), len(END_FUNCTION), len(CLOSE))
_NAME_END = re.compile(r"[<>\n]")


class _Mode(enum.Enum):
    TEXT = "text"
    HEAD = "head"  # inside `<tool_call>`, outside a function: `<function=…>` (or the close) next
    FUNCTION = "function"  # inside a function, between parameters
    VALUE = "value"  # inside a parameter's value


def _match_tag(head: str, prefix: str) -> tuple[int, str]:
    """Whether `head` starts with `<prefixNAME>`: (end, NAME) when it does, (0, "") when it cannot,
    (-1, "") when it may once more text comes."""
    if not head.startswith(prefix):
        return (-1 if prefix.startswith(head) else 0), ""
    stop = _NAME_END.search(head, len(prefix))
    if stop is None:
        return -1, ""
    name_end = stop.start()
    name = head[len(prefix) : name_end].strip()
    if head[name_end] != ">" or not name:
        return 0, ""
    return name_end + 1, name


def _json_value(value: str, *, is_string: bool = False) -> str:
    """A parameter's value as JSON: itself if it is JSON other than a string, else quoted."""
    if is_string:
        return json.dumps(value, ensure_ascii=False)
    try:
        parsed = json.loads(value, parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(parsed, str):
        return json.dumps(value, ensure_ascii=False)
    return value.strip()


def _no_constant(name: str) -> object:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity: Python accepts them, JSON does not


class Qwen3CoderParser:
    """TEXT and CALL_* segments from Qwen3-Coder output (run it on the answer text)."""

    def __init__(
        self,
        names: frozenset[str] | None = None,
        string_params: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        """`names`: the tools the model may call (None: any, for transcripts without a request);
        `string_params`: per tool, the parameters its schema types as strings."""
        self.names, self.string_params = names, string_params or {}
        self.degraded = 0  # call-like markup that turned out not to be a call
        self._tool = ""  # the open call's tool
        self._buffer = ""
        self._mode = _Mode.TEXT
        self._strip = False  # drop the whitespace that starts the next text (it follows a call)
        self._dropped = ""  # the whitespace dropped before the open `<tool_call>`
        self._called = False  # the open `<tool_call>` already held a function
        self._key = ""
        self._params = 0  # parameters sent for the open call
        self._scan = 0  # where to resume looking for the end of a value

    def feed(self, text: str) -> list[Segment]:
        self._buffer += text
        out: list[Segment] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Segment]) -> bool:
        """Consume what the current mode can; False when it must wait for more text."""
        return {
            _Mode.TEXT: self._text,
            _Mode.HEAD: self._head,
            _Mode.FUNCTION: self._function,
            _Mode.VALUE: self._value,
        }[self._mode](out)

    def _text(self, out: list[Segment]) -> bool:
        pos = self._buffer.find(OPEN)
        if pos < 0:
            safe, held = split_holdback(self._buffer, (OPEN,))
            body = safe.rstrip()  # trailing whitespace waits: it is dropped if a call follows
            self._buffer = safe[len(body) :] + held
            self._emit_text(body, out)
            return False
        before = self._buffer[:pos]
        body = before.rstrip()
        self._emit_text(body, out)
        self._dropped, self._called = before[len(body) :], False
        self._buffer = self._buffer[pos + len(OPEN) :]
        self._mode = _Mode.HEAD
        return True

    def _head(self, out: list[Segment]) -> bool:
        head = self._buffer.lstrip()
        if not head:
            return False
        if self._called and head.startswith(CLOSE):
            self._buffer = head[len(CLOSE) :]
            self._mode, self._strip = _Mode.TEXT, True
            return True
        end, name = _match_tag(head, FUNCTION)
        if end > 0 and self.names is not None and name not in self.names:
            end = 0  # not a tool of this request: the markup is text
        if end > 0:
            out.append(Segment(SegmentKind.CALL_START, name=name))
            self._tool = name
            self._buffer, self._mode, self._params = head[end:], _Mode.FUNCTION, 0
            return True
        if end < 0 or (self._called and CLOSE.startswith(head)):
            return False
        if self._called:  # `</tool_call>` is missing: what follows the function is text
            self._mode, self._strip = _Mode.TEXT, True
        else:
            self._degrade(out)
        return True

    def _degrade(self, out: list[Segment]) -> None:
        """`<tool_call>` did not start a call: it is text, and so is what follows."""
        self.degraded += 1
        self._emit_text(self._dropped + OPEN, out)
        self._mode = _Mode.TEXT

    def _function(self, out: list[Segment]) -> bool:
        head = self._buffer.lstrip()
        for tag in (END_FUNCTION, CLOSE):
            if head.startswith(tag):
                self._buffer = head[len(tag) :]
                self._close_call(out)
                self._mode, self._called = _Mode.HEAD, True
                if tag == CLOSE:
                    self._mode, self._strip = _Mode.TEXT, True
                return True
        end, key = _match_tag(head, PARAMETER)
        if end > 0:
            self._buffer, self._key, self._scan = head[end:], key, 0
            self._mode = _Mode.VALUE
            return True
        if not head or end < 0 or END_FUNCTION.startswith(head) or CLOSE.startswith(head):
            self._buffer = head
            return False
        skip = head.find("<", 1)  # stray text inside a function: skipped up to the next tag
        self._buffer = head[skip:] if skip > 0 else ""
        return True

    def _value(self, out: list[Segment]) -> bool:
        match = _VALUE_END.search(self._buffer, self._scan)
        if match is None:
            self._scan = max(0, len(self._buffer) - _LONGEST_END + 1)
            return False
        self._emit_parameter(self._buffer[: match.start()], out)
        closed = match.group() == END_PARAMETER  # else `</parameter>` is missing: the tag ends it
        self._buffer = self._buffer[match.end() if closed else match.start() :]
        self._mode = _Mode.FUNCTION
        return True

    def _emit_parameter(self, raw: str, out: list[Segment]) -> None:
        is_string = self._key in self.string_params.get(self._tool, ())
        value = _json_value(raw.removeprefix("\n").removesuffix("\n"), is_string=is_string)
        lead = ", " if self._params else "{"
        key = json.dumps(self._key, ensure_ascii=False)
        out.append(Segment(SegmentKind.CALL_ARGS, f"{lead}{key}: {value}"))
        self._params += 1

    def _close_call(self, out: list[Segment]) -> None:
        out.append(Segment(SegmentKind.CALL_ARGS, "}" if self._params else "{}"))
        out.append(Segment(SegmentKind.CALL_END))
        self._params = 0

    def _emit_text(self, text: str, out: list[Segment]) -> None:
        if self._strip:
            text = text.lstrip()
            if not text:
                return  # still only separator whitespace: keep stripping what comes next
            self._strip = False
        if text:
            out.append(Segment(SegmentKind.TEXT, text))

    def finish(self) -> list[Segment]:
        """Flush the held text; a call the output ended inside stays open."""
        out: list[Segment] = []
        if self._mode in (_Mode.VALUE, _Mode.FUNCTION):
            pass  # its arguments so far are out; the caller decides what an open call means
        elif self._mode is _Mode.HEAD and not self._called:
            self.degraded += 1
            self._emit_text(self._dropped + OPEN + self._buffer, out)
        elif self._mode is _Mode.TEXT:
            self._emit_text(self._buffer, out)
        elif not CLOSE.startswith(self._buffer.strip()):  # after a function, no `</tool_call>`
            self._strip = True
            self._emit_text(self._buffer, out)
        self._buffer, self._mode = "", _Mode.TEXT
        return out
