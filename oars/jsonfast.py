"""Compact JSON for what goes out per token (SSE frames, the event log): orjson when it is
installed (a dependency of oars), the standard library otherwise. Both write UTF-8 as is."""

from __future__ import annotations

import json
from typing import Any

try:
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; kept for odd platforms
    orjson = None  # type: ignore[assignment]


def dumps_bytes(value: Any) -> bytes:
    if orjson is not None:
        try:
            return orjson.dumps(value)
        except TypeError:
            pass  # an integer past 64 bits, a key that is not a string: as json writes it
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def dumps(value: Any) -> str:
    return dumps_bytes(value).decode()


def loads(data: bytes | str) -> Any:
    """Parse JSON; ValueError if it is not (NaN and Infinity are read as json reads them)."""
    if orjson is not None:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # maybe NaN or Infinity, which orjson refuses
    return json.loads(data)
