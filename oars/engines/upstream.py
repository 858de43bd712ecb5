"""An upstream engine: any OpenAI-compatible chat-completions server behind the engine seam.

vLLM, SGLang, llama.cpp's server, Ollama and TGI all stream `/v1/chat/completions`. oars sends
the request there (`stream: true`, usage included) and turns the chunks into the same typed
segments the embedded engine's parsers produce, so one `ResponseBuilder` makes every event:
reasoning deltas (`reasoning_content` or `reasoning`) and indexed tool-call deltas arrive parsed;
content goes through the model family's parser when the upstream left calls or `<think>` in it.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp

from oars.engines.base import ModelInfo, Opened
from oars.errors import ClientError, EngineError, UpstreamError, UpstreamRejected
from oars.families import THINK_TAGS, Family, make
from oars.generation import (
    MODALITIES,
    ChatMessage,
    EngineChunk,
    EngineRequest,
    FinishReason,
    TokenLogprob,
    TopLogprob,
    Usage,
)
from oars.jsonfast import dumps_bytes, loads
from oars.parsing import Segment, SegmentKind
from oars.silence import Silence

log = logging.getLogger("oars.upstream")


@dataclass(frozen=True)
class UpstreamConfig:
    """One model served by an upstream: one URL, or the URLs of its replicas (`urls`).
    `parse_calls` / `parse_think`: oars' own parsers read the content (for an upstream that
    leaves calls or `<think>` in it unparsed)."""

    model: str  # the name clients ask for
    url: str = ""  # the upstream's base URL, ending in /v1
    urls: tuple[str, ...] = ()  # or its replicas' base URLs
    upstream_model: str | None = None  # the name the upstream knows it by (default: `model`)
    api_key_env: str | None = None  # the environment variable holding its API key
    # https: the CA bundle its certificate is checked by (default: the system's)
    ca_file: str | None = None
    parse_calls: str | None = None  # hermes, qwen3_coder or harmony
    parse_think: bool = False
    # A JSON schema as `{"type": "json_object", "schema": …}` (llama-cpp-python's server takes
    # no `json_schema` response format) instead of OpenAI's `json_schema`.
    schema_in_json_object: bool = False
    modalities: tuple[str, ...] = MODALITIES  # what a request's input may hold
    connect_timeout: float = 10.0
    first_byte_timeout: float = 300.0  # until the upstream answers (its prefill)
    idle_timeout: float = 120.0  # between two chunks of a stream
    max_connections: int = 512  # per replica
    # Replicas: a chain's or a prefix's replica yields to the least busy one when it has more
    # than `imbalance` requests in flight beyond it; `health_path` (under the base URL) is
    # asked every `health_interval` seconds.
    imbalance: int = 8
    health_path: str = "/models"
    health_interval: float = 5.0

    def __post_init__(self) -> None:
        urls = self.urls or ((self.url,) if self.url else ())
        if not urls:
            raise ValueError(f"the model {self.model!r} needs a url (or urls)")
        for url in urls:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"{self.model}: expected an http or https URL, got {url!r}")
        unknown = set(self.modalities) - set(MODALITIES)
        if unknown or "text" not in self.modalities:
            raise ValueError(
                f"{self.model}: modalities are text and any of image, file, audio "
                f"(got {', '.join(self.modalities)})"
            )
        object.__setattr__(self, "urls", tuple(urls))
        object.__setattr__(self, "url", urls[0])
        object.__setattr__(self, "modalities", tuple(self.modalities))

    @property
    def family(self) -> Family:
        return make(self.parse_calls, THINK_TAGS if self.parse_think else None)

    def headers(self) -> dict[str, str]:
        key = os.environ.get(self.api_key_env, "") if self.api_key_env else ""
        return {"Authorization": f"Bearer {key}"} if key else {}


def upstream_arg(text: str) -> UpstreamConfig:
    """`MODEL=URL` or `MODEL=URL1,URL2,…` (the `--upstream` option)."""
    model, eq, urls = text.partition("=")
    if not eq or not model or not urls:
        raise ValueError(f"expected MODEL=URL[,URL…] (http or https), got {text!r}")
    return UpstreamConfig(model, urls=tuple(u.strip() for u in urls.split(",") if u.strip()))


def load_upstreams(path: str) -> list[UpstreamConfig]:
    """A TOML file of `[[upstream]]` tables, each with the fields of `UpstreamConfig`."""
    import tomllib

    with open(path, "rb") as f:
        tables = tomllib.load(f).get("upstream", [])
    known = set(UpstreamConfig.__dataclass_fields__)
    configs = []
    for i, table in enumerate(tables):
        unknown = set(table) - known
        if unknown or "model" not in table or not ("url" in table or "urls" in table):
            raise ValueError(
                f"{path}: upstream #{i + 1} needs model and url (or urls) and knows only "
                f"{', '.join(sorted(known))} (got {', '.join(sorted(unknown))})"
            )
        lists = {k: tuple(v) for k, v in table.items() if isinstance(v, list)}
        try:
            configs.append(UpstreamConfig(**{**table, **lists}))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: upstream #{i + 1}: {exc}") from exc
    return configs


@dataclass(frozen=True)
class UpstreamOpened(Opened):
    response: aiohttp.ClientResponse | None = None
    replica: str = ""  # the URL it was sent to, without credentials

    @property
    def served_by(self) -> str:
        return self.replica


# Idle pooled connections are dropped after this many seconds: under the 5 s after which
# uvicorn (vLLM's and SGLang's server) closes them, so that a request rarely meets a
# connection the upstream is closing.
KEEPALIVE_SECONDS = 4.0


_LEAST_WAIT = 0.001  # a read due sooner than this is not put off


class Pacing:
    """How often the streams of a process's upstreams are read: `reads_per_second` shared among
    the streams open at the time, so that with S of them each is read at most every
    S / `reads_per_second` seconds, never more than `longest` apart. What came between two reads
    of a stream goes on as one chunk (one delta event, one write to the client). Read a token at
    a time, each token woke the stream's reader and its client's and was a send of its own: 64
    paced streams spaced out cost two fifths less CPU a token, and a busy loop is what delays
    every new stream's first token (docs/benchmarks.md). A stream is read as it comes until its
    first output (a role's chunk is none). 0: every chunk as it comes."""

    def __init__(self, reads_per_second: float = 0.0, longest: float = 0.05) -> None:
        self.reads_per_second, self.longest = reads_per_second, longest
        self.streams = 0

    def interval(self) -> float:
        """The least time between two reads of one stream now."""
        if self.reads_per_second <= 0:
            return 0.0
        return min(self.longest, self.streams / self.reads_per_second)

    async def wait(self, read_at: float, response: aiohttp.ClientResponse) -> None:
        """Until a stream read at `read_at` (the loop's time) may be read again. Its socket is
        not read meanwhile: what arrives waits in the kernel, and comes in one read after."""
        loop = asyncio.get_running_loop()
        wait = read_at + self.interval() - loop.time()
        if wait <= _LEAST_WAIT:
            return
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        if protocol is None or protocol.transport is None:
            await asyncio.sleep(wait)
            return
        protocol.pause_reading()
        try:
            await asyncio.sleep(wait)
        finally:
            protocol.resume_reading()


class UpstreamEngine:
    """One upstream server (one replica of a model: `url`, by default the config's first).
    Requests run concurrently: no lock, one pooled HTTP client per event loop.

    The client is aiohttp's: its response parser is compiled, and a stream's read is one hop
    from the socket's callback. Reading 64 paced streams (`bench.upstream_read`), the engine
    spends 1.5× the CPU a chunk of a bare asyncio protocol; through httpx (h11 and httpcore in
    Python, a chunk at a time) it was 2.5× with an asyncio network backend under httpcore, 3.7×
    without."""

    def __init__(
        self, config: UpstreamConfig, url: str | None = None, pacing: Pacing | None = None
    ) -> None:
        self.config = config
        self.pacing = pacing or Pacing()
        self.url = url or config.url
        self.name = replica_name(self.url)
        self.info = ModelInfo(config.model, owned_by="upstream", modalities=config.modalities)
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.streams = 0
        # told how long each request took to answer (its headers), or the code it failed with:
        # (model, replica, seconds, code)
        self.observe: Callable[[str, str, float, str | None], None] | None = None

    @property
    def busy(self) -> bool:
        return self.streams > 0

    def _http(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop:
            if self._session is not None and self._session.connector is not None:
                # a session of a loop that has ended: its sockets went with the loop
                self._session.connector._close()
            c = self.config
            # the URL's credentials win over a key; requests go to the URL without them
            headers = {**c.headers(), **_basic_auth(self.url)}
            connector = aiohttp.TCPConnector(
                limit=c.max_connections,
                limit_per_host=0,
                keepalive_timeout=KEEPALIVE_SECONDS,
                ssl=ssl.create_default_context(cafile=c.ca_file) if c.ca_file else True,
            )
            self._session = aiohttp.ClientSession(
                headers=headers,
                connector=connector,
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=c.connect_timeout),
                trust_env=False,  # nothing from the environment: the URL is the operator's
            )
            self._loop = loop
        return self._session

    def _url(self, path: str) -> str:
        return self.name + path  # the URL without credentials (they go as a header)

    async def start(self) -> None:
        """Nothing runs beside its requests (a `ReplicaSet` checks health)."""

    async def aclose(self) -> None:
        if self._session is not None and self._loop is asyncio.get_running_loop():
            await self._session.close()
        self._session = None

    # ---- Engine protocol ----------------------------------------------------------------

    async def open(self, request: EngineRequest) -> Opened:
        # its chunks' reads are timed by `_sse_data` (one timer a stream, not one a read)
        response = await self._send(self._body(request), read_timeout=None)
        parser = self.config.family.parser(request.tools)
        return UpstreamOpened(request, parser, response, self.name)

    async def healthy(self) -> bool | None:
        """Whether the upstream answers its health path (a model listing by default) with a
        2xx; None: no answer in time (which a busy server may give: llama-cpp-python's answers
        its listing only between generations)."""
        c = self.config
        seconds = min(c.connect_timeout, max(c.health_interval, 1.0))
        try:
            async with self._http().get(
                self._url(c.health_path), timeout=aiohttp.ClientTimeout(total=seconds)
            ) as response:
                return 200 <= response.status < 300
        except TimeoutError:
            return None
        except aiohttp.ClientError:
            return False

    async def count_tokens(self, request: EngineRequest) -> int:
        """The upstream's own count: a one-token, unstreamed request's `prompt_tokens`."""
        body = self._body(request)
        body.update(stream=False, max_tokens=1)
        body.pop("stream_options", None)
        response = await self._send(body, read_timeout=self.config.idle_timeout)
        try:
            return int(loads(await response.read())["usage"]["prompt_tokens"])
        except (ValueError, KeyError, TypeError, aiohttp.ClientError, TimeoutError) as exc:
            raise UpstreamError("the upstream reported no token count") from exc
        finally:
            response.release()

    def _body(self, request: EngineRequest) -> dict[str, Any]:
        c = self.config
        return chat_body(
            request, c.upstream_model or c.model, schema_in_json_object=c.schema_in_json_object
        )

    async def _count_quietly(self, request: EngineRequest) -> int:
        """An upstream that streams no usage (llama-cpp-python's server): its input tokens,
        counted by a one-token request for the same prompt (the upstream's prompt cache
        makes it cheap), or 0 when that fails. Output tokens are then its chunks."""
        try:
            return await self.count_tokens(request)
        except (ClientError, EngineError) as exc:
            log.warning("%s: no usage in the stream, and no token count: %s", self.info.id, exc)
            return 0

    async def _send(
        self, body: dict[str, Any], *, read_timeout: float | None
    ) -> aiohttp.ClientResponse:
        """POST, and wait for the status line: errors here are the whole response's status.
        `read_timeout`: for each read of the body after it (None: the caller times them)."""
        session = self._http()
        where = self.name
        started = time.monotonic()
        c = self.config
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=c.connect_timeout, sock_read=read_timeout
        )
        data = dumps_bytes(body)
        try:
            async with asyncio.timeout(c.first_byte_timeout):
                response = await self._post(session, data, timeout)
        except TimeoutError as exc:  # aiohttp's connect timeout is one too
            self._observed(started, "upstream_timeout")
            raise UpstreamError(
                f"the upstream at {where} did not answer in time",
                status=504,
                code="upstream_timeout",
            ) from exc
        except aiohttp.ClientError as exc:
            self._observed(started, "upstream_unreachable")
            raise UpstreamError(
                f"the upstream at {where} cannot be reached: {exc}",
                code="upstream_unreachable",
                retryable=True,
            ) from exc
        status = response.status
        self._observed(started, None if status < 400 else str(status))
        if status >= 400:
            try:
                async with asyncio.timeout(c.idle_timeout):
                    text = await response.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                raise UpstreamError(
                    f"the upstream at {where} answered {status} and its error "
                    f"could not be read: {exc!r}"
                ) from exc
            finally:
                response.release()
            raise _rejection(status, response.reason or "", text, where)
        return response

    async def _post(
        self, session: aiohttp.ClientSession, data: bytes, timeout: aiohttp.ClientTimeout
    ) -> aiohttp.ClientResponse:
        """One POST to the chat endpoint; sent again once on a new connection if a kept-alive
        one turns out closed by the upstream before any answer (it closed it as it was taken)."""
        headers = {"Content-Type": "application/json"}
        url = self._url("/chat/completions")
        try:
            return await session.post(url, data=data, headers=headers, timeout=timeout)
        except aiohttp.ServerDisconnectedError:
            return await session.post(url, data=data, headers=headers, timeout=timeout)

    def _observed(self, started: float, code: str | None) -> None:
        if self.observe is not None:
            self.observe(self.info.id, self.name, time.monotonic() - started, code)

    async def generate(self, opened: Opened) -> AsyncIterator[EngineChunk]:
        assert isinstance(opened, UpstreamOpened) and opened.response is not None
        response, reader = opened.response, _ChunkReader()
        self.streams += 1
        self.pacing.streams += 1
        try:
            timeouts = (self.config.first_byte_timeout, self.config.idle_timeout)
            loop = asyncio.get_running_loop()
            async with contextlib.aclosing(_sse_data(response, *timeouts)) as stream:
                async for payloads in stream:
                    read_at = loop.time()
                    done = b"[DONE]" in payloads
                    read = [
                        chunk
                        for data in (payloads[: payloads.index(b"[DONE]")] if done else payloads)
                        for chunk in reader.read(_json_object(data))
                    ]
                    for chunk in _merged(read):
                        yield chunk
                    if done:
                        break
                    if read:  # output went on (not a role's chunk): the next read waits its turn
                        await self.pacing.wait(read_at, response)
            *rest, last = reader.finish()
            for chunk in rest:
                yield chunk
            if reader.usage is None and last.usage is not None:
                response.release()
                counted = await self._count_quietly(opened.request)
                last = replace(last, usage=replace(last.usage, input_tokens=counted))
            yield last
        finally:
            self.streams -= 1
            self.pacing.streams -= 1
            # read to its end: the connection goes back to the pool; else (a client that left,
            # a stream that broke) it is closed, which stops the upstream's generation now
            response.release()


