"""`oars serve`, `oars pull`, `oars check`, `oars validate`."""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from oars.errors import OarsError, SetupError

if TYPE_CHECKING:
    from oars.engines.upstream import UpstreamConfig
    from oars.mcp.config import McpConfig
from oars.families import CALL_FORMATS

ON_OFF = {"on": True, "off": False}  # a switch's word; anything else (auto, unset): None


def _env(name: str, default: str) -> str:
    return os.environ.get(f"OARS_{name}", default)


def _env_int(name: str) -> int | None:
    value = os.environ.get(f"OARS_{name}")
    return int(value) if value else None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="oars", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="serve the Responses API")
    serve.add_argument(
        "--model",
        default=_env("MODEL", "") or None,
        help="a GGUF file, a model in the cache by name (`oars models`), or 'default' for the "
        "built-in model (pulled on first use); the default without --upstream",
    )
    serve.add_argument(
        "--upstream",
        action="append",
        default=[],
        metavar="MODEL=URL",
        help="serve MODEL from an OpenAI-compatible chat-completions server at URL (…/v1); "
        "repeatable",
    )
    serve.add_argument(
        "--upstreams",
        default=_env("UPSTREAMS", "") or None,
        metavar="FILE",
        help="a TOML file of [[upstream]] tables (model, url, api_key_env, parse_calls, …)",
    )
    serve.add_argument("--model-id", default=None, help="the name /v1/models reports")
    serve.add_argument("--host", default=_env("HOST", "127.0.0.1"))
    serve.add_argument("--port", type=int, default=int(_env("PORT", "8000")))
    serve.add_argument(
        "--ctx",
        type=int,
        default=int(_env("CTX", "16384")),
        help="context window of each sequence, in tokens",
    )
    serve.add_argument("--threads", type=int, default=None)
    serve.add_argument(
        "--parallel",
        type=int,
        default=_env_int("PARALLEL"),
        help="sequences decoded at once (default: 4, fewer past a 16k --ctx)",
    )
    serve.add_argument(
        "--queue-depth",
        type=int,
        default=_env_int("QUEUE_DEPTH") or 64,
        help="requests that may wait for a sequence; past them, 429",
    )
    serve.add_argument(
        "--prefill-chunk",
        type=int,
        default=256,
        help="prompt tokens fed per step (a step's pause for running streams)",
    )
    serve.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=_env_int("PREFIX_CACHE_MB") or 2048,
        help="disk kept for evaluated long prompts under OARS_HOME, all models (0: none)",
    )
    serve.add_argument(
        "--prefix-cache-min-tokens",
        type=int,
        default=1024,
        help="the shortest prompt worth keeping on disk",
    )
    serve.add_argument(
        "--gpu-layers",
        type=int,
        default=_env_int("GPU_LAYERS"),
        help="layers to offload to a GPU (-1: all; default: all when the engine "
        "was built with a GPU backend, `make serve GPU=cuda|metal|vulkan`)",
    )
    serve.add_argument(
        "--flash-attn",
        choices=("on", "off"),
        default=None,
        help="llama.cpp's flash attention (default: off on the CPU, llama.cpp's choice on a "
        "GPU). On the CPU it is faster for long prompts and slower for a short turn after a "
        "long context, and a request's text then depends on what runs beside it",
    )
    serve.add_argument(
        "--tool-format",
        choices=CALL_FORMATS,
        default=None,
        help="how the model writes tool calls (default: guessed from its template)",
    )
    serve.add_argument(
        "--small-model-guards",
        choices=("auto", "on", "off"),
        default=_env("SMALL_MODEL_GUARDS", "auto"),
        help="the workarounds a small Hermes-family model needs after a tool result (auto: on "
        "for models of at most 1.5B parameters, as the default model)",
    )
    serve.add_argument(
        "--temperature",
        type=float,
        default=None,
        help="temperature for requests that set none (default 1.0, as OpenAI)",
    )
    serve.add_argument(
        "--store",
        default=_env("STORE", ""),
        help="where responses are kept: a SQLite file path, sqlite:///PATH, postgresql://… "
        "(shared by replicas), or 'none' (default: OARS_HOME/oars.db)",
    )
    serve.add_argument(
        "--replica",
        default=_env("REPLICA", "") or None,
        help="this replica's name in the store (default: host:port, stable across restarts)",
    )
    serve.add_argument(
        "--workers",
        type=int,
        default=int(_env("WORKERS", "1")),
        help="gateway processes on the one port (with --upstream only; each worker i is the "
        "replica NAME/i, sharing the store)",
    )
    serve.add_argument(
        "--upstream-reads",
        type=float,
        default=float(_env("UPSTREAM_READS", "1000")),
        help="reads a second shared among the open upstream streams (default 1000): with S "
        "streams each is read at most every S/N s (at most 50 ms apart), what came between "
        "going on as one delta; 0: every chunk as it comes",
    )
    serve.add_argument(
        "--max-body-bytes",
        type=int,
        default=int(_env("MAX_BODY_BYTES", str(64 * 2**20))),
        help="largest request body accepted (413 past it; default 64 MiB)",
    )
    serve.add_argument(
        "--max-output-tokens",
        type=int,
        default=_env_int("MAX_OUTPUT_TOKENS"),
        help="the most output tokens a request may ask for (400 above; the "
        "limit of requests that ask none)",
    )
    serve.add_argument(
        "--max-concurrent-per-key",
        type=int,
        default=_env_int("MAX_CONCURRENT_PER_KEY"),
        help="unfinished responses one API key may have (429 + Retry-After past it)",
    )
    serve.add_argument(
        "--request-timeout",
        type=float,
        default=float(_env("REQUEST_TIMEOUT", "1800")),
        help="seconds a generation may run before it fails (default 1800; 0: none)",
    )
    serve.add_argument(
        "--keepalive",
        type=float,
        default=float(_env("KEEPALIVE", "15")),
        help="seconds of silence after which a stream gets an SSE comment, and a WebSocket a "
        "ping (default 15), so proxies that cut idle connections keep a long prefill's",
    )
    serve.add_argument(
        "--api-key",
        action="append",
        default=[],
        metavar="KEY",
        help="a key clients must send as 'Authorization: Bearer KEY'; repeatable "
        "(also OARS_API_KEYS, comma-separated); what a key stores only it sees",
    )
    serve.add_argument(
        "--api-keys",
        default=_env("API_KEYS_FILE", "") or None,
        metavar="FILE",
        help="a file of API keys, one per line ('#' starts a comment)",
    )
    serve.add_argument(
        "--public",
        default=_env("PUBLIC", "health,metrics"),
        help="routes open without a key, of: health, metrics (default both; '' for none)",
    )
    serve.add_argument(
        "--allow-unauthenticated",
        action="store_true",
        help="serve beyond loopback without API keys (behind a proxy that checks callers)",
    )
    serve.add_argument(
        "--mcp-server",
        action="append",
        default=[],
        metavar="LABEL=URL",
        help="an MCP server requests may name by its label alone (trusted: any address); "
        "repeatable",
    )
    serve.add_argument(
        "--mcp-servers",
        default=_env("MCP_SERVERS", "") or None,
        metavar="FILE",
        help="a TOML file of [[mcp_server]] tables (label, url or command, headers_env, env)",
    )
    serve.add_argument(
        "--mcp-allow",
        action="append",
        default=[],
        metavar="URL_PREFIX",
        help="request-named MCP server URLs under this prefix may reach loopback and private "
        "addresses (refused otherwise); repeatable",
    )
    serve.add_argument(
        "--mcp-timeout",
        type=float,
        default=float(_env("MCP_TIMEOUT", "60")),
        help="seconds one MCP tool call may take (default 60)",
    )
    serve.add_argument("--log-level", default=_env("LOG_LEVEL", "info"))
    serve.add_argument(
        "--log-format",
        choices=("text", "json"),
        default=_env("LOG_FORMAT", "text"),
        help="text lines, or one JSON object per line",
    )
    pull = sub.add_parser("pull", help="download and verify a model into the cache")
    pull.add_argument(
        "ref",
        nargs="?",
        default=None,
        help="a GGUF URL or hf://OWNER/REPO/FILE.gguf (default: the default model)",
    )
    pull.add_argument("--sha256", default=None, help="the file's expected sha256")
    pull.add_argument("--quiet", action="store_true", help="no progress bar")
    sub.add_parser("models", help="list the models in the cache")
    check = sub.add_parser("check", help="run the protocol battery against any Responses server")
    check.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000/v1")
    check.add_argument("--model", required=True)
    check.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", "unused"))
    check.add_argument("--json", action="store_true", help="print results as JSON")
    check.add_argument("--only", default="", help="comma-separated check names")
    check.add_argument("--max-tokens", type=int, default=48, help="max_output_tokens per request")
    validate = sub.add_parser("validate", help="check a saved SSE stream against the protocol")
    validate.add_argument("file", type=Path, help="the stream, as sent on the wire ('-' = stdin)")
    return parser


