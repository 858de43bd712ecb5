"""Ids: a prefix that says what the thing is, and 48 random hex digits."""

from __future__ import annotations

import secrets


def new_id(prefix: str, sep: str = "_") -> str:
    """`resp_…`; OpenAI's files are `file-…` (`sep="-"`)."""
    return f"{prefix}{sep}{secrets.token_hex(24)}"


MAX_ID_LENGTH = 200  # what the store keeps for any id


def is_id(value: object) -> bool:
    """A string that can name something stored: not empty, not too long, no NUL."""
    return isinstance(value, str) and 0 < len(value) <= MAX_ID_LENGTH and "\x00" not in value
