"""The gateway's HTTP client to its upstreams, against real servers on loopback: a stream over
plain HTTP and over TLS (a self-signed certificate made by openssl, trusted through `ca_file`,
refused without it), connections kept alive and reused, a kept-alive connection the upstream
closes as it is taken, and a stream left early closing its connection."""

from __future__ import annotations

import asyncio
import base64
import json
import ssl
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest

from oars.engines.upstream import UpstreamConfig, UpstreamEngine
from oars.errors import UpstreamError
from oars.generation import ChatMessage, EngineRequest

REQUEST = EngineRequest((ChatMessage("user", "x"),))
WORDS = ["one", " two", " three", " four", " five"]


def _frame(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


def _chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
    body = {"choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
    return _frame(b"data: " + json.dumps(body).encode() + b"\n\n")


USAGE = {"choices": [], "usage": {"prompt_tokens": 1, "completion_tokens": len(WORDS)}}
END = _chunk({}, "stop") + _frame(b"data: " + json.dumps(USAGE).encode() + b"\n\n")
END += _frame(b"data: [DONE]\n\n") + b"0\r\n\r\n"


class Upstream:
    """Streams WORDS as chat-completion chunks, a chunk each `pace` seconds, on connections
    kept alive; counts connections and requests. `drop_second`: a connection's second request
    is met by closing it unanswered. `closed` is set when a client closes mid-stream (paced)."""

    def __init__(self, *, pace: float = 0.0, drop_second: bool = False) -> None:
        self.pace, self.drop_second = pace, drop_second
        self.connections = self.requests = 0
        self.closed = asyncio.Event()
        self.authorization: list[bytes] = []  # each request's Authorization header

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.authorization += [
                    line.split(b":", 1)[1].strip()
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"authorization:")
                ]
                served += 1
                if self.drop_second and served == 2:
                    return
                self.requests += 1
                writer.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for word in WORDS:
                    writer.write(_chunk({"content": word}))
                    await writer.drain()
                    if self.pace and await self._hung_up(reader):
                        return
                writer.write(END)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _hung_up(self, reader: asyncio.StreamReader) -> bool:
        """Waits `pace` seconds, or less if the client closes the connection meanwhile."""
        try:
            async with asyncio.timeout(self.pace):
                await reader.read(1)  # a client sends nothing more during a stream
        except TimeoutError:
            return False
        self.closed.set()
        return True


@asynccontextmanager
async def _serving(upstream: Upstream, context: ssl.SSLContext | None) -> AsyncIterator[int]:
    server = await asyncio.start_server(upstream.serve, "127.0.0.1", 0, ssl=context)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def _text(engine: UpstreamEngine) -> str:
    opened = await engine.open(REQUEST)
    return "".join([c.text async for c in engine.generate(opened)])


def _certificate(tmp_path: Path) -> tuple[Path, ssl.SSLContext]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    make = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    make += ["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run([*make, "-keyout", key, "-out", cert], check=True, capture_output=True)
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    return cert, served


def test_plain_and_tls_streams_on_one_kept_alive_connection(tmp_path: Path) -> None:
    cert, served = _certificate(tmp_path)

    async def go() -> None:
        for context, scheme in ((None, "http"), (served, "https")):
            upstream = Upstream()
            async with _serving(upstream, context) as port:
                config = UpstreamConfig("m", f"{scheme}://127.0.0.1:{port}/v1", ca_file=str(cert))
                engine = UpstreamEngine(config)
                for _ in range(3):
                    assert await _text(engine) == "".join(WORDS)
                await engine.aclose()
            assert (upstream.requests, upstream.connections) == (3, 1), scheme

    asyncio.run(go())


def test_a_certificate_nobody_vouches_for_is_refused(tmp_path: Path) -> None:
    _, served = _certificate(tmp_path)

    async def go() -> None:
        async with _serving(Upstream(), served) as port:
            engine = UpstreamEngine(UpstreamConfig("m", f"https://127.0.0.1:{port}/v1"))
            with pytest.raises(UpstreamError) as caught:
                await engine.open(REQUEST)
            await engine.aclose()
        assert caught.value.code == "upstream_unreachable"
        assert "certificate" in str(caught.value).lower()

    asyncio.run(go())


def test_a_kept_alive_connection_closed_as_it_is_taken_is_replaced() -> None:
    async def go() -> None:
        upstream = Upstream(drop_second=True)
        async with _serving(upstream, None) as port:
            engine = UpstreamEngine(UpstreamConfig("m", f"http://127.0.0.1:{port}/v1"))
            assert await _text(engine) == "".join(WORDS)
            assert await _text(engine) == "".join(WORDS)  # sent again, on a new connection
            await engine.aclose()
        assert (upstream.requests, upstream.connections) == (2, 2)

    asyncio.run(go())


def test_a_stream_left_early_closes_its_connection() -> None:
    """What stops the upstream's generation when the client has gone: its connection closes,
    rather than going back to the pool with the rest of the stream unread."""

    async def go() -> None:
        upstream = Upstream(pace=0.5)  # the whole stream would take 2.5 s
        async with _serving(upstream, None) as port:
            engine = UpstreamEngine(UpstreamConfig("m", f"http://127.0.0.1:{port}/v1"))
            opened = await engine.open(REQUEST)
            chunks = engine.generate(opened)
            first = await anext(aiter(chunks))
            assert first.text == WORDS[0]
            await chunks.aclose()  # type: ignore[attr-defined]
            await asyncio.wait_for(upstream.closed.wait(), 1.0)
            assert engine.streams == 0
            await engine.aclose()

    asyncio.run(go())


def test_credentials_in_the_url_are_basic_auth_and_win_over_a_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As they were through httpx: a reverse proxy's user and password in the URL are sent as
    basic auth (never shown: the replica's name has none), and a key is sent as a bearer."""
    monkeypatch.setenv("UPSTREAM_KEY", "k-123")

    async def go() -> None:
        upstream = Upstream()
        async with _serving(upstream, None) as port:
            for url in (
                f"http://us%40er:p%3Ass@127.0.0.1:{port}/v1",
                f"http://127.0.0.1:{port}/v1",
            ):
                engine = UpstreamEngine(UpstreamConfig("m", url, api_key_env="UPSTREAM_KEY"))
                assert "p:ss" not in engine.name and "er" not in engine.name
                assert await _text(engine) == "".join(WORDS)
                await engine.aclose()
        basic = b"Basic " + base64.b64encode(b"us@er:p:ss")
        assert upstream.authorization == [basic, b"Bearer k-123"]

    asyncio.run(go())