def _serve_workers(args: argparse.Namespace) -> int:
    """Check what can be checked once, then fork the workers (see `oars.workers`)."""
    from oars import logs
    from oars.workers import supervise

    logs.setup(args.log_level, args.log_format)
    _api_keys(args)
    if args.model is not None or not _upstreams(args):
        raise SetupError(
            "--workers is for the gateway (--upstream): the embedded engine runs in one "
            "process, its threads over every core"
        )
    _mcp(args)
    print(f"oars: {args.workers} workers on http://{args.host}:{args.port}/v1", flush=True)

    def serve(worker: int, listener: socket.socket) -> None:
        _serve(args, worker=worker, listener=listener)

    return supervise(args.host, args.port, args.workers, serve)


def _serve(
    args: argparse.Namespace,
    *,
    worker: int | None = None,
    listener: socket.socket | None = None,
) -> None:
    """Build the app and serve it: on `--host`/`--port`, or as worker `worker` on `listener`."""
    import uvicorn

    from oars import logs
    from oars.engines import Engine
    from oars.engines.upstream import Pacing, ReplicaSet, replica_name
    from oars.http import create_app
    from oars.http.app import default_replica
    from oars.http.common import Limits
    from oars.sealing import Sealer
    from oars.service import ResponsesService
    from oars.store import SqlStore
    from oars.toolbox import ToolboxFactory
    from oars.weights import DEFAULT_MODEL, oars_home, pull

    logs.setup(args.log_level, args.log_format)
    keys = _api_keys(args)  # before the model loads: a refusal comes at once
    upstreams = _upstreams(args)
    mcp = _mcp(args)
    engines: dict[str, Engine] = {}
    if args.model is not None or not upstreams:
        from oars.engines.devices import describe, gpu_layers
        from oars.engines.llama import LlamaEngine

        path, model_id = _model_file(args.model), args.model_id
        if path is None:
            path, model_id = pull(), model_id or DEFAULT_MODEL.name
        layers = gpu_layers(args.gpu_layers)
        engine = LlamaEngine(
            Path(path),
            model_id=model_id,
            n_ctx=args.ctx,
            n_threads=args.threads,
            tool_format=args.tool_format,
            guards=ON_OFF.get(args.small_model_guards),
            n_gpu_layers=layers,
            flash_attn=ON_OFF.get(args.flash_attn),
            parallel=args.parallel,
            queue_depth=args.queue_depth,
            prefill_chunk=args.prefill_chunk,
            prefix_folder=oars_home() / "prefixes",
            prefix_bytes=args.prefix_cache_mb * 2**20,
            prefix_min_tokens=args.prefix_cache_min_tokens,
        )
        print(
            f"oars: {engine.info.id}: {describe(layers)}, {engine.parallel} sequences of "
            f"{args.ctx} tokens, {engine.queue_depth} may wait"
            + (", flash attention on" if args.flash_attn == "on" else ""),
            flush=True,
        )
        engines[engine.info.id] = engine
    pacing = Pacing(args.upstream_reads)  # one for the process: its streams share the loop
    for config in upstreams:
        if config.model in engines:
            raise SetupError(f"the model {config.model!r} is served twice")
        engines[config.model] = ReplicaSet(config, pacing)
    home = oars_home()
    spec = args.store or str(home / "oars.db")
    store = None if spec == "none" else SqlStore(spec)
    service = ResponsesService(
        engines,
        default_temperature=args.temperature,
        sealer=Sealer.from_home(home),
        strict_models=bool(upstreams),
        toolboxes=ToolboxFactory(mcp),
    )
    replica = args.replica or default_replica(args.port)
    if worker is not None:
        replica = f"{replica}/{worker}"
    public = [f"/{name.strip()}" for name in args.public.split(",") if name.strip()]
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        max_output_tokens=args.max_output_tokens,
        concurrent_per_key=args.max_concurrent_per_key,
        request_timeout=args.request_timeout or None,
        keepalive_seconds=args.keepalive,
    )
    app = create_app(service, store, replica=replica, limits=limits, api_keys=keys, public=public)
    where = "nothing stored" if store is None else f"store {_redacted(spec)}, replica {replica}"
    print(
        f"oars: serving {', '.join(engines)} on http://{args.host}:{args.port}/v1 ({where})",
        flush=True,
    )
    if not worker:  # the first worker speaks for all
        for config in upstreams:
            urls = ", ".join(map(replica_name, config.urls))
            print(f"oars: {config.model} from {urls}", flush=True)
        for label in sorted(mcp.labels):
            print(f"oars: MCP server {label!r} for requests that name it", flush=True)
        print(f"oars: {_access(args, keys)}", flush=True)
    # What is loaded by now (modules, the vocabulary tables) lives as long as the process. A
    # full collection walking it took ~90 ms, a pause of every stream whenever one came.
    gc.collect()
    gc.freeze()
    # logging is set up above: uvicorn adds none of its own, and oars.access logs requests
    # a WebSocket frame may be as large as an HTTP body (a create with a long history)
    served = uvicorn.Config(
        app,
        host=args.host,
        port=args.port,
        log_level=args.log_level.lower(),
        log_config=None,
        access_log=False,
        ws_max_size=limits.max_body_bytes,
        ws_ping_interval=limits.keepalive_seconds,
    )
    server = uvicorn.Server(served)
    with contextlib.suppress(KeyboardInterrupt):
        server.run(sockets=None if listener is None else [listener])
    if not server.started:
        sys.exit(3)  # as uvicorn's own run: the lifespan (the store) failed to start