def _merged(chunks: list[EngineChunk]) -> list[EngineChunk]:
    """A read's chunks with each run of plain text, or of reasoning, made one chunk. Under load
    a read brings several tokens of a stream; each chunk is a pass through the step, the
    builder, the log and the client's stream, while the tokens of one are one delta event."""
    if len(chunks) < 2:
        return chunks
    out, last_kind = [chunks[0]], _run_kind(chunks[0])
    for chunk in chunks[1:]:
        last, kind = out[-1], _run_kind(chunk)
        if kind is None or kind != last_kind:
            out.append(chunk)
            last_kind = kind
        elif kind == "text":
            joined = last.text + chunk.text
            logprobs = last.logprobs + chunk.logprobs
            out[-1] = EngineChunk(joined, last.num_tokens + chunk.num_tokens, logprobs)
        else:
            segment = Segment(SegmentKind.REASONING, last.segments[0].text + chunk.segments[0].text)
            out[-1] = EngineChunk(
                num_tokens=last.num_tokens + chunk.num_tokens, segments=(segment,)
            )
    return out


def _run_kind(chunk: EngineChunk) -> str | None:
    """ "text" or "reasoning" for a chunk that may join its neighbour of the same kind."""
    if chunk.finish is not None or chunk.usage is not None:
        return None
    if not chunk.segments:
        # whitespace alone stays apart: between two items the builder drops it, in a message
        # it keeps it, and which one depends on what follows it
        return "text" if chunk.text and not chunk.text.isspace() else None
    if chunk.text or len(chunk.segments) != 1:
        return None
    segment = chunk.segments[0]
    return "reasoning" if segment.kind is SegmentKind.REASONING and not segment.name else None


