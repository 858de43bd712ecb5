"""The gateway under load: aggregate tokens/s, added time to first token, and the oars process's
CPU a token, read straight from an upstream and through `oars serve` (store off, store on).

    .venv/bin/python -m bench.gateway_load [--streams 1,32,64] [--rates 0,160] [--tokens 400]
                                           [--reps 3] [--workers 1]

The upstream (`--rates 0`: as fast as it can; else that many chunks a second per stream, each
chunk a different word) and the clients run in processes of their own, on raw sockets, so the
figures are oars's, not httpx's. Every round is run direct, through oars with `store: false`,
then with `store: true`, in turn, `--reps` times; the table gives medians and the spread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.conftest import free_port
from tests.model.conftest import _wait_ready

UPSTREAM = r"""
import asyncio, json, sys
try:
    import uvloop; uvloop.install()
except ImportError:
    pass

WORDS = "the quick brown fox jumps over a lazy dog while seven wizards quietly hex".split()

def chunk(text):
    body = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"

END = (b"data: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1,
       "model": "m", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}).encode()
       + b"\n\ndata: " + json.dumps({"id": "c", "object": "chat.completion.chunk", "created": 1,
       "model": "m", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 0,
       "total_tokens": 5}}).encode() + b"\n\ndata: [DONE]\n\n")

async def serve(reader, writer):
    try:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        body = json.loads(await reader.readexactly(length)) if length else {}
        if head.startswith(b"GET"):
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}")
            return
        tokens, rate = body.get("max_tokens") or 400, float(body.get("seed") or 0) / 1000
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n")
        for i in range(tokens):
            writer.write(chunk(" " + WORDS[i % len(WORDS)] + str(i)))
            if rate:
                await asyncio.sleep(1 / rate)
            elif i % 16 == 15:
                await writer.drain()
        writer.write(END)
        await writer.drain()
    except (ConnectionError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()

async def main():
    server = await asyncio.start_server(serve, "127.0.0.1", int(sys.argv[1]), backlog=1024)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""

CLIENT = r"""
import asyncio, json, sys, time
try:
    import uvloop; uvloop.install()
except ImportError:
    pass

port, path, body, marker, n = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode(), sys.argv[4].encode(), int(sys.argv[5])

async def one():
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    first, count, tail = 0.0, 0, b""
    while data := await reader.read(65536):
        seen = (tail + data).count(marker) - tail.count(marker)
        if seen and not first:
            first = time.perf_counter()
        count += seen
        tail = data[-len(marker):]
    writer.close()
    return first - start, count, time.perf_counter()

async def main():
    start = time.perf_counter()
    results = await asyncio.gather(*[one() for _ in range(n)])
    end = max(r[2] for r in results)
    print(json.dumps({"ttft": [r[0] for r in results], "tokens": sum(r[1] for r in results),
                      "seconds": end - start}))

asyncio.run(main())
"""


def _cpu(pid: int) -> float:
    """User and system CPU seconds of a process and its children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def _children(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def _round(port: int, path: str, body: dict[str, object], marker: str, n: int) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, str(port), path, json.dumps(body), marker, str(n)],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", default="1,32,64")
    parser.add_argument("--rates", default="0,160", help="chunks/s per stream; 0: unpaced")
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument(
        "--plain",
        action="store_true",
        help="oars without uvloop, httptools and orjson (as before they were dependencies)",
    )
    parser.add_argument("--oars", default=".", help="the checkout of oars to run")
    args = parser.parse_args()
    up_port, oars_port = free_port(), free_port()
    folder = tempfile.mkdtemp(prefix="oars-bench-")
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)])
    block = "import sys; sys.modules.update(uvloop=None, httptools=None, orjson=None); "
    start = (block if args.plain else "") + "from oars.cli import main; main()"
    cmd = [sys.executable, "-c", start, "serve"]
    cmd += ["--port", str(oars_port), "--log-level", "warning", "--store", f"{folder}/oars.db"]
    cmd += ["--upstream", f"m=http://127.0.0.1:{up_port}/v1"]
    cmd += ["--workers", str(args.workers)] if args.workers > 1 else []
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=args.oars)
    rows = []
    try:
        _wait_ready(f"http://127.0.0.1:{oars_port}", server, Path("/dev/null"))
        pids = [server.pid, *_children(server.pid)]
        for rate in (float(r) for r in args.rates.split(",")):
            for n in (int(s) for s in args.streams.split(",")):
                seed = int(rate * 1000) or None
                direct = {"model": "m", "messages": [{"role": "user", "content": "x"}]}
                direct.update(stream=True, max_tokens=args.tokens, seed=seed)
                paths = {
                    "direct": (up_port, "/v1/chat/completions", direct, '"content": " '),
                    "store off": (
                        oars_port,
                        "/v1/responses",
                        {"store": False},
                        "event: response.output_text.delta",
                    ),
                    "store on": (
                        oars_port,
                        "/v1/responses",
                        {"store": True},
                        "event: response.output_text.delta",
                    ),
                }
                results: dict[str, list[dict[str, float]]] = {k: [] for k in paths}
                for rep in range(args.reps + 1):  # the first round warms up
                    for name, (port, path, extra, marker) in paths.items():
                        body = dict(extra)
                        if port == oars_port:
                            body.update(model="m", input="x", stream=True)
                            body.update(max_output_tokens=args.tokens)
                            body["temperature"] = 0
                            body["top_p"] = 1
                            body["seed"] = seed
                        before = sum(_cpu(p) for p in pids)
                        result = _round(port, path, body, marker, n)
                        result["cpu"] = sum(_cpu(p) for p in pids) - before
                        if rep:
                            results[name].append(result)
                rows.append(_rows(rate, n, results))
    finally:
        server.terminate()
        server.wait(timeout=20)
        upstream.terminate()
    print(f"{args.tokens} chunks a stream; {args.reps} rounds each, alternating; median (min-max)")
    print(
        "| rate/stream | streams | path | tokens/s | ratio to direct | median TTFT ms | "
        "p99 TTFT ms | oars CPU µs/token |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(r for group in rows for r in group))
    print(json.dumps({"args": vars(args)}))


def _rows(rate: float, n: int, results: dict[str, list[dict[str, float]]]) -> list[str]:
    def tps(r: dict[str, float]) -> float:
        return r["tokens"] / r["seconds"]

    direct = statistics.median(tps(r) for r in results["direct"])
    out = []
    for name, rounds in results.items():
        rates = sorted(tps(r) for r in rounds)
        ttfts = sorted(t for r in rounds for t in r["ttft"])
        p99 = ttfts[min(len(ttfts) - 1, int(len(ttfts) * 0.99))]
        cpu = (
            "-"
            if name == "direct"
            else f"{statistics.median(r['cpu'] / max(r['tokens'], 1) for r in rounds) * 1e6:.0f}"
        )
        out.append(
            f"| {rate:g} | {n} | {name} | {statistics.median(rates):,.0f} "
            f"({rates[0]:,.0f}-{rates[-1]:,.0f}) | {statistics.median(rates) / direct:.2f} | "
            f"{statistics.median(ttfts) * 1000:.1f} | {p99 * 1000:.1f} | {cpu} |"
        )
    return out


if __name__ == "__main__":
    main()