def _api_keys(args: argparse.Namespace) -> list[str]:
    keys = list(args.api_key)
    keys += [k.strip() for k in os.environ.get("OARS_API_KEYS", "").split(",") if k.strip()]
    if args.api_keys:
        try:
            lines = Path(args.api_keys).read_text().splitlines()
        except OSError as exc:
            raise SetupError(f"--api-keys: {exc}") from exc
        keys += [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]
    if not keys and not _loopback(args.host) and not args.allow_unauthenticated:
        raise SetupError(
            f"no API keys: oars serves {args.host} only with --api-key (or "
            "OARS_API_KEYS, --api-keys FILE), or --allow-unauthenticated"
        )
    return keys


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _access(args: argparse.Namespace, keys: list[str]) -> str:
    if keys:
        return f"{len(keys)} API keys; each sees only what it stored"
    if _loopback(args.host):
        return "no API keys: open to this machine only (loopback)"
    return f"no API keys: anyone who reaches {args.host}:{args.port} may use it and read everything"


def _model_file(model: str | None) -> Path | None:
    """--model: None for the default model; else a file, or a cached model by name."""
    from oars.download import cached, find
    from oars.weights import DEFAULT_MODEL

    if model in (None, "default", DEFAULT_MODEL.name):
        return None
    assert model is not None
    path = Path(model).expanduser()
    if path.is_file():
        return path
    found = find(model)
    if found is None:
        names = ", ".join(m.name for m in cached()) or "none"
        raise SetupError(
            f"--model {model!r} is neither a file nor a cached model "
            f"(cached: {names}; `oars pull URL` adds one)"
        )
    return found