def _rejection(status: int, reason: str, body: bytes, where: str) -> ClientError | EngineError:
    """An upstream's error status: its 4xx passes on as the client's fault, with its message;
    anything else is the upstream's (502)."""
    message, param, code, kind = _error_fields(reason, body)
    if status in (401, 403):  # oars' own credentials: not the client's fault
        return UpstreamError(
            f"the upstream at {where} refused oars' credentials ({status}): {message}",
            code="upstream_unauthorized",
        )
    if 400 <= status < 500:
        return UpstreamRejected(status, message, param=param, code=code, type=kind)
    return UpstreamError(f"the upstream at {where} failed ({status}): {message}", retryable=True)


def replica_name(url: str) -> str:
    """A replica's URL as it is shown, counted and recorded: without credentials."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=netloc)).rstrip("/")


def _basic_auth(url: str) -> dict[str, str]:
    """The user and password in a URL (`http://user:pass@host/v1`) as a basic auth header."""
    parts = urlsplit(url)
    if parts.username is None and parts.password is None:
        return {}
    pair = f"{unquote(parts.username or '')}:{unquote(parts.password or '')}"
    return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


def _error_fields(reason: str, raw: bytes) -> tuple[str, str | None, str | None, str]:
    """(message, param, code, type) from an OpenAI-style body, FastAPI's `detail`, or text."""
    try:
        body = loads(raw)
    except ValueError:
        text = raw.decode("utf-8", "replace")
        return text[:500] or reason, None, None, "invalid_request_error"
    error = body.get("error", body) if isinstance(body, dict) else body
    if isinstance(error, dict):
        message = error.get("message") or error.get("detail") or json.dumps(error)[:500]
        param, code = error.get("param"), error.get("code")
        kind = error.get("type") if isinstance(error.get("type"), str) else None
        return (
            str(message),
            param if isinstance(param, str) else None,
            str(code) if code is not None else None,
            kind or "invalid_request_error",
        )
    return str(error)[:500], None, None, "invalid_request_error"


