"""Tool calls as JSON call objects: Hermes `<tool_call>{…}</tool_call>`, and the bare fallbacks.

Qwen2.5/Qwen3 and many others are prompted to write `<tool_call>\\n{"name": …, "arguments": …}
\\n</tool_call>`. Small models often drop the tags and answer with the bare object, or put it in
a ```json fence. A bare or fenced object counts as a call only when it is the start of the reply
and its `name` is one of `names`; anything else stays text. Arguments stream while the model
writes them, once the name is known.
"""

from __future__ import annotations

import enum
import json
import re

from oars.parsing.holdback import split_holdback
from oars.parsing.segments import Segment, SegmentKind

OPEN, CLOSE, FENCE = "<tool_call>", "</tool_call>", "```"
_FENCE_START = re.compile(r"```(?:json)?[ \t]*\n?\s*\{")
_FENCE_PREFIX = re.compile(r"`{1,3}(?:j(?:s(?:on?)?)?)?[ \t]*\n?\s*")
_NAME = re.compile(r'"name"\s*:\s*("(?:[^"\\]|\\.)*")')
_ARGS_KEY = re.compile(r'"(?:arguments|parameters)"\s*:\s*$')
_FIRST_KEY = re.compile(r'\s*\{\s*"((?:[^"\\]|\\.)*)"\s*:')
_CALL_KEYS = ("name", "arguments", "parameters")


class _Mode(enum.Enum):
    START = "start"  # start of the reply, or right after a bare call: a bare object may come
    TEXT = "text"
    CALL = "call"
    AFTER = "after"  # a call object just closed: drop its closing tag or fence


class _CallObject:
    """Scans one JSON call object incrementally, streaming its arguments once the name is known."""

    def __init__(self, names: frozenset[str], raw: str) -> None:
        self.names, self.raw, self.obj = names, raw, ""
        self.depth, self.in_str, self.esc = 0, False, False
        self.name: str | None = None
        self.started = False
        self.args_start: int | None = None
        self.args_end: int | None = None
        self.sent = 0  # index in obj up to which arguments were sent

    def feed(self, text: str) -> tuple[list[Segment], str | None]:
        """Segments so far, and the text after the object once it is complete (else None)."""
        for i, char in enumerate(text):
            self.obj += char
            self.raw += char
            if self._step(char):
                return self._complete(), text[i + 1 :]
        self._locate()
        return self._stream(len(self.obj)), None

    def _step(self, char: str) -> bool:
        """Advance the JSON state; True when the outer object just closed."""
        at_value = self.args_start is None and not self.in_str and self.depth == 1
        if at_value and not char.isspace() and _ARGS_KEY.search(self.obj[-64:-1]):
            self.args_start = len(self.obj) - 1
        if self.in_str:
            self.esc, self.in_str = (False, True) if self.esc else (char == "\\", char != '"')
            if not self.in_str:
                self._value_ended(len(self.obj), scalar=False)
            return False
        if char == '"':
            self.in_str = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            self._value_ended(len(self.obj), scalar=False)
            if self.depth == 0:
                self._value_ended(len(self.obj) - 1, scalar=True)
                return True
        elif char == "," and self.depth == 1:
            self._value_ended(len(self.obj) - 1, scalar=True)
        return False

    def _value_ended(self, end: int, *, scalar: bool) -> None:
        """Record where the arguments value ends, if it is the one that just ended."""
        if self.args_start is None or self.args_end is not None or end <= self.args_start:
            return
        opener = self.obj[self.args_start]
        if scalar != (opener not in '{["') or (not scalar and self.depth != 1):
            return
        self.args_end = end

    def _outside_args(self) -> str:
        if self.args_start is None:
            return self.obj
        blank = " " * ((self.args_end or len(self.obj)) - self.args_start)
        return self.obj[: self.args_start] + blank + self.obj[self.args_end or len(self.obj) :]

    def _locate(self) -> None:
        outside = self._outside_args()
        if self.name is None and (m := _NAME.search(outside)):
            self.name = str(json.loads(m.group(1)))

    def _stream(self, upto: int) -> list[Segment]:
        out: list[Segment] = []
        if self.name is None or self.name not in self.names:
            return out
        if not self.started:
            self.started = True
            out.append(Segment(SegmentKind.CALL_START, name=self.name))
        if self.args_start is None or self.obj[self.args_start] == '"':
            return out  # string-encoded arguments are decoded at the end
        end = min(upto, self.args_end if self.args_end is not None else upto)
        start = max(self.sent, self.args_start)
        if end > start:
            out.append(Segment(SegmentKind.CALL_ARGS, self.obj[start:end]))
            self.sent = end
        return out

    def _complete(self) -> list[Segment]:
        self._locate()
        if self.name not in self.names and not self.started:
            return [Segment(SegmentKind.TEXT, self.raw)]
        out = self._stream(len(self.obj))
        if self.args_start is None:
            out.append(Segment(SegmentKind.CALL_ARGS, "{}"))
        elif self.obj[self.args_start] == '"':
            value = self.obj[self.args_start : self.args_end]
            out.append(Segment(SegmentKind.CALL_ARGS, _decoded(value)))
        return [*out, Segment(SegmentKind.CALL_END)]

    def not_a_call(self) -> bool:
        """The object's first key shows it is no call (a JSON answer, say): decided early, so
        that such an object streams as text instead of waiting for its end."""
        first = _FIRST_KEY.match(self.obj)
        return not self.started and first is not None and first.group(1) not in _CALL_KEYS

    def abandon(self) -> list[Segment]:
        """The output ended inside the object: no CALL_END, the call stays unfinished."""
        self._locate()
        if not self.started and self.name not in self.names:
            return [Segment(SegmentKind.TEXT, self.raw)] if self.raw else []
        return self._stream(len(self.obj))


