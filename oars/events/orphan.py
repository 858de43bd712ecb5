"""The ending of a response whose replica died: written by whoever notices, from its log alone.

What the dead replica logged stays. The builder, replayed from the log (`oars.events.replay`),
ends it as it would have: what the log lacks of `response.created` and `response.in_progress`
first, the open item closed (its open content part's `.done` events, a listing's `.failed`, then
`output_item.done` with status `incomplete`), then `error` and `response.failed`, whose output
is every item the log finished and the one it closed.
"""

from __future__ import annotations

from typing import Any

from oars.events.builder import Event
from oars.events.replay import replay

MESSAGE = "The server running this response stopped before it finished."


def orphan_ending(
    logged: list[Event], snapshot: dict[str, Any], *, streamed: bool
) -> tuple[list[Event], dict[str, Any]]:
    """The events to append to `logged` (none when the response kept no log) and the final
    snapshot of a response that ends `failed` because its replica died."""
    builder = replay(logged, snapshot)
    ending = builder.start() + builder.fail(MESSAGE)
    return (ending if streamed else []), builder.response