async def _sse_data(
    response: aiohttp.ClientResponse, first: float, idle: float
) -> AsyncGenerator[list[bytes], None]:
    """The `data:` payloads of an SSE body, as many as each read brings (under load, several
    chunks a read: one hop a read, not a line). Engines that answer with their headers at once
    queue and prefill before the first chunk (`first` seconds allowed); after it, an upstream
    silent for `idle` seconds has stalled."""
    content = response.content
    silence, rest = Silence(first), b""
    try:
        while True:
            try:
                data = await silence.wait(content.readany())
            except TimeoutError as exc:
                raise EngineError(f"the upstream sent nothing for {silence.seconds:g} s") from exc
            except aiohttp.ClientError as exc:
                raise EngineError(f"the upstream's stream broke: {exc}") from exc
            if not data:  # the body's end
                if rest.startswith(b"data:"):  # a last line without its newline
                    yield [rest[5:].strip()]
                return
            silence.seconds = idle
            *lines, rest = (rest + data).split(b"\n")
            payloads = [line[5:].strip() for line in lines if line.startswith(b"data:")]
            if payloads:
                yield payloads
    finally:
        silence.close()


def _json_object(data: bytes) -> dict[str, Any]:
    try:
        value = loads(data)
    except ValueError as exc:
        raise EngineError(f"the upstream sent a chunk that is not JSON: {data[:200]!r}") from exc
    if not isinstance(value, dict):
        raise EngineError(f"the upstream sent a chunk that is not an object: {data[:200]!r}")
    error = value.get("error")
    if error:  # vLLM and others report a failure mid-stream as an error chunk
        message = error.get("message") if isinstance(error, dict) else error
        raise EngineError(f"the upstream failed mid-stream: {message}")
    return value


