"""An upstream engine: any OpenAI-compatible chat-completions server behind the engine seam.

vLLM, SGLang, llama.cpp's server, Ollama and TGI all stream `/v1/chat/completions`. oars sends
the request there (`stream: true`, usage included; `body`) and turns the chunks into the same
typed segments the embedded engine's parsers produce (`chunks`), so one `ResponseBuilder` makes
every event. This module is the client between the two: the connection pool, authentication,
sending and its errors, SSE framing and the pacing of reads.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import ssl
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import Any
from urllib.parse import unquote, urlsplit

import aiohttp

from oars.engines.base import Opened
from oars.engines.upstream.body import chat_body
from oars.engines.upstream.chunks import ChunkReader, json_object, merged
from oars.engines.upstream.config import UpstreamConfig, listed_context, replica_name
from oars.errors import ClientError, EngineError, UpstreamError, UpstreamRejected
from oars.generation import EngineChunk, EngineRequest
from oars.jsonfast import dumps_bytes, loads
from oars.silence import Silence

log = logging.getLogger("oars.upstream")


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
    from the socket's callback. Reading 64 paced streams (docs/notes/benchmarks-journal.md), the
    engine spends 1.5× the CPU a chunk of a bare asyncio protocol; through httpx (h11 and httpcore in
    Python, a chunk at a time) it was 2.5× with an asyncio network backend under httpcore, 3.7×
    without."""

    def __init__(
        self, config: UpstreamConfig, url: str | None = None, pacing: Pacing | None = None
    ) -> None:
        self.config = config
        self.pacing = pacing or Pacing()
        self.url = url or config.url
        self.name = replica_name(self.url)
        self.info = config.info()
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
        # its chunks' reads are timed by `sse_data` (one timer a stream, not one a read)
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

    async def listed_context(self) -> int | None:
        """The context window the upstream's model listing reports for this model; None when
        it reports none or does not answer."""
        c = self.config
        try:
            async with self._http().get(
                self._url("/models"), timeout=aiohttp.ClientTimeout(total=c.connect_timeout)
            ) as response:
                if not 200 <= response.status < 300:
                    return None
                listing = loads(await response.read())
        except (TimeoutError, aiohttp.ClientError, ValueError):
            return None
        return listed_context(listing, c.upstream_model or c.model)

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
        response, reader = opened.response, ChunkReader()
        self.streams += 1
        self.pacing.streams += 1
        try:
            timeouts = (self.config.first_byte_timeout, self.config.idle_timeout)
            loop = asyncio.get_running_loop()
            async with contextlib.aclosing(sse_data(response, *timeouts)) as stream:
                async for payloads in stream:
                    read_at = loop.time()
                    done = b"[DONE]" in payloads
                    read = [
                        chunk
                        for data in (payloads[: payloads.index(b"[DONE]")] if done else payloads)
                        for chunk in reader.read(json_object(data))
                    ]
                    for chunk in merged(read):
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


async def sse_data(
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
