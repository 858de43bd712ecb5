"""`/v1/models` as a catalog: per model, what oars knows of it, in the words clients read.

Each entry is OpenAI's `Model` (`id`, `object`, `created`, `owned_by`, what the openai SDK's
`models.list()` and `retrieve()` read) with the capabilities clients otherwise guess: the
context window, the input modalities, whether it reasons and at which efforts, the tools this
server runs for it and those it hands to the client, and the form of `apply_patch` it takes. The listing also carries them as
Codex's own model catalog (`models`, the shape of Codex's `ModelInfo`, as `model_catalog_json`
and its `/models` read it). What oars does not know is null, never a guess.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from oars.engines.base import Engine, ModelInfo

Json = dict[str, Any]

# The tool types offered to the model whose calls the client runs (docs/tools.md).
CLIENT_TOOLS = ("function", "custom", "tool_search", "shell", "local_shell", "apply_patch")
# Codex's input modalities are text and image; files and audio have no tag there.
_CODEX_MODALITIES = ("text", "image")


@dataclass(frozen=True)
class Served:
    """What the server runs beside the model, the same for every model it serves."""

    created: int  # when the server started: its models are as old as it is
    mcp: bool  # it runs MCP tools (`--mcp-allow`)
    web_search: bool = False  # it runs `web_search` through a backend (`--web-search`)
    file_search: bool = False  # it runs `file_search` over the vector stores it keeps


def models(engines: Mapping[str, Engine]) -> dict[str, ModelInfo]:
    """Each served model's info, under the name clients ask for it by."""
    return {name: replace(engine.info, id=name) for name, engine in engines.items()}


def entry(info: ModelInfo, served: Served) -> Json:
    """One model as OpenAI's `Model` with its capabilities."""
    return {
        "id": info.id,
        "object": "model",
        "created": served.created,
        "owned_by": info.owned_by,
        "context_window": info.context_length,
        "input_modalities": list(info.modalities),
        "reasoning": info.reasoning,
        "reasoning_efforts": list(info.reasoning_efforts),
        # The tools this server runs itself: its tool search over the request's deferred tools,
        # MCP when it runs any, web search when its operator named a backend, file search when
        # it keeps vector stores; code interpreter and the rest are not run here (a 400).
        "server_tools": [
            "tool_search",
            *(["mcp"] if served.mcp else []),
            *(["web_search"] if served.web_search else []),
            *(["file_search"] if served.file_search else []),
        ],
        # The tool types it offers the model and hands back for the client to run.
        "client_tools": list(CLIENT_TOOLS),
        "supports_search_tool": True,
        "apply_patch_tool_type": "freeform",
        "supports_parallel_tool_calls": True,
    }


def codex_entry(info: ModelInfo) -> Json:
    """One model as Codex's `ModelInfo`.

    `apply_patch_tool_type` is `freeform`: a custom tool with a Lark grammar, which oars
    decodes under (a patch is as valid as the grammar makes it). `supports_search_tool` is
    true: oars offers a client's `tool_search` over its deferred tools and loads what its
    `tool_search_output` returns, so Codex may defer its MCP tools behind it.
    `shell_type` is `shell_command` (a function tool every model with calls can use) and
    `truncation_policy` the size Codex cuts tool outputs to: Codex needs them, and they are
    the client's choices, not facts of the model. No `base_instructions`: the prompt is the
    operator's to write (Codex uses its own when the entry has none)."""
    efforts = [{"effort": e, "description": _EFFORTS[e]} for e in info.reasoning_efforts]
    out: Json = {
        "slug": info.id,
        "display_name": info.id,
        "description": None,
        "supported_reasoning_levels": efforts,
        "shell_type": "shell_command",
        "visibility": "list",
        "supported_in_api": True,
        "priority": 0,
        "upgrade": None,
        "supports_reasoning_summaries": False,
        "support_verbosity": False,
        "default_verbosity": None,
        "apply_patch_tool_type": "freeform",
        "truncation_policy": {"mode": "tokens", "limit": 10000},
        "supports_parallel_tool_calls": True,
        "experimental_supported_tools": [],
        "input_modalities": [m for m in _CODEX_MODALITIES if m in info.modalities],
        "supports_search_tool": True,
    }
    if info.context_length is not None:  # Codex reads an absent window as unknown
        out["context_window"] = info.context_length
    return out


_EFFORTS = {
    "none": "No reasoning: the template's thinking is turned off.",
    "minimal": "Reasoning at its shortest.",
    "low": "Reasoning, at the low level where the template reads one.",
    "medium": "Reasoning, at the medium level where the template reads one.",
    "high": "Reasoning, at the high level where the template reads one.",
}


def listing(infos: Iterable[ModelInfo], served: Served) -> Json:
    """The `/v1/models` body: OpenAI's list, and Codex's catalog of the same models."""
    infos = list(infos)
    return {
        "object": "list",
        "data": [entry(i, served) for i in infos],
        "models": [codex_entry(i) for i in infos],
    }