# ---- request: Responses intent → chat completions ---------------------------------------------


def chat_body(
    request: EngineRequest, model: str, *, schema_in_json_object: bool = False
) -> dict[str, Any]:
    s = request.sampling
    body: dict[str, Any] = {
        "model": model,
        "messages": [_chat_message(m) for m in request.messages],
        "stream": True,
        "stream_options": {"include_usage": True},
        "temperature": s.temperature,
    }
    optional = {
        "top_p": s.top_p if s.top_p != 1.0 else None,
        "seed": s.seed,
        "stop": list(s.stop) or None,
        "max_tokens": s.max_output_tokens,
        "top_k": s.top_k or None,
        "repetition_penalty": s.repetition_penalty if s.repetition_penalty != 1.0 else None,
        "reasoning_effort": _EFFORTS.get(request.reasoning_effort or "", request.reasoning_effort),
    }
    body.update({k: v for k, v in optional.items() if v is not None})
    if request.top_logprobs is not None:
        body.update(logprobs=True, top_logprobs=request.top_logprobs)
    body.update(_tools(request))
    if request.output is not None:
        body["response_format"] = _response_format(request, schema_in_json_object)
    return body


# Efforts beyond OpenAI's chat values, as the nearest one engines take.
_EFFORTS = {"xhigh": "high", "max": "high"}


