"""The server's settings: frozen dataclasses, one per part `oars serve` builds, each default
written once, in its field.

A field that the operator may set carries a `Flag` in its metadata: its command-line flag, its
`OARS_*` variable and its help. `oars serve`'s flags, the environment and the docs' flag table
are all read from those fields, so none of them can hold a default of its own. A flag beats its
variable, and a variable beats the field's default. An empty variable counts as unset, except
for a list, where it is the empty list; a repeatable flag's variable (comma-separated) adds to
what the flags give. Fields without a flag (a lease, the time to send a body) are set by code.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, get_type_hints

from oars.errors import SetupError
from oars.families import CALL_FORMATS
from oars.mcp.limits import Limits as McpLimits

_T = TypeVar("_T")

ON_OFF: Mapping[str, bool] = {"on": True, "off": False}
AUTO_ON_OFF: Mapping[str, bool | None] = {"auto": None, **ON_OFF}


def names(text: str) -> tuple[str, ...]:
    """A comma-separated list, each name stripped, empty names left out."""
    return tuple(name.strip() for name in text.split(",") if name.strip())


@dataclass(frozen=True)
class Flag:
    """How one setting is given: on `oars serve`'s command line and in the environment."""

    name: str  # "--ctx"
    help: str
    env: str | None = None  # "CTX": read from OARS_CTX
    parse: Callable[[str], Any] = str  # a flag's argument or a variable's text → the value
    words: Mapping[str, Any] | None = None  # a closed set: each word and what it means
    repeat: bool = False  # given once per value (a tuple)
    switch: bool = False  # present or absent, no argument
    metavar: str | None = None

    @property
    def variable(self) -> str:
        return f"OARS_{self.env}" if self.env else ""

    def value(self, text: str) -> Any:
        """What a variable's text (or a flag's word) means."""
        if self.words is not None:
            if text not in self.words:
                raise ValueError(f"expected one of {', '.join(self.words)}")
            return self.words[text]
        if self.repeat:
            return names(text)
        return self.parse(text)

    def shown(self, default: Any) -> str:
        """A default as it would be typed after the flag ('' where there is nothing to type)."""
        if self.words is not None:
            return next((word for word, v in self.words.items() if v == default), "")
        if default is None or self.switch or self.repeat:
            return ""
        if isinstance(default, tuple):
            return ",".join(default)
        if isinstance(default, float):
            return f"{default:g}"
        return str(default)


def _flag(default: _T, name: str, help: str, **how: Any) -> _T:
    """A field with a default that `name` (and, if named, an `OARS_*` variable) may replace."""
    flag = Flag(name, help, **how)
    return field(default=default, metadata={"flag": flag})


