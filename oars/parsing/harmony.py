"""gpt-oss's harmony format: channelled messages, split into reasoning, text and tool calls.

A completion is a run of messages, each a header, `<|message|>`, a body and a terminator:

    <|channel|>analysis<|message|>Need the weather.<|end|>
    <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
    {"location":"Paris"}<|call|>

The first header usually lacks `<|start|>assistant` (the prompt ends with it). A header naming a
recipient (`to=X`, before or after the channel) makes the body a tool call's arguments, named X
without its `functions.` prefix, when X is a tool of the request; a body addressed to any other
recipient (a built-in `browser.search`, say) is answer text. Otherwise the `analysis` channel is
reasoning and everything else (`final`, a `commentary` preamble) is answer text. Headers and
special tokens are never output. A body ends at `<|end|>`, `<|return|>` or `<|call|>`, or where
a `<|start|>` or `<|channel|>` begins the next header without one. Output with no harmony markup
at all is text.
"""

from __future__ import annotations

import re

from oars.parsing.holdback import split_holdback
from oars.parsing.segments import Segment, SegmentKind

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
MARKERS = (START, CHANNEL, MESSAGE, CONSTRAIN, END, RETURN, CALL)
_TOKEN = re.compile("|".join(re.escape(t) for t in MARKERS))
_TERMINATORS = (END, RETURN, CALL)
_HEADER_STARTS = (START, CHANNEL)  # a body that meets one of these ended without a terminator
_CHANNEL = re.compile(r"<\|channel\|>\s*([^\s<]+)")
_RECIPIENT = re.compile(r"(?<![\w.])to=([^\s<]+)")
_PREFIX = "functions."


_PHASES = {"commentary": "commentary", "final": "final_answer"}  # channel → message phase


def _body_kind(header: str, names: frozenset[str] | None) -> tuple[SegmentKind, str]:
    """What a message's body is, from its header: (kind, the tool name of a call or the phase
    of answer text)."""
    recipient = _RECIPIENT.search(header)
    channel = _CHANNEL.search(header)
    phase = _PHASES.get(channel.group(1), "") if channel else ""
    if recipient:
        name = recipient.group(1)
        name = name.removeprefix(_PREFIX) or name
        if names is None or name in names:
            return SegmentKind.CALL_ARGS, name
        return SegmentKind.TEXT, phase  # addressed to a tool this request does not offer
    if channel and channel.group(1) == "analysis":
        return SegmentKind.REASONING, ""
    return SegmentKind.TEXT, phase


class HarmonyParser:
    """Turns a harmony completion into REASONING, TEXT and CALL_* segments."""

    def __init__(self, names: frozenset[str] | None = None) -> None:
        """`names`: the tools the model may call (None: any, for transcripts without a request)."""
        self.names = names
        self.degraded = 0  # bodies addressed to a recipient that is no tool of the request
        self._phase = ""  # of the open message's text: commentary (a preamble) or final_answer
        self._buffer = ""
        self._body: SegmentKind | None = None  # the kind of the open message's body, if any
        self._args_sent = False  # the open call has non-blank arguments out
        self._seen_markup = False

    def feed(self, text: str) -> list[Segment]:
        self._buffer += text
        out: list[Segment] = []
        while self._step(out):
            pass
        return out

    def _step(self, out: list[Segment]) -> bool:
        """Consume what can be consumed now; False when more text is needed."""
        return self._in_body(out) if self._body is not None else self._in_header(out)

    def _in_header(self, out: list[Segment]) -> bool:
        pos = self._buffer.find(MESSAGE)
        if pos < 0:
            return False
        header = self._buffer[:pos]
        kind, name = _body_kind(header, self.names)
        self._buffer = self._buffer[pos + len(MESSAGE) :]
        self._body, self._args_sent, self._seen_markup = kind, False, True
        self._phase = name if kind is SegmentKind.TEXT else ""
        if kind is SegmentKind.CALL_ARGS:
            out.append(Segment(SegmentKind.CALL_START, name=name))
        elif _RECIPIENT.search(header):
            self.degraded += 1
        return True

    def _in_body(self, out: list[Segment]) -> bool:
        match = _TOKEN.search(self._buffer)
        if match is None:
            safe, self._buffer = split_holdback(self._buffer, MARKERS)
            self._emit(safe, out)
            return False
        self._emit(self._buffer[: match.start()], out)
        token = match.group()
        if token in _TERMINATORS:
            self._buffer = self._buffer[match.end() :]
            self._close(out)
        elif token in _HEADER_STARTS:
            self._buffer = self._buffer[match.start() :]  # the next header starts here
            self._close(out)
        else:
            self._buffer = self._buffer[match.end() :]  # a stray header token: dropped
        return True

    def _emit(self, text: str, out: list[Segment]) -> None:
        if self._body is SegmentKind.CALL_ARGS and not self._args_sent:
            text = text.lstrip()  # blank before JSON means nothing; blank-only means no args
            self._args_sent = bool(text)
        if text and self._body is not None:
            out.append(Segment(self._body, text, self._phase))

    def _close(self, out: list[Segment]) -> None:
        if self._body is SegmentKind.CALL_ARGS:
            if not self._args_sent:
                out.append(Segment(SegmentKind.CALL_ARGS, "{}"))
            out.append(Segment(SegmentKind.CALL_END))
        self._body = None

    def finish(self) -> list[Segment]:
        """Flush the held text and end an open message; a call the output ended inside stays
        open (its `<|call|>` reaches the parser even where it ends generation)."""
        out: list[Segment] = []
        if self._body is not None:
            self._emit(self._buffer, out)
            if self._body is not SegmentKind.CALL_ARGS:
                self._close(out)
        elif self._is_plain_text():
            out.append(Segment(SegmentKind.TEXT, self._buffer))
        self._buffer = ""
        return out

    def _is_plain_text(self) -> bool:
        """The output had no harmony at all (not even a cut-off header): it is all answer."""
        held = self._buffer
        if self._seen_markup or _TOKEN.search(held):
            return False
        return bool(held.strip())
