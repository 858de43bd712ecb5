"""The slow tier: a real `oars serve` on the default model, in a subprocess, on loopback."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import httpx2  # the transport library of the openai SDK
import pytest

from oars.validator import validate_sse


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Base URL (…/v1) of a real server; context 4096 keeps the over-long-prompt test cheap."""
    yield from _serve(tmp_path_factory, "--ctx", "4096")


@pytest.fixture(scope="session")
def agent_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server for agent clients: their prompts are long, and they send no temperature, so the
    server's default is 0 to keep the small model's turns reproducible."""
    yield from _serve(tmp_path_factory, "--ctx", "16384", "--temperature", "0")


# The servers' reasoning key, so tests can seal reasoning the way a client would get it back.
SECRET_KEY = "b2Fycy10ZXN0LWtleS1vbmx5LWZvci10aGUtc3VpdGU="


def _serve(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[str]:
    port = _free_port()
    folder = tmp_path_factory.mktemp("server")
    log = folder / "oars.log"
    cmd = [sys.executable, "-m", "oars.cli", "serve", "--port", str(port),
           "--store", str(folder / "oars.db"), *args]  # fmt: skip
    with open(log, "wb") as out:
        env = {**os.environ, "OARS_SECRET_KEY": SECRET_KEY}
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(base, proc, log)
        yield f"{base}/v1"
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_ready(base: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"oars serve exited:\n{log.read_text()[-3000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"oars serve did not become ready:\n{log.read_text()[-3000:]}")


class RecordingTransport(httpx2.HTTPTransport):
    """For the openai SDK: keeps the raw bytes of every response body, so SDK streams go through the validator too."""

    def __init__(self) -> None:
        super().__init__()
        self.bodies: list[bytes] = []

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        response = super().handle_request(request)
        chunks: list[bytes] = []
        self.bodies.append(b"")
        slot = len(self.bodies) - 1
        inner = response.stream

        class Tee(httpx2.SyncByteStream):
            def __iter__(self_inner) -> Iterator[bytes]:
                for chunk in inner:  # type: ignore[union-attr]
                    chunks.append(chunk)
                    self.bodies[slot] = b"".join(chunks)
                    yield chunk

            def close(self_inner) -> None:
                inner.close()  # type: ignore[union-attr]

        response.stream = Tee()
        return response


def stream(server: str, body: dict[str, Any]) -> Any:  # a Report; Any for terse tests
    """POST a streamed request; assert HTTP 200 and a stream the validator finds clean."""
    response = httpx.post(f"{server}/responses", json={**body, "stream": True}, timeout=300)
    assert response.status_code == 200, response.text
    report = validate_sse(response.text)
    assert report.ok, report.text()
    return report