def _pull(args: argparse.Namespace) -> None:
    from oars.download import pull_url, source
    from oars.weights import pull

    if args.ref is None or args.ref in ("default",):
        print(pull(quiet=args.quiet))
    else:
        print(pull_url(source(args.ref, args.sha256), quiet=args.quiet))


def _models() -> None:
    from oars.download import cached

    models = cached()
    if not models:
        print("no models in the cache (`oars pull` fetches the default one)")
    for model in models:
        print(f"{model.name:<48} {model.size / 2**20:>9.1f} MiB  {model.path}")


def _upstreams(args: argparse.Namespace) -> list[UpstreamConfig]:
    from oars.engines.upstream import load_upstreams, upstream_arg

    try:
        configs = [upstream_arg(text) for text in args.upstream]
        return configs + (load_upstreams(args.upstreams) if args.upstreams else [])
    except (ValueError, OSError) as exc:
        raise SetupError(f"--upstream: {exc}") from exc


def _mcp(args: argparse.Namespace) -> McpConfig:
    from oars.mcp.config import McpConfig, load_servers, server_arg

    try:
        servers = [server_arg(text) for text in args.mcp_server]
        servers += load_servers(args.mcp_servers) if args.mcp_servers else []
        return McpConfig.of(servers, args.mcp_allow, call_seconds=args.mcp_timeout)
    except (ValueError, OSError) as exc:
        raise SetupError(f"--mcp-server: {exc}") from exc


