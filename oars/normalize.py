"""The single translator from a wire request to internal values: every default and validation.

`normalize(body)` turns the JSON body of `POST /v1/responses` into a `ResponseRequest`, or raises
`InvalidRequest` naming the offending parameter. Nothing downstream looks at the wire body again.
The request's input is checked here for its shape (a string, or a list of objects with a string
`type`) and kept as items: the turn renders it for the model, once, with the history it
continues, and that rendering is what finds a malformed item.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from oars.compaction import TRIGGER
from oars.errors import InvalidRequest, NotFound
from oars.generation import OutputFormat, SamplingParams
from oars.ids import is_id, new_id
from oars.mcp.servers import McpChoice, McpServer, parse_choice, parse_servers
from oars.tools import NO_TOOLS, ToolSet, echo_tools, parse_tools, resolve

INCLUDABLE = frozenset(
    {
        "message.output_text.logprobs",
        "reasoning.encrypted_content",
        "message.input_image.image_url",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "code_interpreter_call.outputs",
        "computer_call_output.output.image_url",
    }
)
LOGPROBS_INCLUDE = "message.output_text.logprobs"
MAX_MODEL_NAME = 256
MAX_INPUT_ITEMS = 20_000  # per request (a long agent session has a few thousand)
MAX_TOOLS = 512  # per request, namespaces counted as one
ENCRYPTED_REASONING = "reasoning.encrypted_content"

Json = dict[str, Any]


@dataclass(frozen=True)
class ResponseRequest:
    """A validated request: how to generate it, stream it and echo it, and its new input."""

    model: str
    stream: bool = False
    sampling: SamplingParams = field(default_factory=SamplingParams)
    tools: ToolSet = NO_TOOLS  # the function and custom tools, `tool_choice` applied
    parallel_tool_calls: bool = True
    output: OutputFormat | None = None  # `text.format` as JSON; None: free text
    top_logprobs: int | None = None  # None: no logprobs; 0..20: that many alternatives
    reasoning_effort: str | None = None
    servers: tuple[McpServer, ...] = ()  # the MCP servers this server runs tools of
    mcp_choice: McpChoice | None = None  # `tool_choice` names one of them
    max_tool_calls: int | None = None  # of the MCP servers' tools, in this response
    echo: Mapping[str, Any] = field(default_factory=dict)
    input_items: tuple[Json, ...] = ()  # the new input as items, with ids
    instructions: str | None = None
    store: bool = False
    background: bool = False
    previous_response_id: str | None = None
    conversation_id: str | None = None
    include_encrypted_reasoning: bool = False
    include_sources: bool = False  # web searches show their sources
    include_results: bool = False  # file searches show their results
    tenant: str = ""  # whose the response will be (the hashed API key; '' without keys)
    compaction: Compaction | None = None  # `context_management`: compact a long context first
    generate: bool = True  # false: take the input (a client's prewarm) and generate nothing

    @property
    def include_logprobs(self) -> bool:
        return self.top_logprobs is not None


@dataclass(frozen=True)
class Compaction:
    """`context_management: [{"type": "compaction", "compact_threshold": N}]`: compact the
    context before generating when its prompt would pass N tokens (None: the model's context).
    `now`: the input ends with a `compaction_trigger` item: compact it all, generate nothing."""

    threshold: int | None = None
    now: bool = False


def _fail(message: str, param: str, code: str = "invalid_value") -> InvalidRequest:
    return InvalidRequest(message, param=param, code=code)


_KIND_NAMES = {
    dict: "an object",
    list: "an array",
    str: "a string",
    bool: "a boolean",
    int: "an integer",
    float: "a number",
}


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    return "a number" if type(value) is int else _KIND_NAMES.get(type(value), "a number")


def _get(body: Mapping[str, Any], key: str, kinds: tuple[type, ...], param: str) -> Any:
    """Read an optional field; None when absent or null; 400 when of the wrong type."""
    value = body.get(key)
    if value is None:
        return None
    # bool is an int in Python, not in JSON: keep them apart
    if isinstance(value, kinds) and (bool in kinds or not isinstance(value, bool)):
        return value
    wanted = " or ".join(_KIND_NAMES[k] for k in kinds)
    raise _fail(
        f"Invalid type for '{param}': expected {wanted}, got {_type_name(value)}.",
        param,
        "invalid_type",
    )


def _number(body: Mapping[str, Any], key: str, lo: float, hi: float) -> float | None:
    value = _get(body, key, (int, float), key)
    if value is not None and not lo <= value <= hi:
        raise _fail(f"Invalid '{key}': {value} is out of range; expected {lo} to {hi}.", key)
    return None if value is None else float(value)


def _integer(body: Mapping[str, Any], key: str, lo: int, hi: int | None = None) -> int | None:
    value = _get(body, key, (int,), key)
    if value is not None and (value < lo or (hi is not None and value > hi)):
        bound = f"at least {lo}" if hi is None else f"{lo} to {hi}"
        raise _fail(f"Invalid '{key}': {value} is out of range; expected {bound}.", key)
    return value  # type: ignore[no-any-return]


# ---- input items ------------------------------------------------------------------------------


def _input(raw: Any, name: str = "input") -> None:
    """Shallow checks of the input (or `name`'s items): a string, or a list of at most
    `MAX_INPUT_ITEMS` objects with a string `type`."""
    if isinstance(raw, str):
        return
    if not isinstance(raw, list):
        raise _fail(
            f"Invalid '{name}': expected a string or an array of items.", name, "invalid_type"
        )
    if len(raw) > MAX_INPUT_ITEMS:
        raise _fail(
            f"Invalid '{name}': {len(raw)} items; at most {MAX_INPUT_ITEMS} are allowed in "
            "one request.",
            name,
            "too_many_items",
        )
    for i, item in enumerate(raw):
        param = f"{name}[{i}]"
        if not isinstance(item, dict):
            raise _fail(f"Invalid '{param}': expected an object.", param, "invalid_type")
        if not isinstance(item.get("type", "message"), str):
            raise _fail(
                f"Invalid '{param}.type': expected a string.", f"{param}.type", "invalid_type"
            )


_ITEM_PREFIX = {
    "message": "msg",
    "function_call": "fc",
    "function_call_output": "fco",
    "custom_tool_call": "ctc",
    "custom_tool_call_output": "ctco",
    "tool_search_call": "ts",
    "tool_search_output": "tso",
    "additional_tools": "at",
    "configuration_update": "cu",
    "shell_call": "sh",
    "shell_call_output": "sho",
    "local_shell_call": "lsh",
    "apply_patch_call": "apc",
    "apply_patch_call_output": "apco",
    "reasoning": "rs",
    "compaction": "cmp",
    "compaction_summary": "cmp",
    "mcp_list_tools": "mcpl",
    "mcp_call": "mcp",
    "mcp_approval_request": "mcpr",
    "mcp_approval_response": "mcpa",
}


def canonical_input(raw: Any) -> tuple[dict[str, Any], ...]:
    """The input as items, as they are kept and listed: a string is one user message, string
    content becomes one text part, and every item has an id (`item_reference`s stay as they
    are until the store resolves them). Call after `_input` has checked `raw`'s shape; what is
    wrong inside an item is found where it is rendered."""
    items = [{"type": "message", "role": "user", "content": raw}] if isinstance(raw, str) else raw
    out: list[dict[str, Any]] = []
    for i, raw_item in enumerate(items):
        item = {"type": "message", **raw_item}
        kind = item["type"]
        if kind == "item_reference" and not is_id(item.get("id")):
            raise _fail(f"Invalid 'input[{i}].id': expected an item id.", f"input[{i}].id")
        if item.get("id") is not None and not is_id(item["id"]):
            raise _fail(
                f"Invalid 'input[{i}].id': expected a string of 1 to 200 characters.",
                f"input[{i}].id",
            )
        if kind == "item_reference":
            out.append({"type": "item_reference", "id": item["id"]})
            continue
        if kind == "message" and isinstance(item.get("content"), str):
            text = item["content"]
            part = (
                {"type": "output_text", "text": text, "annotations": []}
                if item.get("role") == "assistant"
                else {"type": "input_text", "text": text}
            )
            item["content"] = [part]
        if item.get("id") is None:
            item = {**item, "id": new_id(_ITEM_PREFIX.get(kind, "item"))}
        out.append(item)
    return tuple(out)


# ---- tools and settings -----------------------------------------------------------------------


def _text_format(body: Mapping[str, Any]) -> tuple[dict[str, Any], OutputFormat | None]:
    """(the `text` echo, the JSON output it asks for)."""
    text = _get(body, "text", (dict,), "text") or {}
    verbosity = text.get("verbosity") or "medium"
    if verbosity not in ("low", "medium", "high"):
        raise _fail("Invalid 'text.verbosity': expected low, medium or high.", "text.verbosity")
    fmt = text.get("format") or {"type": "text"}
    if not isinstance(fmt, dict):
        raise _fail("Invalid 'text.format': expected an object.", "text.format", "invalid_type")
    kind = fmt.get("type")
    if kind == "text":
        return {"format": {"type": "text"}, "verbosity": verbosity}, None
    if kind == "json_object":
        output = OutputFormat({"type": "object"}, kind="json_object")
        return {"format": {"type": "json_object"}, "verbosity": verbosity}, output
    if kind == "json_schema":
        echo = _json_schema_format(fmt)
        output = OutputFormat(echo["schema"], name=echo["name"], strict=echo["strict"])
        return {"format": echo, "verbosity": verbosity}, output
    raise _fail(
        f"Invalid 'text.format.type': {kind!r}; expected text, json_schema or json_object.",
        "text.format.type",
    )


@dataclass(frozen=True)
class Configuration:
    """What the `configuration_update` items of a context set, for the responses after them:
    each setting as the latest item that has it says (None: none does)."""

    reasoning_effort: str | None = None
    output: OutputFormat | None = None
    formatted: bool = False  # an item set `text.format` (to plain text, `output` None)


def configuration(
    items: Sequence[Mapping[str, Any]], params: Callable[[int], str]
) -> Configuration:
    """The settings `configuration_update` items carry; 400 naming a malformed one
    (`params(i)`: where item i came from)."""
    found = Configuration()
    for i, item in enumerate(items):
        if item.get("type") != "configuration_update":
            continue
        where = params(i)
        try:
            if item.get("reasoning") is not None:
                effort = _reasoning({"reasoning": item["reasoning"]})["effort"]
                found = replace(found, reasoning_effort=effort)
            if item.get("text") is not None:
                _, output = _text_format({"text": item["text"]})
                found = replace(found, output=output, formatted=True)
        except InvalidRequest as exc:
            said = exc.message.replace("'reasoning", f"'{where}.reasoning")
            said = said.replace("'text", f"'{where}.text")
            raise _fail(said, f"{where}.{exc.param}", exc.code or "invalid_value") from exc
    return found


def _json_schema_format(fmt: Mapping[str, Any]) -> dict[str, Any]:
    name = fmt.get("name")
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
        raise _fail(
            "Invalid 'text.format.name': 1-64 letters, digits, '_' or '-'.", "text.format.name"
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise _fail(
            "Missing or invalid 'text.format.schema': expected a JSON Schema object.",
            "text.format.schema",
        )
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _fail("Invalid 'text.format.strict': expected a boolean.", "text.format.strict")
    description = fmt.get("description")
    return {
        "type": "json_schema",
        "name": name,
        "schema": schema,
        "strict": strict,
        "description": description,
    }


_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_SUMMARIES = ("auto", "concise", "detailed")


def _reasoning(body: Mapping[str, Any]) -> dict[str, Any]:
    reasoning = _get(body, "reasoning", (dict,), "reasoning") or {}
    effort, summary = reasoning.get("effort"), reasoning.get("summary")
    if effort is not None and effort not in _EFFORTS:
        raise _fail(
            f"Invalid 'reasoning.effort': expected one of {', '.join(_EFFORTS)}.",
            "reasoning.effort",
        )
    if summary is not None and summary not in _SUMMARIES:
        raise _fail(
            f"Invalid 'reasoning.summary': expected one of {', '.join(_SUMMARIES)}.",
            "reasoning.summary",
        )
    return {"effort": effort, "summary": summary}


def _include(body: Mapping[str, Any]) -> list[str]:
    include = _get(body, "include", (list,), "include") or []
    for i, value in enumerate(include):
        if not isinstance(value, str) or value not in INCLUDABLE:
            raise _fail(f"Invalid 'include[{i}]': unknown value {value!r}.", f"include[{i}]")
    return list(include)


def check_shape(raw: list[Any], param: str) -> None:
    """Items shaped as `input` takes them: at most `MAX_INPUT_ITEMS` objects, each with a
    string `type` (400 naming the first that is not as `param[i]`)."""
    _input(raw, param)


def validate_metadata(body: Mapping[str, Any]) -> dict[str, str]:
    metadata = _get(body, "metadata", (dict,), "metadata") or {}
    if len(metadata) > 16:
        raise _fail("Invalid 'metadata': at most 16 keys.", "metadata")
    for key, value in metadata.items():
        if len(key) > 64 or not isinstance(value, str) or len(value) > 512:
            raise _fail(
                f"Invalid 'metadata.{key}': keys up to 64 characters, string values up to 512.",
                f"metadata.{key}",
            )
    return dict(metadata)


def _stop(body: Mapping[str, Any]) -> tuple[str, ...]:
    stop = _get(body, "stop", (str, list), "stop")
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise _fail("Invalid 'stop': up to 4 non-empty strings.", "stop")
    return tuple(stops)


def _sampling(
    body: Mapping[str, Any], default_temperature: float, cap: int | None
) -> SamplingParams:
    """Sampling settings; `cap`: the server's limit on output tokens (asking for more is a 400,
    asking for none gets it)."""
    temperature = _number(body, "temperature", 0.0, 2.0)
    top_p = _number(body, "top_p", 0.0, 1.0)
    if top_p == 0.0:
        raise _fail("Invalid 'top_p': must be greater than 0.", "top_p")
    penalty = _number(body, "repetition_penalty", 0.01, 10.0)
    seed = _integer(body, "seed", 0, 2**32 - 1)  # llama.cpp's seeds are 32-bit
    asked = _integer(body, "max_output_tokens", 1)
    if cap is not None and asked is not None and asked > cap:
        raise _fail(
            f"Invalid 'max_output_tokens': {asked} is more than this server allows ({cap}).",
            "max_output_tokens",
        )
    return SamplingParams(
        temperature=default_temperature if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        top_k=_integer(body, "top_k", 0) or 0,
        seed=seed,
        max_output_tokens=cap if asked is None else asked,
        stop=_stop(body),
        repetition_penalty=1.0 if penalty is None else penalty,
    )


@dataclass(frozen=True)
class _State:
    store: bool
    background: bool
    previous_response_id: str | None
    conversation_id: str | None


def _state(body: Mapping[str, Any], can_store: bool) -> _State:
    """`store`, `background`, `previous_response_id`, `conversation`."""
    store = _get(body, "store", (bool,), "store")
    store = can_store if store is None else store and can_store
    background = bool(_get(body, "background", (bool,), "background"))
    if background and not store:
        raise _fail(
            "'background' requires 'store' to be true (and a server that stores responses).",
            "background",
        )
    previous = _get(body, "previous_response_id", (str,), "previous_response_id")
    conversation = _get(body, "conversation", (str, dict), "conversation")
    if isinstance(conversation, dict):
        conversation = conversation.get("id")
        if not isinstance(conversation, str):
            raise _fail("Invalid 'conversation.id': expected a string.", "conversation.id")
    if previous is not None and conversation is not None:
        raise _fail(
            "'previous_response_id' and 'conversation' cannot be used together.", "conversation"
        )
    if previous is not None and not is_id(previous):
        raise NotFound(
            f"Previous response with id {previous!r} not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    if conversation is not None and not is_id(conversation):
        raise NotFound(f"Conversation with id {conversation!r} not found.", param="conversation")
    return _State(store, background, previous, conversation)


def _check_forced(
    toolset: ToolSet, mcp: McpChoice | None, output: OutputFormat | None, stop: tuple[str, ...]
) -> None:
    """A forced call owns the reply: not with a JSON `text.format`. A stop sequence could cut a
    JSON output or a forced call short before it is valid: not with either."""
    forced = mcp is not None or toolset.mode == "required"
    if forced and output is not None:
        raise _fail("A forced tool call cannot also follow 'text.format'.", "tool_choice")
    if stop and (forced or output is not None):
        raise _fail(
            "'stop' cannot be combined with a JSON 'text.format' or a forced tool call: "
            "a stop sequence could cut the output before it is valid.",
            "stop",
        )


_TRUNCATIONS = ("auto", "disabled")
_SERVICE_TIERS = ("auto", "default", "flex", "scale", "priority")


def _choice(body: Mapping[str, Any], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = body.get(key)
    if value is None:
        return default
    if value not in allowed:
        raise _fail(f"Invalid '{key}': expected one of {', '.join(allowed)}.", key)
    return str(value)


def normalize(
    body: Any,
    *,
    served_model: str,
    default_temperature: float = 1.0,
    max_output_tokens: int | None = None,
    can_store: bool = False,
    mcp_servers: frozenset[str] = frozenset(),
    web_search: bool = False,
    web_pages: bool = True,
    file_search: bool = False,
) -> ResponseRequest:
    """Validate a `POST /v1/responses` body; raise `InvalidRequest` naming the bad parameter.

    The server's settings: `max_output_tokens`, the most a request may ask for (and what one
    that asks none gets); `can_store`, it keeps responses (then `store` defaults to true);
    `mcp_servers`, the labels of the MCP servers its operator configured; `web_search`, it
    runs `web_search` through a backend its operator configured (`web_pages`: and opens
    pages); `file_search`, it runs `file_search` over the vector stores it keeps.
    """
    if not isinstance(body, dict):
        raise _fail("The request body must be a JSON object.", "body", "invalid_type")
    state = _state(body, can_store)
    model = _get(body, "model", (str,), "model") or served_model
    if len(model) > MAX_MODEL_NAME:
        raise _fail(
            f"Invalid 'model': a model name is at most {MAX_MODEL_NAME} characters.", "model"
        )
    instructions = _get(body, "instructions", (str,), "instructions")
    raw_input = body.get("input")
    _check_input(raw_input)
    wire_tools = _get(body, "tools", (list,), "tools") or []
    if len(wire_tools) > MAX_TOOLS:
        raise _fail(
            f"Invalid 'tools': {len(wire_tools)} tools; at most {MAX_TOOLS} are allowed.",
            "tools",
            "too_many_tools",
        )
    servers = parse_servers(wire_tools, mcp_servers)
    tool_choice = body.get("tool_choice", "auto")
    mcp_choice = parse_choice(tool_choice, servers)
    if mcp_choice is not None and any(s.deferred and s.label == mcp_choice.label for s in servers):
        raise _fail(
            f"Invalid 'tool_choice': the MCP server {mcp_choice.label!r} is deferred; its tools "
            "are offered once the tool search finds them, so none can be forced.",
            "tool_choice",
        )
    parsed = parse_tools(wire_tools, web=web_search, pages=web_pages, files=file_search)
    searching = any(t.kind in ("tool_search", "server_tool_search") for t in parsed)
    choice = "auto" if mcp_choice else tool_choice
    tools = resolve(parsed, choice, bool(servers), searching)
    parallel = _get(body, "parallel_tool_calls", (bool,), "parallel_tool_calls")
    parallel = True if parallel is None else parallel
    sampling = _sampling(body, default_temperature, max_output_tokens)
    text_echo, output = _text_format(body)
    _check_forced(tools, mcp_choice, output, sampling.stop)
    reasoning = _reasoning(body)
    include = _include(body)
    top_logprobs = _integer(body, "top_logprobs", 0, 20)
    max_tool_calls = _integer(body, "max_tool_calls", 1)
    echo = {
        "background": state.background,
        "frequency_penalty": 0.0,
        "presence_penalty": 0.0,
        "instructions": instructions,
        "max_output_tokens": _integer(body, "max_output_tokens", 1),
        "max_tool_calls": max_tool_calls,
        "metadata": validate_metadata(body),
        "parallel_tool_calls": parallel,
        "previous_response_id": state.previous_response_id,
        "prompt_cache_key": _get(body, "prompt_cache_key", (str,), "prompt_cache_key"),
        "reasoning": reasoning,
        "safety_identifier": _get(body, "safety_identifier", (str,), "safety_identifier"),
        "service_tier": _choice(body, "service_tier", _SERVICE_TIERS, "default"),
        "store": state.store,
        "temperature": sampling.temperature,
        "text": text_echo,
        "tool_choice": tool_choice,
        "tools": echo_tools(wire_tools),
        "top_logprobs": top_logprobs or 0,
        "top_p": sampling.top_p,
        "truncation": _choice(body, "truncation", _TRUNCATIONS, "disabled"),
        "user": _get(body, "user", (str,), "user"),
    }
    if state.conversation_id is not None:
        echo["conversation"] = {"id": state.conversation_id}
    trigger = _trigger(raw_input)
    return ResponseRequest(
        model=model,
        stream=_get(body, "stream", (bool,), "stream") or False,
        sampling=sampling,
        tools=tools,
        parallel_tool_calls=parallel,
        output=output,
        top_logprobs=(top_logprobs or 0) if LOGPROBS_INCLUDE in include else None,
        reasoning_effort=reasoning["effort"],
        servers=servers,
        mcp_choice=mcp_choice,
        max_tool_calls=max_tool_calls,
        echo=echo,
        input_items=canonical_input(raw_input),
        instructions=instructions,
        store=state.store,
        background=state.background,
        previous_response_id=state.previous_response_id,
        conversation_id=state.conversation_id,
        include_encrypted_reasoning=ENCRYPTED_REASONING in include,
        include_sources="web_search_call.action.sources" in include,
        include_results="file_search_call.results" in include,
        compaction=Compaction(now=True) if trigger else _compaction(body),
        generate=not trigger and _get(body, "generate", (bool,), "generate") is not False,
    )


def _check_input(raw: Any) -> None:
    """The input is there and shaped as items. What is inside each item, and whether the model
    is given something to respond to, the turn finds as it renders them (once)."""
    if raw is None:
        raise _fail("Missing required parameter: 'input'.", "input", "missing_required_parameter")
    _input(raw)


def _trigger(raw: Any) -> bool:
    """The input ends with a `compaction_trigger` item (400 for one anywhere else)."""
    if not isinstance(raw, list):
        return False
    where = [
        i for i, item in enumerate(raw) if isinstance(item, dict) and item.get("type") == TRIGGER
    ]
    if where and where != [len(raw) - 1]:
        raise _fail(
            "A 'compaction_trigger' item must be the last input item.", f"input[{where[0]}]"
        )
    return bool(where)


def _compaction(body: Mapping[str, Any]) -> Compaction | None:
    entries = _get(body, "context_management", (list,), "context_management")
    found: Compaction | None = None
    for i, entry in enumerate(entries or []):
        p = f"context_management[{i}]"
        if not isinstance(entry, dict):
            raise _fail(f"Invalid '{p}': expected an object.", p, "invalid_type")
        if entry.get("type") != "compaction":
            raise _fail(
                f"Invalid '{p}.type': {entry.get('type')!r}; only 'compaction' is supported.",
                f"{p}.type",
            )
        threshold = entry.get("compact_threshold")
        if threshold is not None and (
            not isinstance(threshold, int) or isinstance(threshold, bool) or threshold < 1000
        ):
            raise _fail(
                f"Invalid '{p}.compact_threshold': expected an integer of at least 1000 (tokens).",
                f"{p}.compact_threshold",
            )
        found = Compaction(threshold)
    return found


@dataclass(frozen=True)
class CompactRequest:
    """A validated `POST /v1/responses/compact` body."""

    model: str
    input_items: tuple[dict[str, Any], ...]
    previous_response_id: str | None


def normalize_compact(body: Any) -> CompactRequest:
    """`model` (required), `input`, `instructions`, `previous_response_id`, `prompt_cache_key`:
    the history to compact, its shape checked as a create request's input is (its items are
    validated as the turn resolves them, `turn.items_of`)."""
    if not isinstance(body, dict):
        raise _fail("The request body must be a JSON object.", "body", "invalid_type")
    model = _get(body, "model", (str,), "model")
    if not model:
        raise _fail("Missing required parameter: 'model'.", "model", "missing_required_parameter")
    _get(body, "instructions", (str,), "instructions")
    _get(body, "prompt_cache_key", (str,), "prompt_cache_key")
    previous = _get(body, "previous_response_id", (str,), "previous_response_id")
    raw = body.get("input")
    if raw is None and previous is None:
        raise _fail(
            "Missing required parameter: 'input' (or 'previous_response_id').",
            "input",
            "missing_required_parameter",
        )
    items: tuple[dict[str, Any], ...] = ()
    if raw is not None:
        _input(raw)
        items = canonical_input(raw)
    if previous is not None and not is_id(previous):
        raise NotFound(
            f"Previous response with id {previous!r} not found.",
            param="previous_response_id",
            code="previous_response_not_found",
        )
    return CompactRequest(model, items, previous)
