"""Tools offered to the model: what the request sent, what the template sees, what calls become.

Function tools are offered as they are; `custom` tools as a function with one string argument
`input`; tools inside a `namespace` flattened under their own names (a call comes back with the
namespace); an MCP server's tools as `label__name` (run here, see `oars.toolbox`).

Deferred tools (`defer_loading: true`) are declared and not offered: a `tool_search` finds them.
A client's tool search (`execution: "client"`) is offered as a function under the client's own
description and parameters, and its call comes back as a `tool_search_call` item; the tools of
every `tool_search_output` in the context are offered from there on (`loaded`). This server's
own tool search (`oars.tool_search`) is offered the same way and run by the toolbox.

The `shell`, `local_shell` and `apply_patch` tool types are offered as functions of those names
with parameters of this server's (`CLIENT_TOOL_TYPES`); their calls come back as `shell_call`,
`local_shell_call` and `apply_patch_call` items, which the client runs.

`web_search`, where the operator configured a search backend (`oars.web_search`), is offered as
three functions this server runs (`WEB_TOOLS`: search, open a page, find in a page), whose calls
become `web_search_call` items. Without a backend it is accepted and not offered
(`ignored_tools`): Codex sends it with every request. Other hosted tools this server does not
run are refused with a 400 naming them.
"""

from __future__ import annotations

import contextlib
import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from oars.compaction import COMPACTION_TYPES, Sealed
from oars.errors import InvalidRequest
from oars.input_pattern import Unsupported, input_pattern
from oars.mcp.servers import echo as mcp_echo
from oars.vector_stores import ranking

Unseal = Callable[[str], str]

CUSTOM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
    "additionalProperties": False,
}
ANY_OBJECT: dict[str, Any] = {"type": "object"}
# llguidance's JSON layout for output constrained from the first token: no free whitespace.
COMPACT_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Tool:
    """A tool the model may call."""

    name: str
    # "function" | "custom" | "mcp" | "tool_search" | "server_tool_search" |
    # "server_web_search" | "server_file_search", or a client tool type with a call item of
    # its own: "shell" | "local_shell" | "apply_patch"
    kind: str
    description: str
    parameters: Mapping[str, Any]
    namespace: str | None = None  # an MCP tool's: its server's label
    pattern: str | None = None  # custom tools: the regex the input must match, from its grammar
    offered_as: str = ""  # the name the model sees, when `name` alone is ambiguous
    deferred: bool = False  # `defer_loading`: declared, offered once a tool search loads it

    @property
    def model_name(self) -> str:
        """What the model calls it: its name, or `namespace.name` where two tools share a name."""
        return self.offered_as or self.name

    @property
    def string_parameters(self) -> frozenset[str]:
        """The top-level parameters the schema types as strings (possibly among others)."""
        properties = self.parameters.get("properties")
        if not isinstance(properties, Mapping):
            return frozenset()
        return frozenset(
            key
            for key, schema in properties.items()
            if isinstance(schema, Mapping) and _allows_string(schema.get("type"))
        )

    @property
    def call_schema(self) -> Mapping[str, Any]:
        """The schema a call's arguments follow: the parameters, with a custom tool's input
        held to its grammar (llguidance escapes the pattern's matches as JSON itself)."""
        if self.pattern is None:
            return self.parameters
        return {
            **CUSTOM_SCHEMA,
            "properties": {"input": {"type": "string", "pattern": self.pattern}},
        }

    def to_template(self) -> dict[str, Any]:
        function = {
            "name": self.model_name,
            "description": self.description,
            "parameters": dict(self.parameters),
        }
        return {"type": "function", "function": function}


def _allows_string(kind: Any) -> bool:
    return kind == "string" or (isinstance(kind, list) and "string" in kind)


