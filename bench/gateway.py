"""Gateway overhead: the same streams read straight from an upstream and through `oars serve`.

The upstream is a local chat-completions server that paces its chunks (a steady token rate, as an
engine would), so what differs between the two paths is only what oars adds: its parse, the
builder, the event log and the SSE encoding. Runs alternate (direct, oars, direct, …) in one
session, at 1 and at 32 concurrent streams.

    .venv/bin/python -m bench.gateway [--reps 3] [--tokens 200] [--rate 50]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.model.conftest import _free_port, _wait_ready
from tests.upstream_replay import Replay, Scenario, text_stream


@dataclass
class Stream:
    ttft: float  # seconds from sending the request to the first text
    tps: float  # text chunks per second after the first


async def _read(
    client: httpx.AsyncClient, url: str, body: dict[str, object], text_marker: str
) -> Stream:
    start = time.perf_counter()
    first = last = 0.0
    count = 0
    async with client.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("data: ") and text_marker in line:
                now = time.perf_counter()
                first = first or now
                last = now
                count += 1
    return Stream(first - start, (count - 1) / (last - first))


async def _round(url: str, body: dict[str, object], marker: str, n: int) -> list[Stream]:
    limits = httpx.Limits(max_connections=n + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        return await asyncio.gather(*[_read(client, url, body, marker) for _ in range(n)])


def _measure(
    upstream: Replay, oars: str, args: argparse.Namespace, n: int
) -> tuple[list[Stream], list[Stream]]:
    pieces = [f" w{i}" for i in range(args.tokens)]
    paced = Scenario(text_stream(pieces).chunks, chunk_delay=1 / args.rate)
    upstream.default = paced
    direct_body = {"model": "bench", "messages": [{"role": "user", "content": "x"}], "stream": True}
    oars_body = {"model": "bench", "input": "x", "stream": True, "store": False}
    direct: list[Stream] = []
    through: list[Stream] = []
    for _ in range(args.reps):
        direct += asyncio.run(
            _round(f"{upstream.url}/chat/completions", direct_body, '"content": " w', n)
        )
        through += asyncio.run(
            _round(f"{oars}/v1/responses", oars_body, '"response.output_text.delta"', n)
        )
    return direct, through


def _row(label: str, direct: list[Stream], through: list[Stream]) -> str:
    d_tps = statistics.median(s.tps for s in direct)
    o_tps = statistics.median(s.tps for s in through)
    d_ttft = statistics.median(s.ttft for s in direct)
    o_ttft = statistics.median(s.ttft for s in through)
    return (
        f"| {label} | {d_tps:.1f} | {o_tps:.1f} | {o_tps / d_tps:.3f} | "
        f"{d_ttft * 1000:.1f} | {o_ttft * 1000:.1f} | {(o_ttft - d_ttft) * 1000:+.1f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=200)
    parser.add_argument("--rate", type=float, default=50.0, help="upstream tokens/s per stream")
    parser.add_argument("--streams", default="1,32")
    args = parser.parse_args()
    with Replay() as upstream:
        port = _free_port()
        folder = tempfile.mkdtemp(prefix="oars-bench-")
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "oars.cli",
                "serve",
                "--port",
                str(port),
                "--log-level",
                "warning",
                "--store",
                f"{folder}/oars.db",
                "--upstream",
                f"bench={upstream.url}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            _wait_ready(base, server, Path("/dev/null"))
            rows = []
            for n in (int(x) for x in args.streams.split(",")):
                _measure(upstream, base, argparse.Namespace(**{**vars(args), "reps": 1}), n)
                rows.append(
                    _row(f"{n} stream{'s' if n > 1 else ''}", *_measure(upstream, base, args, n))
                )
        finally:
            server.terminate()
            server.wait(timeout=20)
    print(
        f"upstream: {args.tokens} chunks per stream at {args.rate:g}/s; {args.reps} rounds, "
        "alternating; medians over every stream of every round"
    )
    print(
        "| streams | direct tok/s | through oars tok/s | ratio | direct TTFT ms | "
        "oars TTFT ms | added ms |"
    )
    print("|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print(json.dumps({"args": vars(args)}))


if __name__ == "__main__":
    main()
