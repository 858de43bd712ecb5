"""The upstream's network backend on asyncio streams: the engine's client uses it, and it speaks
plain HTTP and TLS (a self-signed certificate made by openssl), with keep-alive, to real
servers on loopback; a refused connection and a silent server are httpx's own errors."""

from __future__ import annotations

import asyncio
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from oars.engines.sockets import AsyncioBackend
from oars.engines.upstream import UpstreamConfig, UpstreamEngine
from tests.conftest import free_port

BODY = b"hello"


async def _http_server(
    context: ssl.SSLContext | None, silent: asyncio.Event | None = None
) -> asyncio.Server:
    """Answers every request with BODY; with `silent`, nothing until it is set."""

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while await reader.readuntil(b"\r\n\r\n"):
            if silent is not None:
                await silent.wait()
                return
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n" + BODY)
            await writer.drain()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await answer(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(serve, "127.0.0.1", 0, ssl=context)


def _client(verify: ssl.SSLContext | bool = True) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(verify=verify)
    transport._pool._network_backend = AsyncioBackend()
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(1.0))


def test_the_engine_client_uses_it() -> None:
    async def go() -> object:
        engine = UpstreamEngine(UpstreamConfig("m", url="http://127.0.0.1:9/v1"))
        backend = engine._http()._transport._pool._network_backend  # type: ignore[attr-defined]
        await engine.aclose()
        return backend

    assert isinstance(asyncio.run(go()), AsyncioBackend)


def test_plain_and_tls_with_keep_alive(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    make = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
    make += ["-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1"]
    subprocess.run(
        [*make, "-keyout", str(key), "-out", str(cert)],
        check=True,
        capture_output=True,
    )
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    served.load_cert_chain(cert, key)
    trusted = ssl.create_default_context(cafile=str(cert))

    async def go() -> None:
        for context, scheme in ((None, "http"), (served, "https")):
            server = await _http_server(context)
            port = server.sockets[0].getsockname()[1]
            async with _client(trusted) as client:
                for _ in range(3):  # one pooled connection, reused
                    r = await client.get(f"{scheme}://127.0.0.1:{port}/")
                    assert r.status_code == 200 and r.content == BODY
            server.close()
        server = await _http_server(served)
        port = server.sockets[0].getsockname()[1]
        async with _client() as client:  # a certificate nobody vouches for
            with pytest.raises(httpx.ConnectError):
                await client.get(f"https://127.0.0.1:{port}/")
        server.close()

    asyncio.run(go())


def test_refused_and_silent_are_httpx_errors() -> None:
    async def go() -> None:
        async with _client() as client:
            with pytest.raises(httpx.ConnectError):
                await client.get(f"http://127.0.0.1:{free_port()}/")
            quiet = asyncio.Event()
            server = await _http_server(None, silent=quiet)
            port = server.sockets[0].getsockname()[1]
            with pytest.raises(httpx.ReadTimeout):
                await client.get(f"http://127.0.0.1:{port}/")
            quiet.set()
            server.close()
            await server.wait_closed()

    asyncio.run(go())