@dataclass(frozen=True)
class ToolSet:
    offered: tuple[Tool, ...]  # what the template shows
    callable: tuple[Tool, ...]  # what the model may call now (tool_choice, allowed_tools)
    mode: str  # "none" | "auto" | "required"
    deferred: tuple[Tool, ...] = ()  # declared, not offered: for a tool search to find
    # The request's `tool_choice` and whether MCP servers add tools, to apply the choice again
    # once a tool search loaded tools; `pending`: the choice names a tool not loaded yet.
    choice: Any = field(default=None, compare=False)
    servers: bool = field(default=False, compare=False)
    pending: bool = False

    @property
    def names(self) -> frozenset[str]:
        """The names the model may call the tools by."""
        if self.mode == "none":
            return frozenset()
        return frozenset(t.model_name for t in self.callable)

    def loading(self, loaded: Sequence[Tool]) -> ToolSet:
        """These tools with those a tool search loaded, offered after them, `tool_choice`
        applied to them all (a tool already offered, or loaded twice, by its namespace and
        name, is offered once, as first seen; a loaded tool whose name another has is offered
        as `namespace.name`); 400 for a choice that names a tool still not there."""
        known = {(t.namespace, t.name) for t in self.offered}
        fresh: dict[tuple[str | None, str], Tool] = {}
        for tool in loaded:
            if (tool.namespace, tool.name) not in known:
                fresh.setdefault((tool.namespace, tool.name), replace(tool, offered_as=""))
        if not fresh and not self.pending:
            return self
        plain = [replace(t, offered_as="") for t in self.offered]
        tools = _disambiguated([*plain, *fresh.values()])
        return replace(resolve(tools, self.choice, self.servers), deferred=self.deferred)


NO_TOOLS = ToolSet((), (), "none")


def mcp_tool_name(label: str, name: str) -> str:
    """What the model calls an MCP server's tool: its server's label, two underscores, its
    name. The same in every request, so a history renders alike whatever else is offered."""
    return f"{label}__{name}"


def _tool(raw: Mapping[str, Any], param: str, namespace: str | None) -> Tool | None:
    kind = raw.get("type")
    name = raw.get("name")
    if kind not in ("function", "custom"):
        return None
    deferred = raw.get("defer_loading")
    if deferred is not None and not isinstance(deferred, bool):
        raise InvalidRequest(
            f"Invalid '{param}.defer_loading': expected a boolean.", param=f"{param}.defer_loading"
        )
    if not isinstance(name, str) or not name:
        raise InvalidRequest(
            f"Missing '{param}.name'.", param=f"{param}.name", code="missing_required_parameter"
        )
    check_name(name, f"{param}.name")
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(
            f"Invalid '{param}.description': expected a string.", param=f"{param}.description"
        )
    strict = raw.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise InvalidRequest(
            f"Invalid '{param}.strict': expected a boolean.", param=f"{param}.strict"
        )
    description = description or ""
    if kind == "custom":
        pattern = _custom_pattern(raw, f"{param}.format")
        return Tool(
            name, "custom", description, CUSTOM_SCHEMA, namespace, pattern, deferred=bool(deferred)
        )
    params = _parameters(raw, param)
    return Tool(name, "function", description, params, namespace, deferred=bool(deferred))


def _parameters(raw: Mapping[str, Any], param: str) -> Mapping[str, Any]:
    params = raw.get("parameters")
    if params is not None and not isinstance(params, dict):
        raise InvalidRequest(
            f"Invalid '{param}.parameters': expected a JSON Schema object.",
            param=f"{param}.parameters",
        )
    return params or ANY_OBJECT


TOOL_SEARCH = "tool_search"  # the name a client's tool search is offered under
SEARCH_DESCRIPTION = "Searches the tools not loaded yet and loads those that match the query."
SEARCH_PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "properties": {"query": {"type": "string", "description": "What the tool should do."}},
    "required": ["query"],
    "additionalProperties": False,
}


SERVER_SEARCH_PARAMETERS: Mapping[str, Any] = {
    **SEARCH_PARAMETERS,
    "properties": {
        **SEARCH_PARAMETERS["properties"],
        "limit": {"type": "integer", "description": "The most tools to load (default 5)."},
    },
}


def _tool_search(raw: Mapping[str, Any], param: str) -> Tool:
    """A tool search: the client's (offered under its own description and parameters), or this
    server's (`oars.tool_search`; its description names the deferred tools, `_searching`)."""
    execution = raw.get("execution")
    if execution in (None, "server"):
        return Tool(TOOL_SEARCH, "server_tool_search", SEARCH_DESCRIPTION, SERVER_SEARCH_PARAMETERS)
    description = raw.get("description")
    if description is not None and not isinstance(description, str):
        raise InvalidRequest(
            f"Invalid '{param}.description': expected a string.", param=f"{param}.description"
        )
    params = _parameters(raw, param) if raw.get("parameters") is not None else SEARCH_PARAMETERS
    return Tool(TOOL_SEARCH, "tool_search", description or SEARCH_DESCRIPTION, params)


