"""A small chat-completions server on loopback that replays recorded chunk streams, whole or
broken: cut mid-way, garbage, a stall, no `[DONE]`, an error status, slow headers.

    with Replay() as upstream:
        upstream.play(Scenario(chunks))       # the next request gets this stream
        ... point an UpstreamEngine at upstream.url ...
        upstream.bodies[-1]                   # what oars sent
        upstream.healthy = False              # its health checks fail (GET …/models: 503)
        upstream.health_delay = 5             # …or answer that late (a server busy generating)
"""

from __future__ import annotations

import json
import threading
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

FIXTURES = Path(__file__).parent / "fixtures" / "upstream"


@dataclass
class Scenario:
    chunks: list[Any] = field(default_factory=list)  # objects, or raw `data:` payload strings
    done: bool = True  # end with `data: [DONE]`
    cut_after: int | None = None  # close the connection after this many chunks
    stall_after: int | None = None  # then send nothing for `stall` seconds
    stall: float = 0.0
    status: int = 200
    error: Any = None  # the body of an error status
    header_delay: float = 0.0  # seconds before the status line
    chunk_delay: float = 0.0  # seconds between chunks
    framing: str = "close"  # the body: until the connection closes, "chunked", or "gzip" (closed)


def recorded(name: str) -> Scenario:
    """A recorded stream from tests/fixtures/upstream."""
    data = json.loads((FIXTURES / f"{name}.json").read_text())
    return Scenario(data["chunks"], done=data.get("done", True))


def text_stream(pieces: list[str], *, finish: str = "stop", usage: bool = True) -> Scenario:
    """A plain stream as most servers send it: role first, pieces, finish, usage, [DONE]."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "up"}

    def chunk(delta: dict[str, Any], reason: str | None = None) -> dict[str, Any]:
        return {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": reason}]}

    chunks: list[Any] = [chunk({"role": "assistant", "content": ""})]
    chunks += [chunk({"content": p}) for p in pieces] + [chunk({}, finish)]
    if usage:
        chunks.append(
            {
                **base,
                "choices": [],
                "usage": {
                    "prompt_tokens": 7,
                    "completion_tokens": len(pieces),
                    "total_tokens": 7 + len(pieces),
                },
            }
        )
    return Scenario(chunks)


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # many streams connect at once (the default backlog is 5)


class Replay:
    def __init__(self) -> None:
        self.scenarios: list[Scenario] = []
        self.default = text_stream(["Hello", " there"])
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.closed = threading.Event()  # a client closed its stream before the end
        self.healthy = True  # how it answers a health check (GET …/models)
        self.health_checks = 0
        self.health_delay = 0.0  # seconds before a health check is answered
        self.listing: list[dict[str, Any]] = [
            {"id": "up"}
        ]  # its models, as GET …/models lists them
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                replay.health_checks += 1
                time.sleep(replay.health_delay)
                ok = replay.healthy and self.path.rstrip("/").endswith("/models")
                body = json.dumps({"object": "list", "data": replay.listing} if ok else {})
                self.send_response(200 if ok else 503)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                replay.bodies.append(json.loads(self.rfile.read(length) or b"{}"))
                replay.headers.append(dict(self.headers))
                scenario = replay.scenarios.pop(0) if replay.scenarios else replay.default
                replay._serve(self, scenario)

        self._server = _Server(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}/v1"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def play(self, *scenarios: Scenario) -> None:
        self.scenarios.extend(scenarios)

    def __enter__(self) -> Replay:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, handler: BaseHTTPRequestHandler, scenario: Scenario) -> None:
        time.sleep(scenario.header_delay)
        if scenario.status != 200:
            body = json.dumps(scenario.error).encode()
            handler.send_response(scenario.status)
            handler.send_header("content-type", "application/json")
            handler.send_header("content-length", str(len(body)))
            handler.end_headers()
            handler.wfile.write(body)
            return
        if not self.bodies[-1].get("stream"):
            self._whole(handler, scenario)
            return
        handler.send_response(200)
        handler.send_header("content-type", "text/event-stream")
        handler.send_header("connection", "close")
        if scenario.framing == "chunked":
            handler.send_header("transfer-encoding", "chunked")
        gzip = zlib.compressobj(wbits=31) if scenario.framing == "gzip" else None
        if gzip is not None:
            handler.send_header("content-encoding", "gzip")
        handler.end_headers()
        try:
            for frame in _frames(scenario):
                if gzip is not None:  # each frame flushed, so that it streams
                    frame = gzip.compress(frame) + gzip.flush(zlib.Z_SYNC_FLUSH)
                if scenario.framing == "chunked":
                    frame = b"%x\r\n%s\r\n" % (len(frame), frame)
                handler.wfile.write(frame)
                handler.wfile.flush()
                time.sleep(scenario.chunk_delay)
            if gzip is not None:
                handler.wfile.write(gzip.flush())
            if scenario.framing == "chunked" and scenario.cut_after is None:
                handler.wfile.write(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            self.closed.set()
        handler.close_connection = True

    @staticmethod
    def _whole(handler: BaseHTTPRequestHandler, scenario: Scenario) -> None:
        """An unstreamed request (oars counting tokens): a completion with usage."""
        usage = next(
            (c["usage"] for c in scenario.chunks if isinstance(c, dict) and c.get("usage")),
            {"prompt_tokens": 7, "completion_tokens": 1},
        )
        body = json.dumps({"object": "chat.completion", "choices": [], "usage": usage}).encode()
        handler.send_response(200)
        handler.send_header("content-type", "application/json")
        handler.send_header("content-length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)


def _frames(scenario: Scenario) -> Iterator[bytes]:
    for i, chunk in enumerate(scenario.chunks):
        if scenario.cut_after is not None and i >= scenario.cut_after:
            return
        if scenario.stall_after is not None and i == scenario.stall_after:
            time.sleep(scenario.stall)
        data = chunk if isinstance(chunk, str) else json.dumps(chunk)
        yield f"data: {data}\n\n".encode()
    if scenario.done:
        yield b"data: [DONE]\n\n"
