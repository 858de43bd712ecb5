"""Compaction items: what one holds, and what of a history it stands for.

A `compaction` item carries a summary of the items it replaced, sealed with the server's key
(`encrypted_content`), the fingerprints of those items, and the tools their tool searches had
loaded (which stay offered after it). Wherever it appears in a context,
the items it covers are left out and its summary is the first message after the instructions;
the items it did not cover (the user messages kept verbatim, what came after) stay as they are.
So a client may send back its whole history, or only what `/v1/responses/compact` returned, or
chain by `previous_response_id`: the model sees the same prompt. There, the instructions and
tools keep their cached prefix, and a small model, which follows the user's latest words far
better when no summary sits between them, still finds the task.

Fingerprints ignore ids and statuses, which clients drop or rewrite when they send items back.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

COMPACTION_TYPES = ("compaction", "compaction_summary")
TRIGGER = "compaction_trigger"  # an input item: compact the context now (the last item)
SUMMARY_PREFIX = "A summary of the earlier part of this conversation, which was compacted:\n\n"

Item = Mapping[str, Any]


def fingerprint(item: Item) -> str:
    """An item's identity as a client would send it back: its content, not its id."""
    kind = item.get("type", "message")
    if kind == "message":
        key: Any = [kind, item.get("role"), _text(item.get("content"))]
    elif kind in ("function_call", "custom_tool_call"):
        key = [
            kind,
            item.get("call_id"),
            item.get("name"),
            item.get("arguments", item.get("input")),
        ]
    elif kind in ("function_call_output", "custom_tool_call_output"):
        output = item.get("output")
        key = [kind, item.get("call_id"), output if isinstance(output, str) else _text(output)]
    elif kind in COMPACTION_TYPES:
        key = ["compaction", item.get("encrypted_content")]
    else:
        key = {k: v for k, v in item.items() if k not in ("id", "status")}
    raw = json.dumps(key, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(raw.encode("utf-8", "surrogatepass")).hexdigest()[:20]


def _text(content: Any) -> Any:
    """Content as its text: a string and the same text as parts are one content."""
    if not isinstance(content, list):
        return content
    return "\n".join(
        str(p.get("text", p.get("refusal", json.dumps(p, sort_keys=True))))
        if isinstance(p, dict)
        else json.dumps(p)
        for p in content
    )


@dataclass(frozen=True)
class Sealed:
    """What a compaction item's `encrypted_content` holds."""

    summary: str
    covered: frozenset[str] = field(default_factory=frozenset)  # fingerprints
    tools: tuple[Item, ...] = ()  # the definitions of the tools tool searches had loaded

    def seal(self, seal: Callable[[str], str]) -> str:
        payload: dict[str, Any] = {"v": 1, "summary": self.summary, "covered": sorted(self.covered)}
        if self.tools:
            payload["tools"] = list(self.tools)
        return seal(json.dumps(payload, ensure_ascii=False))

    @classmethod
    def open(cls, token: Any, unseal: Callable[[str], str] | None) -> Sealed:
        """ValueError unless the token is a compaction of this server's key, intact."""
        if not isinstance(token, str) or not token or unseal is None:
            raise ValueError("no sealed compaction")
        try:
            payload = json.loads(unseal(token))
        except json.JSONDecodeError as exc:
            raise ValueError("not a compaction") from exc
        summary, covered = payload.get("summary"), payload.get("covered")
        tools = payload.get("tools", [])
        if not isinstance(summary, str) or not isinstance(covered, list):
            raise ValueError("not a compaction")
        if not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools):
            raise ValueError("not a compaction")
        return cls(summary, frozenset(str(c) for c in covered), tuple(tools))


@dataclass(frozen=True)
class Placement:
    """How the compaction items of a list of items shape what the model sees."""

    hidden: frozenset[int]  # positions left out: covered items, and compaction items themselves
    summaries: Mapping[int, str]  # position of the first covered item → that summary


def place(items: Sequence[Item], opened: Mapping[int, Sealed]) -> Placement:
    """`opened`: the compaction items' positions and contents. A later compaction covers the
    earlier ones it summarized; each summary goes where its first covered item was, or where
    the compaction item itself is when none of its items are present."""
    hidden: set[int] = set()
    summaries: dict[int, str] = {}
    for position in sorted(opened, reverse=True):
        superseded = position in hidden  # a later compaction summarized this one too
        sealed = opened[position]
        covered = [
            j
            for j in range(position)
            if j not in hidden and fingerprint(items[j]) in sealed.covered
        ]
        hidden.update(covered)
        hidden.add(position)
        if not superseded:
            at = min(covered, default=position)
            summaries[at] = (
                sealed.summary if at not in summaries else (f"{sealed.summary}\n\n{summaries[at]}")
            )
    return Placement(frozenset(hidden), summaries)
