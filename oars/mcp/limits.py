"""How long an MCP server may take, and how much of a result the model gets: a module of its
own, free of the SDK, so that the server's settings can name these defaults without loading it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """How long a server may take, and how much of a result the model gets."""

    connect_seconds: float = 10.0
    list_seconds: float = 30.0
    call_seconds: float = 60.0
    max_output_chars: int = 65_536
