"""Server-sent events framing: `event: <type>` + `data: <json>`, one blank line after each.

Events go out in batches: whatever a stream's log holds when its reader wakes is one write
(under load, several tokens of one stream), and a silence of `KEEPALIVE_SECONDS` is a comment
line, so that no proxy between the client and oars cuts a stream that is still working (a long
prefill is silent for tens of seconds; many load balancers close a connection idle for 60).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from oars.jsonfast import dumps_bytes

KEEPALIVE = b": keep-alive\n\n"


def encode(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return b"event: " + kind.encode() + b"\ndata: " + dumps_bytes(event) + b"\n\n"


async def encode_batches(batches: AsyncIterator[list[dict[str, Any]]]) -> AsyncIterator[bytes]:
    """One write per batch; an empty batch (a silence) is a keep-alive comment."""
    async for batch in batches:
        yield b"".join([encode(e) for e in batch]) if batch else KEEPALIVE
