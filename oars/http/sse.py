"""Server-sent events framing: `event: <type>` + `data: <json>`, one blank line after each."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any


def encode(event: dict[str, Any]) -> bytes:
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()


async def encode_stream(events: AsyncIterator[dict[str, Any]]) -> AsyncIterator[bytes]:
    async for event in events:
        yield encode(event)
