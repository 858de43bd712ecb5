"""Citation markers in a model's text: `【n】` (or `【n†name】`) names the file search result the
model was shown as `n`; the marker leaves the text, and what remains of the citation is where it
stood (the Responses API's `file_citation` has an `index`, no span).

`Marks.feed(text)` returns the text that is safe to show and the markers found, in order;
a possible marker is held back until it closes, or until it cannot be one (too long, a line
break, a second `【`), when it is text after all. `finish()` releases what is held. Pure and
incremental: whatever the chunking, the pieces join to the same text and the same markers.
"""

from __future__ import annotations

from dataclasses import dataclass

OPEN, CLOSE, NAME = "【", "】", "†"
MAX_MARKER = 64  # characters from `【` to `】`: longer is not a marker


@dataclass(frozen=True)
class Cited:
    """A marker, at `index`: the characters of text before it (this feed's and every earlier)."""

    handle: str
    index: int


class Marks:
    """The incremental filter of one text part (see the module's docstring)."""

    def __init__(self) -> None:
        self._held = ""  # a possible marker, from its `【`
        self._shown = 0  # characters of text returned so far

    def feed(self, text: str) -> tuple[str, list[Cited]]:
        """The text `text` releases (markers taken out) and the markers it closed."""
        buffer, self._held = self._held + text, ""
        shown: list[str] = []
        cited: list[Cited] = []
        start = 0
        while (opened := buffer.find(OPEN, start)) >= 0:
            shown.append(buffer[start:opened])
            self._shown += opened - start
            end = _marker_end(buffer, opened)
            if end is None:  # it may still close
                self._held = buffer[opened:]
                return "".join(shown), cited
            if end < 0:  # it cannot: its `【` is text
                shown.append(OPEN)
                self._shown += 1
                start = opened + 1
                continue
            handle = buffer[opened + 1 : end].split(NAME, 1)[0].strip()
            cited.append(Cited(handle, self._shown))
            start = end + 1
        shown.append(buffer[start:])
        self._shown += len(buffer) - start
        return "".join(shown), cited

    def finish(self) -> str:
        """What is held, as text: the part ended before the marker closed."""
        held, self._held = self._held, ""
        self._shown += len(held)
        return held


def _marker_end(buffer: str, opened: int) -> int | None:
    """Where the marker opened at `opened` closes (its `】`); None: not yet known; -1: it is not
    a marker."""
    for i in range(opened + 1, min(len(buffer), opened + MAX_MARKER)):
        char = buffer[i]
        if char == CLOSE:
            return i if i > opened + 1 else -1
        if char in (OPEN, "\n"):
            return -1
    return None if len(buffer) < opened + MAX_MARKER else -1