def _chat_message(message: ChatMessage) -> dict[str, Any]:
    content: Any = message.content
    if message.parts:
        content = [
            {"type": "text", "text": p} if isinstance(p, str) else dict(p.part)
            for p in message.parts
            if p != ""
        ]
    out: dict[str, Any] = {"role": message.role, "content": content}
    if message.tool_calls:
        out["tool_calls"] = [_chat_call(c, i) for i, c in enumerate(message.tool_calls)]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _chat_call(call: Mapping[str, Any], i: int) -> dict[str, Any]:
    function = call.get("function") or {}
    arguments = function.get("arguments", {})
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "id": call.get("id") or f"call_{i}",
        "type": "function",
        "function": {"name": function.get("name", ""), "arguments": text},
    }


def _tools(request: EngineRequest) -> dict[str, Any]:
    """The tools the model may call now (namespaces flattened, custom tools as functions of
    one string), `tool_choice` and `parallel_tool_calls`."""
    tools = request.tools
    if tools.mode == "none" or not tools.callable:
        return {}
    choice: Any = tools.mode
    if tools.mode == "required" and len(tools.callable) == 1:
        choice = {"type": "function", "function": {"name": tools.callable[0].model_name}}
    return {
        "tools": [t.to_template() for t in tools.callable],
        "tool_choice": choice,
        "parallel_tool_calls": request.parallel_tool_calls,
    }


def _response_format(request: EngineRequest, schema_in_json_object: bool) -> dict[str, Any]:
    output = request.output
    assert output is not None
    if output.kind == "json_object":
        return {"type": "json_object"}
    if schema_in_json_object:
        return {"type": "json_object", "schema": dict(output.schema)}
    schema: dict[str, Any] = {"name": output.name, "schema": dict(output.schema)}
    if output.strict is not None:
        schema["strict"] = output.strict
    return {"type": "json_schema", "json_schema": schema}


# ---- response: chat completion chunks → engine chunks -----------------------------------------

