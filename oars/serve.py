"""`oars serve`'s composition root: settings → engines → service → app → uvicorn.

The one module that knows every part by its concrete type: it builds the engines the settings
name, wires the gateway's engines into the metrics (so `oars.http` needs no engine), and serves
the app on a port, or as one of `--workers` processes on a socket of its own.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import socket
import sys
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from oars.errors import SetupError
from oars.settings import EngineSettings, Settings

if TYPE_CHECKING:
    from oars.embeddings import Embedder
    from oars.engines import Engine
    from oars.engines.upstream import UpstreamConfig
    from oars.mcp.config import McpConfig
    from oars.metrics import Metrics
    from oars.settings import McpSettings, ServerSettings, UpstreamSettings, WebSettings
    from oars.web_search import WebSearch


def main(settings: Settings) -> int:
    """Serve until stopped: in this process, or in `--workers` forked ones."""
    if settings.server.workers > 1:
        return _workers(settings)
    serve(settings)
    return 0


def _workers(settings: Settings) -> int:
    """Check what can be checked once, then fork the workers (see `oars.workers`)."""
    from oars import logs
    from oars.workers import supervise

    server = settings.server
    logs.setup(server.log_level, server.log_format)
    api_keys(server)
    if settings.engine.model is not None or not upstreams(settings.upstream):
        raise SetupError(
            "--workers is for the gateway (--upstream): the embedded engine runs in one "
            "process, its threads over every core"
        )
    web(settings.web, mcp(settings.mcp))
    print(f"oars: {server.workers} workers on http://{server.host}:{server.port}/v1", flush=True)

    def serve_one(worker: int, listener: socket.socket) -> None:
        serve(settings, worker=worker, listener=listener)

    return supervise(server.host, server.port, server.workers, serve_one)


def serve(
    settings: Settings,
    *,
    worker: int | None = None,
    listener: socket.socket | None = None,
) -> None:
    """Build the app and serve it: on `--host`/`--port`, or as worker `worker` on `listener`."""
    from oars import logs
    from oars.http import create_app
    from oars.http.app import default_replica
    from oars.metrics import Metrics
    from oars.ranking import searchers
    from oars.sealing import Sealer
    from oars.service import ResponsesService
    from oars.store import SqlStore
    from oars.toolbox import ToolboxFactory
    from oars.weights import oars_home

    server = settings.server
    logs.setup(server.log_level, server.log_format)
    keys = api_keys(server)  # before the model loads: a refusal comes at once
    gateway = upstreams(settings.upstream)
    tools = mcp(settings.mcp)
    search = web(settings.web, tools)
    engines = _engines(settings, gateway)
    home = oars_home()
    spec = settings.store.url or str(home / "oars.db")
    store = None if spec == "none" else SqlStore(spec)
    embedder = _embedder(settings, embedded=settings.engine.model is not None or not gateway)
    files = searchers(store, embedder) if store is not None else None  # over vector stores
    service = ResponsesService(
        engines,
        default_temperature=server.temperature,
        sealer=Sealer.from_home(home),
        strict_models=bool(gateway),
        toolboxes=ToolboxFactory(tools, web=search, files=files),
    )
    metrics = Metrics()
    observe(metrics, engines)
    replica = server.replica or default_replica(server.port)
    if worker is not None:
        replica = f"{replica}/{worker}"
    here = dataclasses.replace(server, replica=replica, api_keys=tuple(keys))
    app = create_app(
        service, store, settings=here, metrics=metrics, files=home / "files", embedder=embedder
    )
    where = "nothing stored" if store is None else f"store {_redacted(spec)}, replica {replica}"
    print(
        f"oars: serving {', '.join(engines)} on http://{server.host}:{server.port}/v1 ({where})",
        flush=True,
    )
    if not worker:  # the first worker speaks for all
        _introduce(gateway, tools, search, server, keys)
    _listen(app, server, listener)


def _engines(settings: Settings, gateway: list[UpstreamConfig]) -> dict[str, Engine]:
    """The embedded engine (when `--model` names one, or nothing else is served), then one
    replica set per upstream model."""
    from oars.engines.upstream import Pacing, ReplicaSet

    engines: dict[str, Engine] = {}
    if settings.engine.model is not None or not gateway:
        engine = _embedded(settings.engine)
        engines[engine.info.id] = engine
    pacing = Pacing(settings.upstream.reads_per_second)  # one for the process: one loop
    for config in gateway:
        if config.model in engines:
            raise SetupError(f"the model {config.model!r} is served twice")
        engines[config.model] = ReplicaSet(config, pacing)
    return engines


def _introduce(
    gateway: list[UpstreamConfig],
    tools: McpConfig,
    search: WebSearch | None,
    server: ServerSettings,
    keys: list[str],
) -> None:
    from oars.engines.upstream import replica_name

    for config in gateway:
        urls = ", ".join(map(replica_name, config.urls))
        print(f"oars: {config.model} from {urls}", flush=True)
    for label in sorted(tools.labels):
        print(f"oars: MCP server {label!r} for requests that name it", flush=True)
    if search is not None:
        pages = "opens pages" if search.fetches else "opens no pages"
        print(f"oars: web_search through {search.backend_name}; it {pages}", flush=True)
    print(f"oars: {_access(server, keys)}", flush=True)


def settle_heap() -> None:
    """Take what is loaded by now (modules, the vocabulary tables, the app), which lives as long
    as the process, out of the collector's sight: a full collection walking it took 90-160 ms,
    a pause of every stream whenever one came."""
    gc.collect()
    gc.freeze()


def _listen(
    app: Callable[..., Awaitable[None]], server: ServerSettings, listener: socket.socket | None
) -> None:
    import uvicorn

    settle_heap()
    # logging is set up above: uvicorn adds none of its own, and oars.access logs requests
    # a WebSocket frame may be as large as an HTTP body (a create with a long history)
    config = uvicorn.Config(
        app,
        host=server.host,
        port=server.port,
        log_level=server.log_level.lower(),
        log_config=None,
        access_log=False,
        ws_max_size=server.limits.max_body_bytes,
        ws_ping_interval=server.limits.keepalive_seconds,
    )
    running = uvicorn.Server(config)
    with contextlib.suppress(KeyboardInterrupt):
        running.run(sockets=None if listener is None else [listener])
    if not running.started:
        sys.exit(3)  # as uvicorn's own run: the lifespan (the store) failed to start


def _embedded(settings: EngineSettings) -> Engine:
    """The llama.cpp engine, on the model `--model` names (the default one, pulled, if none)."""
    from oars.engines.devices import describe, gpu_layers
    from oars.engines.llama import LlamaEngine
    from oars.weights import DEFAULT_MODEL, oars_home, pull

    path = model_file(settings.model)
    if path is None:
        path = pull()
        settings = dataclasses.replace(settings, model_id=settings.model_id or DEFAULT_MODEL.name)
    layers = gpu_layers(settings.gpu_layers)
    engine = LlamaEngine(
        Path(path), settings, gpu_layers=layers, prefix_folder=oars_home() / "prefixes"
    )
    print(
        f"oars: {engine.info.id}: {describe(layers)}, {engine.parallel} sequences of "
        f"{settings.context} tokens, {engine.queue_depth} may wait"
        + (", flash attention on" if settings.flash_attn else ""),
        flush=True,
    )
    return engine


def _embedder(settings: Settings, *, embedded: bool) -> Embedder | None:
    """The embedding model of `--embedding-model`; unset, the default one, pulled on first use
    beside the `embedded` engine's (a gateway takes it only when `oars pull` has cached it)."""
    import importlib.util

    from oars.embeddings import LlamaEmbedder, UpstreamEmbedder, embedding_file
    from oars.engines.upstream.config import upstream_arg
    from oars.weights import pull_embedding

    spec = settings.embedding.model or ""
    if "=" in spec:  # MODEL=URL: another server's
        try:
            remote = upstream_arg(spec)
        except ValueError as exc:
            raise SetupError(f"--embedding-model: {exc}") from exc
        embedder: Embedder = UpstreamEmbedder.probe(remote.model, remote.urls)
        print(f"oars: embeddings by {remote.model} at {remote.url} ({embedder.dimensions} "
              "dimensions)", flush=True)  # fmt: skip
        return embedder
    if settings.embedding.model is None and embedded:
        try:
            pull_embedding()
        except SetupError as exc:  # the chat model came; the embeddings wait for a pull
            print(f"oars: no embedding model ({exc}); `oars pull embedding` fetches it", flush=True)
    found = embedding_file(settings.embedding.model)
    if found is None:
        return None
    if settings.embedding.model is None and importlib.util.find_spec("llama_cpp") is None:
        return None  # a gateway without the engine (deploy/Dockerfile) serves no embeddings
    path, name = found
    embedder = LlamaEmbedder(path, name, threads=settings.engine.threads)
    print(f"oars: embeddings by {name} ({embedder.dimensions} dimensions)", flush=True)
    return embedder