def _string(description: str) -> dict[str, Any]:
    return {"type": "string", "minLength": 1, "description": description}


def _object(**properties: Any) -> Mapping[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": list(properties),
        "additionalProperties": False,
    }


# `web_search` as the model sees it: each function is an action of a `web_search_call`.
WEB_SEARCH_TYPES = frozenset({"web_search", "web_search_2025_08_26"})
_URL = _string("The page's URL (http or https).")
WEB_TOOLS: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "web_search": (
        "Searches the web; returns the results' titles, URLs and snippets. To cite a result, "
        "write a Markdown link to its URL: [title](url).",
        _object(query=_string("What to search for.")),
    ),
    "open_page": ("Opens a web page and returns its text.", _object(url=_URL)),
    "find_in_page": (
        "Finds a phrase in a web page; returns the passages around it.",
        _object(url=_URL, pattern=_string("The phrase to find.")),
    ),
}


def _web_tools(raw: Mapping[str, Any], pages: bool) -> list[Tool]:
    """A `web_search` tool this server runs: the search, and, unless it may not reach the web
    beyond the search (`external_web_access: false`, or a server that opens no `pages`),
    opening a page and finding in one."""
    opens = pages and raw.get("external_web_access") is not False
    names = list(WEB_TOOLS) if opens else ["web_search"]
    return [Tool(name, "server_web_search", *WEB_TOOLS[name]) for name in names]


# `file_search` as the model sees it: one function whose calls are `file_search_call` items,
# run over the tool's vector stores (`oars.file_run`).
FILE_SEARCH = (
    "Searches the user's files; returns passages, each under a handle such as 【1】. To cite a "
    "passage, write its handle after the words it supports.",
    _object(
        queries={
            "type": "array",
            "items": _string("A search, in the words the files would use."),
            "minItems": 1,
            "maxItems": 3,  # OpenAI's model wrote 3; a small one, given 5, wrote them alike
            "description": "One to three different searches to run.",
        }
    ),
)
MAX_FILE_RESULTS = 50  # `max_num_results`, as OpenAI takes it


def _file_search(raw: Mapping[str, Any], param: str) -> Tool:
    """A `file_search` tool this server runs, over vector stores it keeps."""
    stores = raw.get("vector_store_ids")
    if not isinstance(stores, list) or not stores:
        raise InvalidRequest(
            f"Invalid '{param}.vector_store_ids': expected the ids of one or more vector stores.",
            param=f"{param}.vector_store_ids",
        )
    limit = raw.get("max_num_results")
    if limit is not None and not 1 <= limit <= MAX_FILE_RESULTS:
        raise InvalidRequest(
            f"Invalid '{param}.max_num_results': expected an integer from 1 to {MAX_FILE_RESULTS}.",
            param=f"{param}.max_num_results",
        )
    ranking(raw.get("ranking_options"), f"{param}.ranking_options")
    return Tool("file_search", "server_file_search", *FILE_SEARCH)


# The client tool types with a call item of their own, offered as functions the model calls by
# these names and parameters; `oars.events.items` turns the call into the item.
def _lines(key: str, description: str, **more: Any) -> Mapping[str, Any]:
    """Parameters of one required array of strings, and `more`."""
    strings = {"type": "array", "items": {"type": "string"}, "minItems": 1}
    return {
        "type": "object",
        "properties": {key: {**strings, "description": description}, **more},
        "required": [key],
        "additionalProperties": False,
    }