_FINISH = {
    "stop": FinishReason.STOP,
    "length": FinishReason.LENGTH,
    "tool_calls": FinishReason.TOOL_CALLS,
    "function_call": FinishReason.TOOL_CALLS,
    "content_filter": FinishReason.CONTENT_FILTER,
}


@dataclass
class _Call:
    name: str = ""
    arguments: str = ""
    id: str = ""
    started: bool = False


@dataclass
class _ChunkReader:
    """Reads one stream. A call streams live while it is the open one; another call's deltas
    wait until the open call's arguments are a complete JSON object (upstreams that send calls
    one after another), or until the end (upstreams that interleave them). Text or reasoning
    that arrives while the open call is unfinished waits for it to end."""

    calls: dict[int, _Call] = field(default_factory=dict)
    open_call: int | None = None
    waiting: list[EngineChunk] = field(default_factory=list)  # output held behind a call
    finish_reason: FinishReason | None = None
    usage: Usage | None = None
    reasoning_deltas: int = 0
    content_deltas: int = 0

    def read(self, chunk: Mapping[str, Any]) -> list[EngineChunk]:
        if isinstance(chunk.get("usage"), dict):
            self.usage = _usage(chunk["usage"])
        choices = chunk.get("choices") or []
        choice = choices[0] if choices and isinstance(choices[0], dict) else {}
        delta = choice.get("delta") or {}
        out: list[EngineChunk] = []
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if isinstance(reasoning, str) and reasoning:
            self.reasoning_deltas += 1
            segment = Segment(SegmentKind.REASONING, reasoning)
            out += self._after_calls(EngineChunk(num_tokens=1, segments=(segment,)))
        content = delta.get("content")
        if isinstance(content, str) and content:
            self.content_deltas += 1
            logprobs = _logprobs(choice.get("logprobs"))
            out += self._after_calls(EngineChunk(content, 1, logprobs))
        calls = delta.get("tool_calls")
        if isinstance(calls, list):
            segments = [s for c in calls for s in self._call_delta(c)]
            out += self._released(segments)
        reason = choice.get("finish_reason")
        if reason:
            self.finish_reason = _FINISH.get(str(reason), FinishReason.STOP)
        return out

    def finish(self) -> list[EngineChunk]:
        """The last chunks: what was held, the remaining calls, the reason and the usage."""
        if self.finish_reason is None:
            raise EngineError("the upstream's stream ended before it finished")
        cut = self.finish_reason in (FinishReason.LENGTH, FinishReason.CONTENT_FILTER)
        out = [] if cut else self._released(self._flush_calls())
        out += self.waiting if self.open_call is None else []  # else: the call never ended
        usage = self.usage or Usage(output_tokens=self.reasoning_deltas + self.content_deltas)
        if not usage.reasoning_tokens and self.reasoning_deltas:
            usage = replace(usage, reasoning_tokens=min(self.reasoning_deltas, usage.output_tokens))
        return [*out, EngineChunk(finish=self.finish_reason, usage=usage)]

    def _after_calls(self, chunk: EngineChunk) -> list[EngineChunk]:
        """Text or reasoning: after the open call if its arguments are whole, else held."""
        closed = self._close_complete()
        if self.open_call is not None:
            self.waiting.append(chunk)
            return []
        return [*self._released(list(closed)), chunk]

    def _released(self, segments: list[Segment]) -> list[EngineChunk]:
        """Call segments, then what waited for the call that just ended."""
        out = [EngineChunk(segments=tuple(segments))] if segments else []
        if self.open_call is None and self.waiting:
            out += self.waiting
            self.waiting = []
        return out

    def _index(self, raw: Mapping[str, Any]) -> int:
        """The call a delta belongs to: its `index`, or (servers that send none) a new call
        for a new `id` and the last call otherwise."""
        index = raw.get("index")
        if isinstance(index, int) and not isinstance(index, bool):
            return index
        last = max(self.calls, default=-1)
        call_id = raw.get("id")
        fresh = last < 0 or (
            isinstance(call_id, str) and call_id and call_id != self.calls[last].id
        )
        return last + 1 if fresh else last

    def _call_delta(self, raw: Any) -> list[Segment]:
        if not isinstance(raw, dict):
            raise EngineError(f"the upstream sent a tool call that is not an object: {raw!r}")
        index = self._index(raw)
        function = raw.get("function") or {}
        call = self.calls.setdefault(index, _Call(id=str(raw.get("id") or "")))
        name, piece = function.get("name"), function.get("arguments") or ""
        if isinstance(name, str) and name and not call.started and not call.arguments:
            # A name in pieces grows until the arguments begin; one repeated in every delta
            # (llama-cpp-python's server) is kept once.
            call.name += name if not call.name.endswith(name) else ""
        if not isinstance(piece, str):
            piece = json.dumps(piece)  # a server that sends the arguments as an object
        call.arguments += piece
        if self.open_call == index:
            return [Segment(SegmentKind.CALL_ARGS, piece)] if piece else []
        if self.open_call is not None and not _complete(self.calls[self.open_call].arguments):
            return []  # interleaved: this call waits
        return list(self._close_complete()) + self._start_next()

    def _close_complete(self) -> tuple[Segment, ...]:
        """Close the open call if its arguments are whole (text or another call follows)."""
        if self.open_call is None or not _complete(self.calls[self.open_call].arguments):
            return ()
        del self.calls[self.open_call]
        self.open_call = None
        return (Segment(SegmentKind.CALL_END),)

    def _start_next(self, *, at_end: bool = False) -> list[Segment]:
        """Start the first waiting call once its arguments have begun (its name is whole)."""
        waiting = [
            i
            for i, c in sorted(self.calls.items())
            if c.name and not c.started and (c.arguments or at_end)
        ]
        if self.open_call is not None or not waiting:
            return []
        index = waiting[0]
        call = self.calls[index]
        call.started, self.open_call = True, index
        head = [Segment(SegmentKind.CALL_START, name=call.name)]
        return head + ([Segment(SegmentKind.CALL_ARGS, call.arguments)] if call.arguments else [])

    def _flush_calls(self) -> list[Segment]:
        """At the end: every call in order. One whose arguments are unfinished stays open (the
        builder fails the response rather than report a half-written call)."""
        out: list[Segment] = []
        while True:
            if self.open_call is not None:
                call = self.calls[self.open_call]
                if not call.arguments:
                    call.arguments = "{}"  # a call without parameters
                    out.append(Segment(SegmentKind.CALL_ARGS, "{}"))
                if not _complete(call.arguments):
                    return out
                out += self._close_complete()
            if not self.calls:
                return out
            started = self._start_next(at_end=True)
            if not started:
                raise EngineError("the upstream sent a tool call without a name")
            out += started