@dataclass(frozen=True)
class EngineSettings:
    """The embedded llama.cpp engine: which model, and how it decodes."""

    model: str | None = _flag(
        None,
        "--model",
        "a GGUF file, a model in the cache by name (`oars models`), or 'default' for the "
        "built-in model (pulled on first use); the default without --upstream",
        env="MODEL",
    )
    model_id: str | None = _flag(None, "--model-id", "the name /v1/models reports")
    context: int = _flag(
        16384, "--ctx", "context window of each sequence, in tokens", env="CTX", parse=int
    )
    threads: int | None = _flag(
        None, "--threads", "CPU threads the engine runs on (default: one per core)", parse=int
    )
    parallel: int | None = _flag(
        None,
        "--parallel",
        "sequences decoded at once (default: 4, fewer past a 16k --ctx)",
        env="PARALLEL",
        parse=int,
    )
    queue_depth: int = _flag(
        64,
        "--queue-depth",
        "requests that may wait for a sequence; past them, 429",
        env="QUEUE_DEPTH",
        parse=int,
    )
    prefill_chunk: int = _flag(
        256,
        "--prefill-chunk",
        "prompt tokens fed per step (a step's pause for running streams)",
        parse=int,
    )
    prefix_cache_mb: int = _flag(
        2048,
        "--prefix-cache-mb",
        "disk kept for evaluated long prompts under OARS_HOME, all models (0: none)",
        env="PREFIX_CACHE_MB",
        parse=int,
    )
    prefix_cache_min_tokens: int = _flag(
        1024, "--prefix-cache-min-tokens", "the shortest prompt worth keeping on disk", parse=int
    )
    gpu_layers: int | None = _flag(
        None,
        "--gpu-layers",
        "layers to offload to a GPU (-1: all; default: all when the engine "
        "was built with a GPU backend, `make serve GPU=cuda|metal|vulkan`)",
        env="GPU_LAYERS",
        parse=int,
    )
    flash_attn: bool | None = _flag(
        None,
        "--flash-attn",
        "llama.cpp's flash attention (default: off on the CPU, llama.cpp's choice on a "
        "GPU). On the CPU it is faster for long prompts and slower for a short turn after a "
        "long context, and a request's text then depends on what runs beside it",
        words=ON_OFF,
    )
    tool_format: str | None = _flag(
        None,
        "--tool-format",
        "how the model writes tool calls (default: guessed from its template)",
        words={name: name for name in CALL_FORMATS},
    )
    small_model_guards: bool | None = _flag(
        None,
        "--small-model-guards",
        "the workarounds a small Hermes-family model needs after a tool result (auto: on "
        "for models of at most 1.5B parameters, as the default model)",
        env="SMALL_MODEL_GUARDS",
        words=AUTO_ON_OFF,
    )

    @property
    def prefix_cache_bytes(self) -> int:
        return self.prefix_cache_mb * 2**20


@dataclass(frozen=True)
class UpstreamSettings:
    """The gateway: models served by OpenAI-compatible chat-completions servers."""

    upstreams: tuple[str, ...] = _flag(
        (),
        "--upstream",
        "serve MODEL from an OpenAI-compatible chat-completions server at URL (…/v1); repeatable",
        repeat=True,
        metavar="MODEL=URL",
    )
    upstreams_file: str | None = _flag(
        None,
        "--upstreams",
        "a TOML file of [[upstream]] tables (model, url, api_key_env, parse_calls, …)",
        env="UPSTREAMS",
        metavar="FILE",
    )
    reads_per_second: float = _flag(
        1000.0,
        "--upstream-reads",
        "reads a second shared among the open upstream streams: with S streams each is read "
        "at most every S/N s (at most 50 ms apart), what came between going on as one delta; "
        "0: every chunk as it comes",
        env="UPSTREAM_READS",
        parse=float,
    )


@dataclass(frozen=True)
class McpSettings:
    """The MCP servers the operator names, and what a request's own may reach."""

    servers: tuple[str, ...] = _flag(
        (),
        "--mcp-server",
        "an MCP server requests may name by its label alone (trusted: any address); repeatable",
        repeat=True,
        metavar="LABEL=URL",
    )
    servers_file: str | None = _flag(
        None,
        "--mcp-servers",
        "a TOML file of [[mcp_server]] tables (label, url or command, headers_env, env)",
        env="MCP_SERVERS",
        metavar="FILE",
    )
    allow: tuple[str, ...] = _flag(
        (),
        "--mcp-allow",
        "request-named MCP server URLs under this prefix may reach loopback and private "
        "addresses (refused otherwise); repeatable",
        repeat=True,
        metavar="URL_PREFIX",
    )
    call_seconds: float = _flag(
        McpLimits.call_seconds,  # the MCP client's own, written there
        "--mcp-timeout",
        "seconds one MCP tool call may take",
        env="MCP_TIMEOUT",
        parse=float,
    )


@dataclass(frozen=True)
class StoreSettings:
    """Where responses are kept."""

    url: str | None = _flag(
        None,
        "--store",
        "where responses are kept: a SQLite file path, sqlite:///PATH, postgresql://… "
        "(shared by replicas), or 'none' (default: OARS_HOME/oars.db)",
        env="STORE",
    )


