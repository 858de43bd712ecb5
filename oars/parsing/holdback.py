"""Holding back text that might be the start of a tag split across chunks."""

from __future__ import annotations


def split_holdback(buffer: str, tags: tuple[str, ...]) -> tuple[str, str]:
    """Split `buffer` into (safe, held): `held` is the longest suffix that is a proper prefix of a tag.

    Text in `safe` can be emitted now: no tag can start inside it and still be incomplete.
    """
    longest = max((len(t) for t in tags), default=0)
    for size in range(min(len(buffer), longest - 1), 0, -1):
        tail = buffer[-size:]
        if any(tag.startswith(tail) for tag in tags):
            return buffer[:-size], tail
    return buffer, ""