def _decoded(value: str) -> str:
    try:
        return str(json.loads(value))
    except json.JSONDecodeError:
        return value


class HermesParser:
    """TEXT segments in, TEXT and CALL_* segments out (run it on the answer text)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names
        self.degraded = 0  # call-like text that turned out not to be a call (the caller warns)
        self._buf = ""
        self._mode = _Mode.START if names else _Mode.TEXT
        self._call: _CallObject | None = None
        self._closer = ""
        self._steps = {  # built once: a dict of enum keys hashes each key in Python
            _Mode.START: self._start,
            _Mode.TEXT: self._text,
            _Mode.CALL: self._in_call,
            _Mode.AFTER: self._after,
        }

    def feed(self, text: str) -> list[Segment]:
        self._buf += text
        out: list[Segment] = []
        while self._buf and self._step(out):
            pass
        return out

    def _step(self, out: list[Segment]) -> bool:
        """Consume what the current mode can; False when it must wait for more text."""
        return self._steps[self._mode](out)

    def _start(self, out: list[Segment]) -> bool:
        head = self._buf.lstrip()
        if not head:
            return False
        fence = _FENCE_START.match(head)
        if head.startswith("{") or fence:
            lead = len(self._buf) - len(head) + (fence.end() - 1 if fence else 0)
            self._open_call(self._buf[:lead], FENCE if fence else "")
            self._buf = self._buf[lead:]
            return True
        prefix = _FENCE_PREFIX.fullmatch(head)
        if (prefix and head.count("`") == 3) or head in ("`", "``"):
            return False  # may still become a fenced call
        self._mode = _Mode.TEXT
        return True

    def _text(self, out: list[Segment]) -> bool:
        pos = self._buf.find(OPEN)
        if pos < 0:
            safe, self._buf = split_holdback(self._buf, (OPEN,))
            _append_text(out, safe)
            return False
        _append_text(out, self._buf[:pos])
        self._open_call(OPEN, CLOSE)
        self._buf = self._buf[pos + len(OPEN) :]
        return True

    def _open_call(self, raw: str, closer: str) -> None:
        self._call, self._closer, self._mode = _CallObject(self.names, raw), closer, _Mode.CALL

    def _in_call(self, out: list[Segment]) -> bool:
        assert self._call is not None
        head = self._buf.lstrip()
        if not self._call.obj:
            if not head:
                return False  # only whitespace after the tag yet: an object may still follow
            if not head.startswith("{"):
                self._degrade(out, self._call.raw)  # `<tool_call>` not followed by an object
                return True
        segments, rest = self._call.feed(self._buf)
        self._buf = rest or ""
        if rest is None and self._call.not_a_call():
            _append_text(out, self._call.raw)  # an object, but no call: text, streamed from here
            self._call, self._mode = None, _Mode.TEXT
            return True
        if rest is None:
            out.extend(segments)
            return False
        if segments and segments[0].kind is SegmentKind.TEXT:
            self._degrade(out, segments[0].text)
        else:
            out.extend(segments)
            self._mode = _Mode.AFTER
        self._call = None
        return True

    def _degrade(self, out: list[Segment], raw: str) -> None:
        self.degraded += 1
        _append_text(out, raw)
        self._call, self._mode = None, _Mode.TEXT

    def _after(self, out: list[Segment]) -> bool:
        head = self._buf.lstrip()
        if self._closer and head.startswith(self._closer):
            self._buf = head[len(self._closer) :]
        elif self._closer and (not head or self._closer.startswith(head)):
            return False
        self._mode = _Mode.TEXT if self._closer == CLOSE else _Mode.START
        return True

    def finish(self) -> list[Segment]:
        out: list[Segment] = []
        if self._call is not None:
            out.extend(self._call.abandon())
            if not self._call.obj:  # a tag and whitespace, no object: all of it was text
                _append_text(out, self._buf)
            self._call = None
        elif self._mode is not _Mode.AFTER:
            _append_text(out, self._buf)
        self._buf = ""
        return out


def _append_text(out: list[Segment], text: str) -> None:
    if text:
        out.append(Segment(SegmentKind.TEXT, text))