SHELL_PARAMETERS = _lines(
    "commands",
    "Shell commands to run in order, each a line of shell.",
    timeout_ms={"type": "integer", "description": "Stop the commands after this long."},
)
LOCAL_SHELL_PARAMETERS = _lines(
    "command",
    'The program and its arguments, e.g. ["ls", "-l"].',
    working_directory={"type": "string"},
    timeout_ms={"type": "integer"},
)
_PATH = {"type": "string", "description": "The file's path."}
# A diff's lines, held to their form while the model writes them (a small model otherwise
# writes a new file's text with no '+'): a new file's lines each start with '+'; a change's
# with '@@' (a hunk's context line), ' ' (kept), '-' (removed) or '+' (added).
_ADDED_LINES = r"^\+[^\n]*(\n\+[^\n]*)*\n?$"
_HUNK_LINES = r"^[-+ @][^\n]*(\n[-+ @][^\n]*)*\n?$"


def _operation(kind: str, diff: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return _object(
        operation={"const": kind}, path=_PATH, **({} if diff is None else {"diff": diff})
    )


APPLY_PATCH_PARAMETERS: Mapping[str, Any] = {
    "type": "object",
    "anyOf": [
        _operation(
            "create_file",
            {
                "type": "string",
                "pattern": _ADDED_LINES,
                "description": "The new file's lines, each starting with '+'.",
            },
        ),
        _operation(
            "update_file",
            {
                "type": "string",
                "pattern": _HUNK_LINES,
                "description": "Hunks: an '@@' line, then lines starting with ' ' (kept), "
                "'-' (removed) or '+' (added).",
            },
        ),
        _operation("delete_file", None),
    ],
}
CLIENT_TOOL_TYPES: Mapping[str, tuple[str, Mapping[str, Any]]] = {
    "shell": (
        "Runs shell commands on the user's machine and returns their output.",
        SHELL_PARAMETERS,
    ),
    "local_shell": (
        "Runs a command on the user's machine and returns its output.",
        LOCAL_SHELL_PARAMETERS,
    ),
    "apply_patch": ("Creates, updates or deletes one file.", APPLY_PATCH_PARAMETERS),
}


def _client_tool(raw: Mapping[str, Any], param: str) -> Tool:
    """A `shell`, `local_shell` or `apply_patch` tool: the client runs its calls."""
    kind = str(raw["type"])
    environment = raw.get("environment")
    if kind == "shell" and isinstance(environment, dict) and environment.get("type") != "local":
        raise InvalidRequest(
            f"Invalid '{param}.environment': this server runs no hosted containers; a shell "
            "tool runs on the client ('local').",
            param=f"{param}.environment",
            code="unsupported_value",
        )
    description, parameters = CLIENT_TOOL_TYPES[kind]
    return Tool(kind, kind, description, parameters)


def _searching(tools: list[Tool], wire: Sequence[Any]) -> list[Tool]:
    """This server's tool search tells the model which tools it can load (the names of the
    deferred tools, a namespace's or a deferred MCP server's once), as Codex's instructions do
    for its own."""
    servers = [
        str(t.get("server_label"))
        for t in wire
        if isinstance(t, dict) and t.get("type") == "mcp" and t.get("defer_loading") is True
    ]
    names = list(dict.fromkeys([*(t.namespace or t.name for t in tools if t.deferred), *servers]))
    shown = ", ".join(names[:_NAMED]) + (", …" if len(names) > _NAMED else "")
    said = f"{SEARCH_DESCRIPTION} Tools not loaded yet: {shown or 'none'}."
    return [replace(t, description=said) if t.kind == "server_tool_search" else t for t in tools]


_NAMED = 30  # deferred tools a server search's description names


# Hosted tools of OpenAI's this server does not run: a request that sends one is refused, so that
# no model answers as if the tool did not exist. `web_search` is sent by Codex with every request:
# it is taken and not offered (`ignored_tools`), and a `tool_choice` forcing it is refused.
IGNORED = WEB_SEARCH_TYPES  # without a backend
REFUSED = {
    "file_search": "file search without a store (--store none)",
    "web_search_preview": "web search",
    "web_search_preview_2025_03_11": "web search",
    "code_interpreter": "a code interpreter",
    "image_generation": "image generation",
    "computer": "computer use",
    "computer_use": "computer use",
    "computer_use_preview": "computer use",
}


def _refuse(kind: str, param: str) -> None:
    what = REFUSED.get(kind)
    if what is not None:
        raise InvalidRequest(
            f"Invalid '{param}': this server does not run {what} (tool type {kind!r}); "
            "offer it as a function tool to run it yourself.",
            param=param,
            code="unsupported_tool",
        )


NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MAX_GRAMMAR = 65_536  # characters of a custom tool's grammar


def check_name(name: str, param: str) -> None:
    """Tool and namespace names as OpenAI takes them: 1-64 letters, digits, `_` or `-` (the
    model writes them back, and a long one makes the call grammar explode)."""
    if not NAME.fullmatch(name):
        raise InvalidRequest(
            f"Invalid '{param}': {name[:80]!r} is not a valid name; expected 1 "
            "to 64 letters, digits, underscores or dashes.",
            param=param,
        )


def _custom_pattern(raw: Mapping[str, Any], param: str) -> str | None:
    """The regex a custom tool's input must match, if its format is a grammar; a 400 for a
    grammar that cannot be followed (never an input left free in its place)."""
    fmt = raw.get("format")
    if not isinstance(fmt, dict) or fmt.get("type") != "grammar":
        return None
    definition, syntax = fmt.get("definition"), fmt.get("syntax")
    if not isinstance(definition, str):
        raise InvalidRequest(
            f"Invalid '{param}.definition': expected a string.", param=f"{param}.definition"
        )
    if syntax not in ("lark", "regex"):
        raise InvalidRequest(
            f"Invalid '{param}.syntax': expected 'lark' or 'regex'.", param=f"{param}.syntax"
        )
    if len(definition) > MAX_GRAMMAR:
        raise InvalidRequest(
            f"Invalid '{param}.definition': the grammar is {len(definition)} "
            f"characters; at most {MAX_GRAMMAR} are allowed.",
            param=f"{param}.definition",
        )
    try:
        return input_pattern(syntax, definition)
    except Unsupported as exc:
        raise InvalidRequest(
            f"Invalid '{param}.definition': the input of a custom tool is held "
            f"to its grammar written as one regular expression, and {exc}.",
            param=f"{param}.definition",
        ) from exc


def _typed(raw: Any, param: str) -> Mapping[str, Any]:
    if not isinstance(raw, dict) or not isinstance(raw.get("type"), str):
        raise InvalidRequest(f"Invalid '{param}': expected an object with a 'type'.", param=param)
    return raw


def _namespace_members(raw: Mapping[str, Any], param: str) -> list[Mapping[str, Any]]:
    inner = raw.get("tools")
    if inner is None:
        return []
    if not isinstance(inner, list):
        raise InvalidRequest(
            f"Invalid '{param}.tools': expected an array of tools.", param=f"{param}.tools"
        )
    return [_typed(sub, f"{param}.tools[{j}]") for j, sub in enumerate(inner)]


def _check_hosted(raw: Mapping[str, Any], param: str) -> None:
    """A hosted tool (web search, code interpreter, …) is echoed as sent, never run: it must
    be what the API's own type for it says, or the echo would break every client's parser."""
    from pydantic import ValidationError

    try:
        _wire_tool().validate_python(raw)
    except ValidationError as exc:
        first = min(exc.errors(), key=lambda e: len(e["loc"]))
        raise InvalidRequest(
            f"Invalid '{param}': not a valid {raw.get('type')} tool ({first['msg']}).", param=param
        ) from exc


@functools.cache
def _wire_tool() -> Any:
    """The SDK's union of tool types, as a validator (built on first use)."""
    from openai.types.responses import Tool as WireTool
    from pydantic import TypeAdapter

    return TypeAdapter(WireTool)


def parse_tools(
    tools: Sequence[Any],
    name: str = "tools",
    *,
    unique: bool = True,
    web: bool = False,
    pages: bool = True,
    files: bool = False,
) -> list[Tool]:
    """The tools of a request (or of an item that loads tools, `name` naming where they are);
    400 naming a malformed one or a hosted tool this server does not run, or (`unique`) two
    the model would call by one name. `web`: this server runs `web_search` (`pages`: and
    opens pages); `files`: it runs `file_search` (it keeps vector stores)."""
    out: list[Tool] = []
    for i, raw in enumerate(tools):
        param = f"{name}[{i}]"
        if _typed(raw, param)["type"] == "namespace":
            namespace = raw.get("name")
            if not isinstance(namespace, str):
                raise InvalidRequest(
                    f"Missing '{param}.name'.",
                    param=f"{param}.name",
                    code="missing_required_parameter",
                )
            check_name(namespace, f"{param}.name")
            for j, sub in enumerate(_namespace_members(raw, param)):
                tool = _tool(sub, f"{param}.tools[{j}]", namespace)
                if tool is not None:
                    out.append(tool)
        elif raw["type"] == "tool_search":
            _check_hosted(raw, param)
            out.append(_tool_search(raw, param))
        elif raw["type"] in CLIENT_TOOL_TYPES:
            _check_hosted(raw, param)
            out.append(_client_tool(raw, param))
        elif raw["type"] in WEB_SEARCH_TYPES and web:
            _check_hosted(raw, param)
            out.extend(_web_tools(raw, pages))
        elif raw["type"] == "file_search" and files:
            _check_hosted(raw, param)
            out.append(_file_search(raw, param))
        else:
            tool = _tool(raw, param, None)
            if raw["type"] not in ("function", "custom"):
                _check_hosted(raw, param)
                _refuse(raw["type"], param)
            if tool is not None:
                out.append(tool)
    tools_named = _disambiguated(out)
    if unique:
        _check_unique(tools_named)
    return _searching(tools_named, tools)


def _check_unique(tools: Sequence[Tool]) -> None:
    """Two tools the model would call by one name (a function named `shell` beside the shell
    tool): its calls could not say which, so the request is refused."""
    seen: set[str] = set()
    for tool in tools:
        if tool.model_name in seen:
            raise InvalidRequest(
                f"Invalid 'tools': two tools are named {tool.model_name!r}; the model could "
                "not say which one it calls.",
                param="tools",
                code="duplicate_tool_name",
            )
        seen.add(tool.model_name)


def ignored_tools(tools: Sequence[Any]) -> list[str]:
    """The types of the tools a request sends that are taken and not offered (on a server
    without a web search backend)."""
    return [t["type"] for t in tools if isinstance(t, dict) and t.get("type") in IGNORED]


def loaded(items: Sequence[Mapping[str, Any]], unseal: Unseal | None = None) -> list[Tool]:
    """The tools the tool searches among `items` loaded, in order (a compaction keeps those of
    the items it covers). Their definitions were checked when those items were first taken."""
    return load(loaded_definitions(items, unseal))


def load(definitions: Sequence[Mapping[str, Any]]) -> list[Tool]:
    """Tools as a tool search loads them: offered, whatever their `defer_loading` says."""
    return [replace(t, deferred=False) for t in parse_tools(definitions, unique=False)]


LOADING_ITEMS = ("tool_search_output", "additional_tools")  # items whose `tools` are loaded


def loaded_definitions(
    items: Sequence[Mapping[str, Any]], unseal: Unseal | None = None
) -> list[Mapping[str, Any]]:
    """The definitions of the tools the tool searches among `items` loaded (and the
    `additional_tools` items gave), each once."""
    found: dict[str, Mapping[str, Any]] = {}
    for item in items:
        tools: Sequence[Any] = ()
        if item.get("type") in LOADING_ITEMS and isinstance(item.get("tools"), list):
            tools = item["tools"]
        elif item.get("type") in COMPACTION_TYPES and unseal is not None:
            with contextlib.suppress(ValueError):  # rendering refuses it, with its place
                tools = Sealed.open(item.get("encrypted_content"), unseal).tools
        for tool in tools:
            if isinstance(tool, dict):
                found.setdefault(json.dumps(tool, sort_keys=True), tool)
    return list(found.values())


def _disambiguated(tools: list[Tool]) -> list[Tool]:
    """Two tools of one name (two MCP servers' `search`): the namespaced ones are offered to the
    model as `namespace.name`; a call by that name comes back as `name` plus `namespace`."""
    counts = Counter(t.name for t in tools)
    return [
        replace(t, offered_as=f"{t.namespace}.{t.name}")
        if counts[t.name] > 1 and t.namespace
        else t
        for t in tools
    ]


def echo_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The tools as a response shows them: every field of the tool's type, defaults filled in."""
    return [_echo(t) for t in tools]


def _echo(raw: Mapping[str, Any]) -> dict[str, Any]:
    kind = raw.get("type")
    if kind == "mcp":
        return mcp_echo(raw)
    if kind == "function":
        return {
            **raw,
            "description": raw.get("description"),
            "parameters": raw.get("parameters"),
            "strict": raw.get("strict", True),
        }
    if kind == "custom":
        return {
            **raw,
            "description": raw.get("description"),
            "format": raw.get("format") or {"type": "text"},
        }
    if kind == "namespace" and isinstance(raw.get("tools"), list):
        return {**raw, "tools": echo_tools(raw["tools"])}
    return dict(raw)


def _named(tools: list[Tool], name: Any, param: str) -> Tool:
    tool = next((t for t in tools if t.name == name), None)
    if tool is None:
        raise _NotOffered(f"Invalid '{param}': no tool named {name!r} in 'tools'.", param=param)
    return tool


def resolve(
    tools: list[Tool], choice: Any, servers: bool = False, searching: bool = False
) -> ToolSet:
    """Apply `tool_choice` to the tools; 400 for a choice that names what cannot run here.
    `servers`: MCP servers give the model tools too (listed when the response runs). Deferred
    tools are kept aside, neither offered nor named by a choice. `searching`: a tool search
    may load the tool the choice names, so naming one not offered is settled by the turn."""
    deferred = tuple(t for t in tools if t.deferred)
    tools = [t for t in tools if not t.deferred]
    try:
        toolset = _resolve(tools, choice, servers)
    except _NotOffered:
        if not searching:
            raise
        toolset = ToolSet(tuple(tools), (), "required", pending=True)
    return replace(toolset, deferred=deferred, choice=choice, servers=servers)


class _NotOffered(InvalidRequest):
    """`tool_choice` names a tool the request does not offer."""


def _resolve(tools: list[Tool], choice: Any, servers: bool) -> ToolSet:
    offered = tuple(tools)
    if choice == "required" and not offered and not servers:
        raise InvalidRequest(
            "tool_choice 'required' needs at least one function or custom tool in 'tools'.",
            param="tool_choice",
        )
    if choice is None or choice in ("auto", "none", "required"):
        return ToolSet(offered, offered, choice or "auto")
    if not isinstance(choice, dict):
        raise InvalidRequest("Invalid 'tool_choice'.", param="tool_choice")
    kind = choice.get("type")
    if kind in ("shell", "apply_patch"):
        typed = next((t for t in tools if t.kind == kind), None)
        if typed is None:
            raise _NotOffered(
                f"Invalid 'tool_choice': no {kind} tool in 'tools'.", param="tool_choice"
            )
        return ToolSet(offered, (typed,), "required")
    if kind in ("function", "custom"):
        return ToolSet(
            offered, (_named(tools, choice.get("name"), "tool_choice.name"),), "required"
        )
    if kind == "allowed_tools":
        names = choice.get("tools") or []
        if not isinstance(names, list):
            raise InvalidRequest(
                "Invalid 'tool_choice.tools': expected an array of tools.",
                param="tool_choice.tools",
            )
        allowed = [
            _named(tools, t.get("name") if isinstance(t, dict) else None, f"tool_choice.tools[{i}]")
            for i, t in enumerate(names)
        ]
        mode = choice.get("mode", "auto")
        if mode not in ("auto", "required"):
            raise InvalidRequest("Invalid 'tool_choice.mode'.", param="tool_choice.mode")
        return ToolSet(offered, tuple(allowed), mode)
    if isinstance(kind, str) and kind in WEB_SEARCH_TYPES:  # a list or object: no kind
        search = next((t for t in tools if t.kind == "server_web_search"), None)
        if search is not None:
            return ToolSet(offered, (search,), "required")
    if kind == "file_search":
        search = next((t for t in tools if t.kind == "server_file_search"), None)
        if search is not None:
            return ToolSet(offered, (search,), "required")
    if isinstance(kind, str) and kind.startswith("web_search"):
        raise InvalidRequest(
            f"tool_choice {kind!r} cannot be forced: this server runs no web search (its "
            "operator sets one with --web-search), so it offers the model none.",
            param="tool_choice",
            code="unsupported_value",
        )
    raise InvalidRequest(
        f"tool_choice {kind!r} names a tool this server cannot run; only function and custom "
        "tools are executed by the model here.",
        param="tool_choice",
        code="unsupported_value",
    )