@dataclass(frozen=True)
class Limits:
    """What one request may ask for and take; past each, a 4xx (or 429) before any work."""

    max_body_bytes: int = _flag(
        64 * 2**20,
        "--max-body-bytes",
        "largest request body accepted (413 past it)",
        env="MAX_BODY_BYTES",
        parse=int,
    )
    body_seconds: float = 60.0  # to send the body (408 past it)
    max_output_tokens: int | None = _flag(
        None,
        "--max-output-tokens",
        "the most output tokens a request may ask for (400 above; the "
        "limit of requests that ask none)",
        env="MAX_OUTPUT_TOKENS",
        parse=int,
    )
    concurrent_per_key: int | None = _flag(
        None,
        "--max-concurrent-per-key",
        "unfinished responses one API key may have (429 + Retry-After past it)",
        env="MAX_CONCURRENT_PER_KEY",
        parse=int,
    )
    request_timeout: float = _flag(
        1800.0,
        "--request-timeout",
        "seconds a generation may run before it fails (0: none)",
        env="REQUEST_TIMEOUT",
        parse=float,
    )
    keepalive_seconds: float = _flag(
        15.0,
        "--keepalive",
        "seconds of silence after which a stream gets an SSE comment, and a WebSocket a "
        "ping, so proxies that cut idle connections keep a long prefill's",
        env="KEEPALIVE",
        parse=float,
    )


@dataclass(frozen=True)
class ServerSettings:
    """The HTTP server: where it listens, who may call it, what a request may take."""

    host: str = _flag("127.0.0.1", "--host", "the address to listen on", env="HOST")
    port: int = _flag(8000, "--port", "the port to listen on", env="PORT", parse=int)
    replica: str | None = _flag(
        None,
        "--replica",
        "this replica's name in the store (default: host:port, stable across restarts)",
        env="REPLICA",
    )
    workers: int = _flag(
        1,
        "--workers",
        "gateway processes on the one port (with --upstream only; each worker i is the "
        "replica NAME/i, sharing the store)",
        env="WORKERS",
        parse=int,
    )
    lease_seconds: float = 10.0  # a replica that has not renewed its runs for this long is gone
    temperature: float | None = _flag(
        None,
        "--temperature",
        "temperature for requests that set none (default 1.0, as OpenAI)",
        parse=float,
    )
    api_keys: tuple[str, ...] = _flag(
        (),
        "--api-key",
        "a key clients must send as 'Authorization: Bearer KEY'; repeatable "
        "(also OARS_API_KEYS, comma-separated); what a key stores only it sees",
        env="API_KEYS",
        repeat=True,
        metavar="KEY",
    )
    api_keys_file: str | None = _flag(
        None,
        "--api-keys",
        "a file of API keys, one per line ('#' starts a comment)",
        env="API_KEYS_FILE",
        metavar="FILE",
    )
    public: tuple[str, ...] = _flag(
        ("health", "metrics"),
        "--public",
        "routes open without a key, of: health, metrics ('' for none)",
        env="PUBLIC",
        parse=names,
    )
    allow_unauthenticated: bool = _flag(
        False,
        "--allow-unauthenticated",
        "serve beyond loopback without API keys (behind a proxy that checks callers)",
        switch=True,
    )
    log_level: str = _flag(
        "info",
        "--log-level",
        "debug, info, warning or error (debug adds llama.cpp's log and a line per forward pass)",
        env="LOG_LEVEL",
    )
    log_format: str = _flag(
        "text",
        "--log-format",
        "text lines, or one JSON object per line",
        env="LOG_FORMAT",
        words={"text": "text", "json": "json"},
    )
    limits: Limits = field(default_factory=Limits)


