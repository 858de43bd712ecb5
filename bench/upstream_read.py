"""What reading an upstream's stream costs the gateway, a chunk at a time: the CPU of one process
reading paced chat-completion streams, per chunk, through the upstream engine's own client
(`UpstreamEngine.open` and the SSE reader it streams through), through httpx (the client it used
before), and through a bare asyncio protocol with httptools' parser (the floor: nothing but the
socket's callback and the chunked framing).

    .venv/bin/python -m bench.upstream_read [--streams 64] [--rate 160] [--tokens 400] [--reps 3]

The upstream is `bench.gateway_load`'s, in a process of its own (a chunk a token, each a
different word, connections kept alive); paced, one read brings one chunk, as from an engine that
decodes a token at a time. The three readers alternate, `--reps` rounds each after a warm-up;
the table gives the median CPU µs a chunk and the ratio to the floor's in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.gateway_load import UPSTREAM
from tests.conftest import free_port

Read = Callable[[], Awaitable[int]]  # one stream, read to its end: how many `data:` payloads


def _payloads(rest: bytes, data: bytes) -> tuple[int, bytes]:
    *lines, rest = (rest + data).split(b"\n")
    return sum(1 for line in lines if line.startswith(b"data:")), rest


async def _engine(url: str, body: dict[str, Any]) -> tuple[Read, Callable[[], Awaitable[None]]]:
    from oars.engines.upstream import UpstreamConfig, UpstreamEngine
    from oars.engines.upstream.client import sse_data

    engine = UpstreamEngine(UpstreamConfig("m", url))

    async def read() -> int:
        response = await engine._send(body, read_timeout=None)
        count = 0
        try:
            async for payloads in sse_data(response, 300.0, 120.0):
                count += len(payloads)
        finally:
            response.release()
        return count

    return read, engine.aclose


async def _httpx(url: str, body: dict[str, Any]) -> tuple[Read, Callable[[], Awaitable[None]]]:
    import httpx

    limits = httpx.Limits(max_connections=512, max_keepalive_connections=512)
    client = httpx.AsyncClient(base_url=url, limits=limits, timeout=300.0)

    async def read() -> int:
        count, rest = 0, b""
        async with client.stream("POST", "/chat/completions", json=body) as response:
            async for data in response.aiter_raw():
                seen, rest = _payloads(rest, data)
                count += seen
        return count

    return read, client.aclose


async def _floor(port: int, body: dict[str, Any]) -> tuple[Read, Callable[[], Awaitable[None]]]:
    import httptools

    raw = json.dumps(body).encode()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
    request = head + b"content-length: %d\r\n\r\n" % len(raw) + raw
    loop = asyncio.get_running_loop()

    class Stream(asyncio.Protocol):
        def __init__(self) -> None:
            self.parser = httptools.HttpResponseParser(self)
            self.count, self.rest = 0, b""
            self.done: asyncio.Future[int] = loop.create_future()

        def data_received(self, data: bytes) -> None:
            self.parser.feed_data(data)

        def on_body(self, body: bytes) -> None:
            seen, self.rest = _payloads(self.rest, body)
            self.count += seen

        def on_message_complete(self) -> None:
            self.done.set_result(self.count)

    async def read() -> int:
        transport, stream = await loop.create_connection(Stream, "127.0.0.1", port)
        transport.write(request)
        try:
            return await stream.done
        finally:
            transport.close()

    async def nothing() -> None:
        pass

    return read, nothing


async def _round(read: Read, streams: int, rate: float, tokens: int) -> tuple[float, int]:
    """`streams` users arriving over one stream's length, two streams each: CPU s, chunks."""
    stagger = tokens / rate if rate else 0.0

    async def user(i: int) -> int:
        await asyncio.sleep(i * stagger / streams)
        return await read() + await read()

    before = resource.getrusage(resource.RUSAGE_SELF)
    chunks = sum(await asyncio.gather(*(user(i) for i in range(streams))))
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu, chunks


async def _main(args: argparse.Namespace, port: int) -> dict[str, list[float]]:
    url = f"http://127.0.0.1:{port}/v1"
    body = {"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": True}
    body.update(max_tokens=args.tokens, seed=int(args.rate * 1000) or None)
    readers = {
        "floor (asyncio protocol + httptools)": await _floor(port, body),
        "oars (UpstreamEngine)": await _engine(url, body),
        "httpx": await _httpx(url, body),
    }
    per_chunk: dict[str, list[float]] = {name: [] for name in readers}
    expected = args.streams * 2 * (args.tokens + 3)  # the tokens, the finish, the usage, [DONE]
    for rep in range(args.reps + 1):  # the first round warms up
        for name, (read, _) in readers.items():
            cpu, chunks = await _round(read, args.streams, args.rate, args.tokens)
            if chunks != expected:
                raise SystemExit(f"{name}: read {chunks} payloads, expected {expected}")
            if rep:
                per_chunk[name].append(cpu / chunks * 1e6)
    for _, close in readers.values():
        await close()
    return per_chunk


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--rate", type=float, default=160.0, help="chunks/s per stream; 0: unpaced")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    port = free_port()
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(port)])
    try:
        time.sleep(1.0)
        import uvloop

        per_chunk = uvloop.run(_main(args, port))
    finally:
        upstream.terminate()
    floor = statistics.median(next(iter(per_chunk.values())))
    print(
        f"{args.streams} streams × {args.rate:g} chunks/s, {args.tokens} chunks, {args.reps} reps"
    )
    print("| reader | CPU µs a chunk, median (min-max) | ratio to the floor |")
    print("|---|---|---|")
    for name, values in per_chunk.items():
        median = statistics.median(values)
        spread = f"{min(values):.1f}-{max(values):.1f}"
        print(f"| {name} | {median:.1f} ({spread}) | {median / floor:.2f} |")
    print(json.dumps({"args": vars(args)}))


if __name__ == "__main__":
    main()