def _complete(arguments: str) -> bool:
    try:
        return isinstance(json.loads(arguments), dict)
    except ValueError:
        return False


def _usage(raw: Mapping[str, Any]) -> Usage:
    prompt = raw.get("prompt_tokens_details") or {}
    completion = raw.get("completion_tokens_details") or {}
    cached = prompt.get("cached_tokens") or raw.get("prompt_cache_hit_tokens") or 0
    return Usage(
        input_tokens=int(raw.get("prompt_tokens") or 0),
        cached_tokens=int(cached),
        output_tokens=int(raw.get("completion_tokens") or 0),
        reasoning_tokens=int(completion.get("reasoning_tokens") or 0),
    )


def _logprobs(raw: Any) -> tuple[TokenLogprob, ...]:
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list):
        return ()
    return tuple(
        TokenLogprob(
            str(entry.get("token", "")),
            tuple(entry.get("bytes") or ()),
            float(entry.get("logprob", 0.0)),
            tuple(
                TopLogprob(
                    str(t.get("token", "")),
                    tuple(t.get("bytes") or ()),
                    float(t.get("logprob", 0.0)),
                )
                for t in entry.get("top_logprobs") or ()
                if isinstance(t, dict)
            ),
        )
        for entry in content
        if isinstance(entry, dict)
    )
