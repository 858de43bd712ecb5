"""Ids: a prefix that says what the thing is, and 48 random hex digits."""

from __future__ import annotations

import secrets


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"
