"""This server's own tool search: the deferred tools of a request, ranked for the model's query.

A request that sends `{"type": "tool_search"}` (execution `server`, the default) with tools it
defers (`defer_loading: true` on a function or custom tool, or on a namespace's member) offers
the model a `tool_search` function. Its call runs here: the deferred tools are ranked by BM25
(the `bm25s` library) over their names (split at `_`, `-`, `.` and case changes), descriptions,
parameter names and descriptions, and their namespace's name and description. A deferred MCP
server's tools (`defer_loading` on its `mcp` tool) are ranked too, by their listing. The best
matches (at most `limit`, and none scoring under half the best one's score) are the search's
output, as `tool_search_output` items carry tools: a function as it was defined, a namespace's
members within their namespace, an MCP server's as its `mcp` tool with `allowed_tools` naming
them. The toolbox then offers them to the model's next step.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Json = Mapping[str, Any]

DEFAULT_LIMIT = 5
# A tool ranked below this share of the best one's score is not loaded: a word the query shares
# with every member of a namespace (its name) would otherwise load them all.
RELATIVE_CUTOFF = 0.5
MAX_LIMIT = 20
_WORD_BREAK = re.compile(r"[_\-.]+|(?<=[a-z0-9])(?=[A-Z])")


@dataclass(frozen=True)
class Entry:
    """One deferred tool: its definition, and the namespace it belongs to (without members);
    an MCP server's tool has its name, description and input schema as `parameters`, and the
    server (`server_label`, `description`) as its namespace."""

    tool: Json
    namespace: Json | None
    mcp: bool = False

    @property
    def text(self) -> str:
        """What the ranking reads of it."""
        parts = [_words(str(self.tool.get("name", ""))), str(self.tool.get("description") or "")]
        parameters = self.tool.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, dict) else None
        for name, schema in (properties or {}).items():
            parts.append(_words(str(name)))
            if isinstance(schema, dict) and isinstance(schema.get("description"), str):
                parts.append(schema["description"])
        if self.namespace is not None:
            parts.append(_words(str(self.namespace.get("name", ""))))
            parts.append(str(self.namespace.get("description") or ""))
        return " ".join(p for p in parts if p)


def _words(name: str) -> str:
    """`list_events`, `listEvents` → `list events` (BM25 matches words, not identifiers)."""
    return " ".join(w for w in _WORD_BREAK.split(name) if w)


def catalog(tools: Sequence[Any]) -> list[Entry]:
    """The deferred tools among a request's tools (as the response echoes them), in order."""
    entries: list[Entry] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        if tool.get("type") in ("function", "custom") and tool.get("defer_loading") is True:
            entries.append(Entry(tool, None))
        elif tool.get("type") == "namespace" and isinstance(tool.get("tools"), list):
            group = {k: v for k, v in tool.items() if k != "tools"}
            entries.extend(
                Entry(member, group)
                for member in tool["tools"]
                if isinstance(member, dict)
                and (member.get("defer_loading") is True or tool.get("defer_loading") is True)
            )
    return entries


def mcp_entry(label: str, description: str | None, name: str, listed: Json) -> Entry:
    """A deferred MCP server's tool, as it was listed."""
    tool = {
        "name": name,
        "description": listed.get("description") or "",
        "parameters": listed.get("input_schema"),
    }
    return Entry(tool, {"name": label, "description": description or ""}, mcp=True)


def limit_of(arguments: Json) -> int:
    """How many tools a search may load: the model's `limit`, within 1..MAX_LIMIT."""
    value = arguments.get("limit")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return DEFAULT_LIMIT
    return max(1, min(MAX_LIMIT, int(value)))


def search(entries: Sequence[Entry], query: str, limit: int) -> list[dict[str, Any]]:
    """The definitions of the tools that match `query`, best first, as a tool search's
    output holds them (a namespace's members under their namespace)."""
    import bm25s  # on first use: imports numpy's sparse parts, a few tens of ms

    if not entries or not query.strip():
        return []
    corpus = bm25s.tokenize([e.text for e in entries], stopwords="en", show_progress=False)
    ranking = bm25s.BM25()
    ranking.index(corpus, show_progress=False)
    asked = bm25s.tokenize([query], stopwords="en", show_progress=False)
    k = min(limit, len(entries))
    found, scores = ranking.retrieve(asked, k=k, show_progress=False)
    best = float(scores[0][0]) if k else 0.0
    hits = [
        entries[int(i)]
        for i, score in zip(found[0], scores[0], strict=True)
        if score > 0 and score >= best * RELATIVE_CUTOFF
    ]
    return _grouped(hits)


def _grouped(hits: Sequence[Entry]) -> list[dict[str, Any]]:
    """Functions as they are; members within their namespace, and an MCP server's tools as its
    `mcp` tool allowing them, each group where its best member ranked."""
    out: list[dict[str, Any]] = []
    groups: dict[tuple[bool, str], dict[str, Any]] = {}
    for hit in hits:
        if hit.namespace is None:
            out.append(dict(hit.tool))
            continue
        name = str(hit.namespace.get("name"))
        group = groups.get((hit.mcp, name))
        if group is None:
            group = (
                {"type": "mcp", "server_label": name, "allowed_tools": []}
                if hit.mcp
                else {
                    **hit.namespace,
                    "tools": [],
                    "description": hit.namespace.get("description") or "",
                }
            )
            groups[(hit.mcp, name)] = group
            out.append(group)
        if hit.mcp:
            group["allowed_tools"].append(hit.tool["name"])
        else:
            group["tools"].append(dict(hit.tool))
    return out
