"""Holding back text that might be the start of a tag split across chunks."""

from __future__ import annotations


def split_holdback(buffer: str, tags: tuple[str, ...]) -> tuple[str, str]:
    """Split `buffer` into (safe, held): `held` is the longest suffix that is a proper prefix of a tag.

    Text in `safe` can be emitted now: no tag can start inside it and still be incomplete.
    """
    longest = max((len(t) for t in tags), default=0)
    # It runs on every token of a stream: only the places where a tag's first character occurs
    # in the last `longest - 1` characters are tried (usually none), by `str.find`.
    start = max(len(buffer) - longest + 1, 0)
    while True:
        found = [p for p in (buffer.find(tag[0], start) for tag in tags if tag) if p >= 0]
        if not found:
            return buffer, ""
        start = min(found)
        tail = buffer[start:]
        if any(tag.startswith(tail) for tag in tags):
            return buffer[:start], tail
        start += 1
