"""Shared helpers: run requests through the app, normalize ids for golden comparisons."""

from __future__ import annotations

import re
from typing import Any

_ID = re.compile(r"^(resp|msg|rs|fc|call|ctc)_[0-9a-f]{16,}$")


def normalize_ids(value: Any, names: dict[str, str] | None = None) -> Any:
    """Replace ids by stable placeholders in order of appearance; zero the timestamps."""
    names = {} if names is None else names
    if isinstance(value, dict):
        return {
            k: 0 if k in ("created_at", "completed_at") and v is not None
            else normalize_ids(v, names)
            for k, v in value.items()
        }  # fmt: skip
    if isinstance(value, list):
        return [normalize_ids(v, names) for v in value]
    if isinstance(value, str) and _ID.match(value):
        prefix = value.split("_", 1)[0]
        if value not in names:
            count = sum(1 for n in names.values() if n.startswith(f"<{prefix}_"))
            names[value] = f"<{prefix}_{count}>"
        return names[value]
    return value
