"""The server's settings: frozen dataclasses, one per part `oars serve` builds, each default
written once, in its field.

A field the operator may set names its flag, its `OARS_*` variable and its help
(`oars.flags.setting`): `oars serve`'s parser, the environment and the docs' flag table are
all made from these fields, so none of them holds a default of its own. A flag beats its
variable, and a variable beats the field's default.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from oars import flags
from oars.families import CALL_FORMATS
from oars.flags import names, setting
from oars.mcp.limits import Limits as McpLimits

ON_OFF: Mapping[str, bool] = {"on": True, "off": False}
AUTO_ON_OFF: Mapping[str, bool | None] = {"auto": None, **ON_OFF}


def days(text: str) -> float:
    """A number of days, 0 or more."""
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a number of days (0 or more)")
    return value


@dataclass(frozen=True)
class EngineSettings:
    """The embedded llama.cpp engine: which model, and how it decodes."""

    model: str | None = setting(
        None,
        "--model",
        "a GGUF file, a model in the cache by name (`oars models`), or 'default' for the "
        "built-in model (pulled on first use); the default without --upstream",
        env="MODEL",
    )
    model_id: str | None = setting(None, "--model-id", "the name /v1/models reports")
    context: int = setting(
        16384, "--ctx", "context window of each sequence, in tokens", env="CTX", parse=int
    )
    threads: int | None = setting(
        None, "--threads", "CPU threads the engine runs on (default: one per core)", parse=int
    )
    parallel: int | None = setting(
        None,
        "--parallel",
        "sequences decoded at once (default: 4, fewer past a 16k --ctx)",
        env="PARALLEL",
        parse=int,
    )
    queue_depth: int = setting(
        64,
        "--queue-depth",
        "requests that may wait for a sequence; past them, 429",
        env="QUEUE_DEPTH",
        parse=int,
    )
    prefill_chunk: int = setting(
        256,
        "--prefill-chunk",
        "prompt tokens fed per step (a step's pause for running streams)",
        parse=int,
    )
    prefix_cache_mb: int = setting(
        2048,
        "--prefix-cache-mb",
        "disk kept for evaluated long prompts under OARS_HOME, all models (0: none)",
        env="PREFIX_CACHE_MB",
        parse=int,
    )
    prefix_cache_min_tokens: int = setting(
        1024, "--prefix-cache-min-tokens", "the shortest prompt worth keeping on disk", parse=int
    )
    gpu_layers: int | None = setting(
        None,
        "--gpu-layers",
        "layers to offload to a GPU (-1: all; default: all when the engine "
        "was built with a GPU backend, `make serve GPU=cuda|metal|vulkan`)",
        env="GPU_LAYERS",
        parse=int,
    )
    flash_attn: bool | None = setting(
        None,
        "--flash-attn",
        "llama.cpp's flash attention (default: off on the CPU, llama.cpp's choice on a "
        "GPU). On the CPU it is faster for long prompts and slower for a short turn after a "
        "long context, and a request's text then depends on what runs beside it",
        words=ON_OFF,
    )
    speculation: bool | None = setting(
        None,
        "--speculation",
        "draft tokens from the context (a match of the last tokens earlier in the prompt or "
        "output) and verify them in the same pass. auto: as far as the engine's pass costs, "
        "measured at startup, and each sequence's acceptance say it pays; on: as if extra rows "
        "cost nothing (a GPU's case), by acceptance alone",
        env="SPECULATION",
        words=AUTO_ON_OFF,
    )
    tool_format: str | None = setting(
        None,
        "--tool-format",
        "how the model writes tool calls (default: guessed from its template)",
        words={name: name for name in CALL_FORMATS},
    )
    small_model_guards: bool | None = setting(
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
class EmbeddingSettings:
    """The embedding model `/v1/embeddings` and vector stores run (llama.cpp in-process, or
    another server's)."""

    model: str | None = setting(
        None,
        "--embedding-model",
        "a GGUF file, a model in the cache by name, MODEL=URL for a model another server "
        "runs (OpenAI's /embeddings at URL, …/v1), or 'off' (default: the built-in "
        "all-minilm-l6-v2 when `oars pull` has fetched it, else none)",
        env="EMBEDDING_MODEL",
        metavar="PATH|NAME|MODEL=URL",
    )


@dataclass(frozen=True)
class UpstreamSettings:
    """The gateway: models served by OpenAI-compatible chat-completions servers."""

    upstreams: tuple[str, ...] = setting(
        (),
        "--upstream",
        "serve MODEL from an OpenAI-compatible chat-completions server at URL (…/v1); repeatable",
        repeat=True,
        metavar="MODEL=URL",
    )
    upstreams_file: str | None = setting(
        None,
        "--upstreams",
        "a TOML file of [[upstream]] tables (model, url, api_key_env, parse_calls, …)",
        env="UPSTREAMS",
        metavar="FILE",
    )
    reads_per_second: float = setting(
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

    servers: tuple[str, ...] = setting(
        (),
        "--mcp-server",
        "an MCP server requests may name by its label alone (trusted: any address); repeatable",
        repeat=True,
        metavar="LABEL=URL",
    )
    servers_file: str | None = setting(
        None,
        "--mcp-servers",
        "a TOML file of [[mcp_server]] tables (label, url or command, headers_env, env)",
        env="MCP_SERVERS",
        metavar="FILE",
    )
    allow: tuple[str, ...] = setting(
        (),
        "--mcp-allow",
        "request-named MCP server URLs under this prefix may reach loopback and private "
        "addresses (refused otherwise); repeatable",
        repeat=True,
        metavar="URL_PREFIX",
    )
    call_seconds: float = setting(
        McpLimits.call_seconds,  # the MCP client's own, written there
        "--mcp-timeout",
        "seconds one MCP tool call may take",
        env="MCP_TIMEOUT",
        parse=float,
    )


@dataclass(frozen=True)
class WebSettings:
    """The `web_search` tool: the search service oars runs it through, and the pages the
    model may open."""

    search: str | None = setting(
        None,
        "--web-search",
        "run web_search through searxng=URL, brave=URL or tavily=URL (an API of that kind; "
        "its key in OARS_WEB_SEARCH_KEY) or mcp=LABEL[:TOOL] (a tool, default 'search', of "
        "an --mcp-server); without it the tool is not offered",
        env="WEB_SEARCH",
        metavar="KIND=TARGET",
    )
    allow: tuple[str, ...] = setting(
        (),
        "--web-allow",
        "pages under this URL prefix may be opened on loopback and private addresses "
        "(refused otherwise); repeatable",
        repeat=True,
        metavar="URL_PREFIX",
    )
    timeout: float = setting(
        10.0,
        "--web-timeout",
        "seconds a search, or opening a page, may take",
        env="WEB_TIMEOUT",
        parse=float,
    )
    fetch: bool = setting(
        True,
        "--web-fetch",
        "whether web_search may open the pages it found (off: it only searches)",
        env="WEB_FETCH",
        words=ON_OFF,
    )


@dataclass(frozen=True)
class StoreSettings:
    """Where responses are kept."""

    url: str | None = setting(
        None,
        "--store",
        "where responses are kept: a SQLite file path, sqlite:///PATH, postgresql://… "
        "(shared by replicas), or 'none' (default: OARS_HOME/oars.db)",
        env="STORE",
    )


@dataclass(frozen=True)
class Limits:
    """What one request may ask for and take; past each, a 4xx (or 429) before any work."""

    max_body_bytes: int = setting(
        64 * 2**20,
        "--max-body-bytes",
        "largest request body accepted (413 past it)",
        env="MAX_BODY_BYTES",
        parse=int,
    )
    body_seconds: float = 60.0  # to send the body (408 past it); an upload's, between chunks
    max_file_bytes: int = setting(
        512 * 2**20,
        "--max-file-bytes",
        "largest file POST /v1/files accepts, streamed to disk (413 past it)",
        env="MAX_FILE_BYTES",
        parse=int,
    )
    max_output_tokens: int | None = setting(
        None,
        "--max-output-tokens",
        "the most output tokens a request may ask for (400 above; the "
        "limit of requests that ask none)",
        env="MAX_OUTPUT_TOKENS",
        parse=int,
    )
    concurrent_per_key: int | None = setting(
        None,
        "--max-concurrent-per-key",
        "unfinished responses one API key may have (429 + Retry-After past it)",
        env="MAX_CONCURRENT_PER_KEY",
        parse=int,
    )
    request_timeout: float = setting(
        1800.0,
        "--request-timeout",
        "seconds a generation may run before it fails (0: none)",
        env="REQUEST_TIMEOUT",
        parse=float,
    )
    keepalive_seconds: float = setting(
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

    host: str = setting("127.0.0.1", "--host", "the address to listen on", env="HOST")
    port: int = setting(8000, "--port", "the port to listen on", env="PORT", parse=int)
    retention_days: float = setting(
        0.0,
        "--retention",
        "days a stored response or conversation is kept; the sweeper deletes those older "
        "(a conversation once no response in it is younger). 0: kept until deleted",
        env="RETENTION",
        parse=days,
        metavar="DAYS",
    )
    replica: str | None = setting(
        None,
        "--replica",
        "this replica's name in the store (default: host:port, stable across restarts)",
        env="REPLICA",
    )
    workers: int = setting(
        1,
        "--workers",
        "gateway processes on the one port (with --upstream only; each worker i is the "
        "replica NAME/i, sharing the store)",
        env="WORKERS",
        parse=int,
    )
    lease_seconds: float = 10.0  # a replica that has not renewed its runs for this long is gone
    temperature: float | None = setting(
        None,
        "--temperature",
        "temperature for requests that set none (default 1.0, as OpenAI)",
        parse=float,
    )
    api_keys: tuple[str, ...] = setting(
        (),
        "--api-key",
        "a key clients must send as 'Authorization: Bearer KEY'; repeatable "
        "(also OARS_API_KEYS, comma-separated); what a key stores only it sees",
        env="API_KEYS",
        repeat=True,
        metavar="KEY",
    )
    api_keys_file: str | None = setting(
        None,
        "--api-keys",
        "a file of API keys, one per line ('#' starts a comment)",
        env="API_KEYS_FILE",
        metavar="FILE",
    )
    public: tuple[str, ...] = setting(
        ("health", "metrics"),
        "--public",
        "routes open without a key, of: health, metrics ('' for none)",
        env="PUBLIC",
        parse=names,
    )
    allow_unauthenticated: bool = setting(
        False,
        "--allow-unauthenticated",
        "serve beyond loopback without API keys (behind a proxy that checks callers)",
        switch=True,
    )
    log_level: str = setting(
        "info",
        "--log-level",
        "debug, info, warning or error (debug adds llama.cpp's log and a line per forward pass)",
        env="LOG_LEVEL",
    )
    log_format: str = setting(
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
    embedding: EmbeddingSettings = field(default_factory=EmbeddingSettings)
    upstream: UpstreamSettings = field(default_factory=UpstreamSettings)
    mcp: McpSettings = field(default_factory=McpSettings)
    web: WebSettings = field(default_factory=WebSettings)
    store: StoreSettings = field(default_factory=StoreSettings)
    server: ServerSettings = field(default_factory=ServerSettings)


def add_flags(parser: argparse.ArgumentParser) -> None:
    """`oars serve`'s flags, one per setting, in a group per part."""
    flags.add_flags(parser, Settings)


def from_args(args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
    """The settings `oars serve` was given: a flag, else its variable, else the default."""
    return flags.read(Settings, args, environ)


def flag_rows() -> Iterator[tuple[str, str, str, str]]:
    """`oars serve`'s flags for a table: the flag, its `OARS_*` variable ('' if none), its
    default as typed ('' if none) and its help."""
    return flags.rows(Settings)