def observe(metrics: Metrics, engines: Mapping[str, Engine]) -> None:
    """Let the engines report to `metrics`: the embedded engine's drafts, and for the gateway
    each upstream reply, each replica's health, and which replicas are in service."""
    from oars.engines.llama import LlamaEngine
    from oars.engines.upstream import ReplicaSet, UpstreamEngine

    metrics.drafts = lambda: {
        (model,): engine.drafts
        for model, engine in engines.items()
        if isinstance(engine, LlamaEngine)
    }
    for engine in engines.values():
        if isinstance(engine, UpstreamEngine):
            engine.observe = metrics.upstream_reply
        elif isinstance(engine, ReplicaSet):
            engine.watch(metrics.upstream_reply)
            engine.observe = metrics.upstream_event
    metrics.replicas = lambda: {
        (engine.info.id, r.name): (r.in_flight, r.healthy)
        for engine in engines.values()
        if isinstance(engine, ReplicaSet)
        for r in engine.replicas
    }


def api_keys(server: ServerSettings) -> list[str]:
    """The keys clients may send: `--api-key`s and OARS_API_KEYS, then the `--api-keys` file.
    None, beyond loopback, is refused unless `--allow-unauthenticated`."""
    keys = list(server.api_keys)
    if server.api_keys_file:
        try:
            lines = Path(server.api_keys_file).read_text().splitlines()
        except OSError as exc:
            raise SetupError(f"--api-keys: {exc}") from exc
        keys += [line.split("#", 1)[0].strip() for line in lines if line.split("#", 1)[0].strip()]
    if not keys and not _loopback(server.host) and not server.allow_unauthenticated:
        raise SetupError(
            f"no API keys: oars serves {server.host} only with --api-key (or "
            "OARS_API_KEYS, --api-keys FILE), or --allow-unauthenticated"
        )
    return keys