def _redacted(spec: str) -> str:
    """A database URL without its password."""
    head, at, tail = spec.rpartition("@")
    if not at or "://" not in head:
        return spec
    scheme, _, user = head.partition("://")
    return f"{scheme}://{user.split(':', 1)[0]}:***@{tail}"


def _check(args: argparse.Namespace) -> int:
    import dataclasses

    import httpx

    from oars.check import Checker, table

    headers = {"Authorization": f"Bearer {args.api_key}"}
    with httpx.Client(headers=headers) as client:
        checker = Checker(client, args.url, args.model, max_tokens=args.max_tokens)
        results = checker.run({n for n in args.only.split(",") if n} or None)
    if args.json:
        print(json.dumps([dataclasses.asdict(r) for r in results], indent=2))
    else:
        print(table(results))
    return 1 if any(r.status == "failed" for r in results) else 0


def _validate(args: argparse.Namespace) -> int:
    from oars.validator import validate_sse

    text = sys.stdin.read() if str(args.file) == "-" else args.file.read_text()
    report = validate_sse(text)
    print(
        json.dumps(
            {"ok": report.ok, "violations": [v.describe() for v in report.violations]}, indent=2
        )
    )
    return 0 if report.ok else 1


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "serve" and args.workers > 1:
            return _serve_workers(args)
        if args.command == "serve":
            _serve(args)
        elif args.command == "pull":
            _pull(args)
        elif args.command == "models":
            _models()
        elif args.command == "validate":
            return _validate(args)
        elif args.command == "check":
            return _check(args)
    except OarsError as exc:
        print(f"oars: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
