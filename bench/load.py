"""A bounded loopback load test: time to first token and errors at 1, 4, 16 and 64 concurrent
clients, then a soak of many requests with random disconnects, watching the server's memory.

The server is a real `oars serve` process (the embedded model) or a server process on the
scripted engine (`bench.scripted`), with its SQLite store. Every client streams; a share of them
hangs up after the first token. Counted per level: completed streams (each checked by the stream
validator), disconnects, 4xx, 5xx, hung requests (no end within the timeout). After the run, no
generation may be left running (`/health`, `/metrics`).

    .venv/bin/python -m bench.load [--engine scripted|model] [--levels 1,4,16,64]
                                   [--per-level 64] [--soak 1000] [--disconnect 0.25]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from bench.servers import Server, oars_serve, percentile
from oars.validator import validate_sse
from oars.weights import DEFAULT_MODEL

MODEL = DEFAULT_MODEL.name

TIMEOUT = 120.0  # a request with no end by then is hung


@dataclass
class Level:
    clients: int
    ttft: list[float] = field(default_factory=list)
    outcomes: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


def _server(engine: str, folder: Path) -> Server:
    store = f"sqlite:///{folder}/oars.db"
    model = ["--store", store, "--ctx", "4096", "--temperature", "0"]
    scripted = [sys.executable, "-m", "bench.scripted", "--store", store]
    scripted += ["--chunks", "24", "--delay", "0.005"]
    return Server(
        engine,
        lambda port: (
            oars_serve(port, *model) if engine == "model" else [*scripted, "--port", str(port)]
        ),
        folder / "server.log",
    )


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def _one(
    client: httpx.AsyncClient, base: str, level: Level, leave: bool, tokens: int
) -> None:
    body = {
        "model": MODEL,
        "input": "Count from one to fifty.",
        "stream": True,
        "max_output_tokens": tokens,
    }
    start = time.perf_counter()
    text, first = "", 0.0
    try:
        async with asyncio.timeout(TIMEOUT):
            async with client.stream("POST", f"{base}/v1/responses", json=body) as r:
                if r.status_code != 200:
                    level.outcomes["5xx" if r.status_code >= 500 else "4xx"] += 1
                    await r.aread()
                    return
                async for line in r.aiter_lines():
                    text += line + "\n"
                    if not first and "output_text.delta" in line:
                        first = time.perf_counter() - start
                        level.ttft.append(first)
                        if leave:
                            level.outcomes["disconnected"] += 1
                            return
    except TimeoutError:
        level.outcomes["hung"] += 1
        return
    except httpx.HTTPError:
        level.outcomes["transport error"] += 1
        return
    report = validate_sse(text)
    final = report.final or {}
    ok = report.ok and final.get("status") in ("completed", "incomplete")
    level.outcomes["completed" if ok else "invalid stream"] += 1


async def _level(
    base: str, clients: int, requests: int, disconnect: float, tokens: int, rng: random.Random
) -> Level:
    level = Level(clients)
    gate = asyncio.Semaphore(clients)
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=TIMEOUT, limits=limits) as client:

        async def run(leave: bool) -> None:
            async with gate:
                await _one(client, base, level, leave, tokens)

        start = time.perf_counter()
        await asyncio.gather(*(run(rng.random() < disconnect) for _ in range(requests)))
        level.seconds = time.perf_counter() - start
    return level


def _settled(base: str) -> tuple[int, float]:
    """Generations still running once the server has had 10 s to notice every departure."""
    deadline = time.monotonic() + 10
    while True:
        running = int(httpx.get(f"{base}/health", timeout=10).json()["running"])
        if running == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    gauges = [
        line
        for line in httpx.get(f"{base}/metrics", timeout=10).text.splitlines()
        if line.startswith(("oars_generations_running", "oars_generations_queued"))
    ]
    return running, sum(float(line.rsplit(" ", 1)[1]) for line in gauges)


def _pct(values: list[float], q: float) -> float:
    return percentile(values, q) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--engine", choices=("scripted", "model"), default="scripted")
    parser.add_argument("--levels", default="1,4,16,64")
    parser.add_argument("--per-level", type=int, default=64, help="requests at each level")
    parser.add_argument("--soak", type=int, default=1000, help="requests in the memory soak")
    parser.add_argument("--disconnect", type=float, default=0.25, help="share that hangs up")
    parser.add_argument("--tokens", type=int, default=16, help="max_output_tokens")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    rng = random.Random(7)
    with tempfile.TemporaryDirectory() as tmp, _server(args.engine, Path(tmp)) as server:
        base = server.base
        asyncio.run(_level(base, 4, 8, 0.0, args.tokens, rng))  # warm up
        levels = [
            asyncio.run(
                _level(base, int(n), max(args.per_level, int(n)), args.disconnect, args.tokens, rng)
            )
            for n in args.levels.split(",")
        ]
        before = _rss_mib(server.pid)
        soak = asyncio.run(_level(base, 16, args.soak, args.disconnect, args.tokens, rng))
        after = _rss_mib(server.pid)
        running, gauges = _settled(base)
    rows = [
        {
            "clients": lv.clients,
            "requests": sum(lv.outcomes.values()),
            "ttft_p50_ms": round(_pct(lv.ttft, 0.5), 1),
            "ttft_p99_ms": round(_pct(lv.ttft, 0.99), 1),
            "seconds": round(lv.seconds, 1),
            **dict(lv.outcomes),
        }
        for lv in levels
    ]
    summary = {
        "engine": args.engine,
        "levels": rows,
        "soak": {
            "requests": sum(soak.outcomes.values()),
            **dict(soak.outcomes),
            "rss_before_mib": round(before, 1),
            "rss_after_mib": round(after, 1),
            "rss_growth_mib": round(after - before, 1),
        },
        "left_running": running,
        "gauges_after": gauges,
    }
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(f"engine: {args.engine}; {args.disconnect:.0%} of clients hang up after the first token")
    print(
        "| clients | requests | TTFT p50 ms | TTFT p99 ms | completed | disconnected | 4xx | 5xx "
        "| hung | invalid | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for lv, row in zip(levels, rows, strict=True):
        o = lv.outcomes
        print(
            f"| {lv.clients} | {row['requests']} | {row['ttft_p50_ms']} | {row['ttft_p99_ms']} "
            f"| {o['completed']} | {o['disconnected']} | {o['4xx']} | {o['5xx']} | {o['hung']} "
            f"| {o['invalid stream'] + o['transport error']} | {row['seconds']} |"
        )
    s = summary["soak"]
    print(
        f"soak: {s['requests']} requests at 16 clients ({soak.outcomes['completed']} completed, "
        f"{soak.outcomes['disconnected']} disconnected, {soak.outcomes['5xx']} 5xx, "
        f"{soak.outcomes['hung']} hung); server RSS {s['rss_before_mib']} -> "
        f"{s['rss_after_mib']} MiB ({s['rss_growth_mib']:+} MiB)"
    )
    print(f"after: {running} responses running, generation gauges sum {gauges:g}")


if __name__ == "__main__":
    main()