def _loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _access(server: ServerSettings, keys: list[str]) -> str:
    if keys:
        return f"{len(keys)} API keys; each sees only what it stored"
    if _loopback(server.host):
        return "no API keys: open to this machine only (loopback)"
    return (
        f"no API keys: anyone who reaches {server.host}:{server.port} may use it and read "
        "everything"
    )


def model_file(model: str | None) -> Path | None:
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


def upstreams(settings: UpstreamSettings) -> list[UpstreamConfig]:
    """The upstreams of `--upstream` and of the `--upstreams` file."""
    from oars.engines.upstream import load_upstreams, upstream_arg

    try:
        configs = [upstream_arg(text) for text in settings.upstreams]
        file = settings.upstreams_file
        return configs + (load_upstreams(file) if file else [])
    except (ValueError, OSError) as exc:
        raise SetupError(f"--upstream: {exc}") from exc


def mcp(settings: McpSettings) -> McpConfig:
    """The operator's MCP servers, and the URLs a request's own may reach."""
    from oars.mcp.config import McpConfig, load_servers, server_arg

    try:
        servers = [server_arg(text) for text in settings.servers]
        servers += load_servers(settings.servers_file) if settings.servers_file else []
        return McpConfig.of(servers, settings.allow, call_seconds=settings.call_seconds)
    except (ValueError, OSError) as exc:
        raise SetupError(f"--mcp-server: {exc}") from exc


def web(settings: WebSettings, tools: McpConfig) -> WebSearch | None:
    """The search service `--web-search` names (None without it: `web_search` is not
    offered); its API key is read here, once."""
    from oars.web_search import web_search

    if settings.search is None:
        return None
    try:
        return web_search(
            settings.search,
            fetch=settings.fetch,
            allow=settings.allow,
            timeout=settings.timeout,
            mcp=tools,
        )
    except ValueError as exc:  # its message names the flag
        raise SetupError(str(exc)) from exc


def _redacted(spec: str) -> str:
    """A database URL without its password."""
    head, at, tail = spec.rpartition("@")
    if not at or "://" not in head:
        return spec
    scheme, _, user = head.partition("://")
    return f"{scheme}://{user.split(':', 1)[0]}:***@{tail}"