@dataclass(frozen=True)
class Settings:
    """Everything `oars serve` is told, by part."""

    engine: EngineSettings = field(default_factory=EngineSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    mcp: McpSettings = field(default_factory=McpSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    server: ServerSettings = field(default_factory=ServerSettings)


# ---- flags and variables --------------------------------------------------------------------


def _fields(cls: type[Any], prefix: str = "") -> Iterator[tuple[str, Flag, Any]]:
    """Every field of `cls` with a flag, groups walked in order: its dotted path, its flag and
    its default."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        path = f"{prefix}{f.name}"
        if "flag" in f.metadata:
            yield path, f.metadata["flag"], f.default
        elif dataclasses.is_dataclass(hints[f.name]):
            yield from _fields(hints[f.name], f"{path}.")


def flags() -> Iterator[tuple[str, Flag, Any]]:
    """Every setting with a flag: its dotted path in `Settings`, its flag and its default."""
    return _fields(Settings)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """`oars serve`'s flags, one per setting, each in its part's group. None has a default of
    its own (`from_args` takes the field's for a flag not given)."""
    hints = get_type_hints(Settings)
    for part in dataclasses.fields(Settings):
        cls = hints[part.name]
        group = parser.add_argument_group(part.name, (cls.__doc__ or "").strip())
        for path, flag, default in _fields(cls, f"{part.name}."):
            _add(group, path, flag, default)


def _add(group: argparse._ArgumentGroup, dest: str, flag: Flag, default: Any) -> None:
    shown = flag.shown(default)
    text = f"{flag.help} (default: {shown})" if shown else flag.help
    how: dict[str, Any] = {"dest": dest, "default": argparse.SUPPRESS, "help": text}
    how["help"] = how["help"].replace("%", "%%")
    if flag.switch:
        group.add_argument(flag.name, action="store_true", **how)
        return
    if flag.words is not None:
        how["choices"] = tuple(flag.words)
    else:
        how["type"] = flag.parse
    if flag.repeat:
        how["action"] = "append"
    group.add_argument(flag.name, metavar=flag.metavar or _metavar(flag), **how)


def _metavar(flag: Flag) -> str | None:
    """As argparse would name it from the flag (`--ctx CTX`); a choice's words show as such."""
    return None if flag.words is not None else flag.name.lstrip("-").upper().replace("-", "_")


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """The settings `oars serve` was given: its flags (parsed by `add_flags`'s parser), else
    the `OARS_*` variables of `environ`, else the fields' defaults."""
    given = vars(args)
    values: dict[str, Any] = {}
    for path, flag, default in flags():
        try:
            values[path] = _value(flag, given.get(path), environ.get(flag.variable), default)
        except ValueError as exc:
            raise SetupError(f"{flag.variable}: {exc}") from exc
    return _build(Settings, values)


def _value(flag: Flag, given: Any, variable: str | None, default: Any) -> Any:
    if variable == "" and not (flag.repeat or flag.parse is names):
        variable = None  # an empty variable is unset, unless it is an empty list
    if flag.repeat:
        if given is None and variable is None:
            return default
        return tuple(given or ()) + (flag.value(variable) if variable else ())
    if given is not None:
        return flag.words[given] if flag.words is not None else given
    return default if variable is None else flag.value(variable)


def _build(cls: type[_T], values: Mapping[str, Any], prefix: str = "") -> _T:
    hints = get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        path = f"{prefix}{f.name}"
        if path in values:
            kwargs[f.name] = values[path]
        elif dataclasses.is_dataclass(hints[f.name]):
            kwargs[f.name] = _build(hints[f.name], values, f"{path}.")
    return cls(**kwargs)


def flag_rows() -> Iterator[tuple[str, str, str, str]]:
    """`oars serve`'s flags for a table: the flag, its variable ('' if none), its default as
    typed ('' if none) and its help."""
    for _, flag, default in flags():
        yield flag.name, flag.variable, flag.shown(default), flag.help
