"""The gateway under load: aggregate tokens/s, added time to first token, and the proxy process's
CPU a token, read straight from an upstream, through `oars serve` (store off, store on) and, with
`--litellm`, through LiteLLM's proxy.

    .venv/bin/python -m bench.gateway_load [--streams 1,32,64] [--rates 0,160] [--tokens 400]
                                           [--reps 3] [--workers 1] [--litellm]

The upstream (`--rates 0`: as fast as it can; else that many chunks a second per stream, each
chunk a different word) and the clients run in processes of their own, on raw sockets, so the
figures are the gateway's, not httpx's. Paced, the upstream keeps to a schedule (chunk i at
i/rate s after the first): a wake-up that comes late does not put off the chunks after it, as
an engine on machines of its own keeps its pace whatever the gateway in front of it does. The
upstream keeps its connections alive (chunked bodies), as vLLM's and llama.cpp's servers do;
each client stream connects anew. Unpaced, the `--streams` requests start at once (what one
process saturates at, and how late the last of a burst starts). Paced, they are a load: as
many users, arriving evenly over one stream's length, each sending two streams back to back,
so that `--streams` streams run at once in the middle of the round (tokens/s is over the whole
round, ramps included, alike on every path). Every round is run direct, through oars with `store:
false`, then with `store: true` (then through LiteLLM), in turn, `--reps` times; the table gives
medians and the spread, each TTFT with what it adds to direct's, and how many of the tokens asked
for each path delivered (a stream cut short is reported, not averaged in).
Tokens are counted as they reach the client: each of the upstream's has one `~` in its text,
and a Responses stream is read up to its `output_text.done` (after which it repeats the text),
so a delta that carries several tokens counts as many.

`--litellm` runs LiteLLM's proxy from a venv of its own (`make litellm`; it is no dependency of
oars), with its own CLI (`litellm --config --host --port`) and its default of one uvicorn worker,
in a temporary directory (so it reads no `.env` of the checkout). Its config has one model,
`openai/m` at the upstream with `use_chat_completions_api: true`: without that setting both
`openai/` and `hosted_vllm/` forward `/v1/responses` to the upstream's `/v1/responses`, which the
fake upstream does not serve; with it, LiteLLM bridges the Responses API to the upstream's
`/v1/chat/completions`, as oars does. It runs without a master key
(`dangerously_permit_weak_or_unset_master_key`, as oars here runs without one: no auth on either
side) and without a database, with spend logs and spend updates off. `LITELLM_LOCAL_MODEL_COST_MAP`
keeps it from fetching its model-cost map at startup (its `--telemetry` flag is a no-op in the
pinned version, and it connects to nothing but the upstream), and `LITELLM_LOG=WARNING` keeps
uvicorn's access log off, as oars runs with `--log-level warning`. Its streaming logging (the
response assembled at the end of each stream, for usage and cost) is left on: LiteLLM marks
turning it off as not recommended, and its request accounting hangs on it. Its requests are the
oars ones with `store: false`. Its "CPU" is that of its process and any child processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.servers import Server, free_port, median

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

def framed(data):
    return b"%x\r\n" % len(data) + data + b"\r\n"

async def serve(reader, writer):
    # requests one after another on a connection, as vLLM's and llama.cpp's servers keep them
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length, close = 0, False
            for line in head.split(b"\r\n"):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
                close = close or line.lower() == b"connection: close"
            body = json.loads(await reader.readexactly(length)) if length else {}
            if head.startswith(b"GET"):
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
                await writer.drain()
                if close:
                    return
                continue
            tokens, rate = body.get("max_tokens") or 400, float(body.get("seed") or 0) / 1000
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                         b"transfer-encoding: chunked\r\n\r\n")
            start = asyncio.get_running_loop().time()
            for i in range(tokens):
                writer.write(framed(chunk(" ~" + WORDS[i % len(WORDS)] + str(i))))
                if rate:  # on a schedule: a late wake-up does not put off every later token
                    late = asyncio.get_running_loop().time() - start
                    await asyncio.sleep(max(0.0, (i + 1) / rate - late))
                elif i % 16 == 15:
                    await writer.drain()
            writer.write(framed(END) + b"0\r\n\r\n")
            await writer.drain()
            if close:
                return
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

port, path, body, n = int(sys.argv[1]), sys.argv[2], sys.argv[3].encode(), int(sys.argv[4])
stagger, each = float(sys.argv[5]), int(sys.argv[6])
# every token of the upstream has one "~"; a Responses stream repeats the text after its deltas
TOKEN, STOP = b"~", b"output_text.done"

async def one():
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    start = time.perf_counter()
    writer.write(b"POST " + path.encode() + b" HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"connection: close\r\ncontent-length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    first, count, tail, done = 0.0, 0, b"", False
    while data := await reader.read(65536):
        if done:
            continue
        end = (tail + data).find(STOP)
        if end >= 0:
            done, data = True, data[: max(0, end - len(tail))]
        seen = data.count(TOKEN)
        if seen and not first:
            first = time.perf_counter()
        count += seen
        tail = data[-len(STOP):]
    writer.close()
    return first - start, count, time.perf_counter()

async def user(i):
    await asyncio.sleep(i * stagger / n)
    return [await one() for _ in range(each)]

async def main():
    start = time.perf_counter()
    results = [r for rs in await asyncio.gather(*[user(i) for i in range(n)]) for r in rs]
    end = max(r[2] for r in results)
    print(json.dumps({"ttft": [r[0] for r in results], "tokens": sum(r[1] for r in results),
                      "counts": [r[1] for r in results], "seconds": end - start}))

asyncio.run(main())
"""


def _cpu(pid: int) -> float:
    """User and system CPU seconds of a process and its children so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = sum(int(f) for f in fields[11:15])
    return ticks / os.sysconf("SC_CLK_TCK")


def _tree(pid: int) -> list[int]:
    """A process and its descendants."""
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
    return [pid, *(p for child in out.split() for p in _tree(int(child)))]


LITELLM = Path(__file__).resolve().parent.parent / "build" / "litellm" / "bin" / "litellm"

LITELLM_CONFIG = """\
model_list:
  - model_name: m
    litellm_params:
      model: openai/m
      api_base: http://127.0.0.1:{port}/v1
      api_key: unused
      use_chat_completions_api: true
general_settings:
  dangerously_permit_weak_or_unset_master_key: true
  disable_spend_logs: true
  disable_spend_updates: true
"""


def _litellm(folder: Path, upstream: int) -> Server:
    """LiteLLM's proxy in front of the upstream, from its own venv, in `folder` (so that it
    reads no `.env` of the checkout)."""
    (folder / "litellm.yaml").write_text(LITELLM_CONFIG.format(port=upstream))
    config = [str(LITELLM), "--config", "litellm.yaml", "--host", "127.0.0.1"]
    return Server(
        "litellm",
        lambda port: [*config, "--port", str(port)],
        folder / "litellm.log",
        env={"LITELLM_LOCAL_MODEL_COST_MAP": "True", "LITELLM_LOG": "WARNING"},
        unset=("PYTHONPATH", "VIRTUAL_ENV"),  # its own venv's interpreter and packages
        ready="/health/liveliness",
        cwd=folder,
    )


def _oars(folder: Path, upstream: int, workers: int, plain: bool, checkout: Path) -> Server:
    """`oars serve` (from `checkout`) in front of the upstream, with its store in `folder`."""
    block = "import sys; sys.modules.update(uvloop=None, httptools=None, orjson=None); "
    start = (block if plain else "") + "from oars.cli import main; main()"
    args = ["--log-level", "warning", "--store", f"{folder}/oars.db"]
    args += ["--upstream", f"m=http://127.0.0.1:{upstream}/v1"]
    args += ["--workers", str(workers)] if workers > 1 else []
    return Server(
        "oars",
        lambda port: [sys.executable, "-c", start, "serve", "--port", str(port), *args],
        folder / "oars.log",
        cwd=checkout,
    )


def _round(
    port: int, path: str, body: dict[str, object], n: int, stagger: float, each: int
) -> dict[str, Any]:
    argv = [str(port), path, json.dumps(body), str(n), str(stagger), str(each)]
    out = subprocess.run(
        [sys.executable, "-c", CLIENT, *argv],
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(json.loads(out.stdout))


@dataclass(frozen=True)
class Load:
    """What the rounds ask: `streams` at once at `rate` chunks a second each (0: unpaced),
    `tokens` a stream, `reps` rounds on each path after a warm-up."""

    streams: Sequence[int] = (1, 32, 64)
    rates: Sequence[float] = (0.0, 160.0)
    tokens: int = 400
    reps: int = 3
    workers: int = 1
    plain: bool = False
    checkout: Path = Path(".")
    litellm: bool = False


@dataclass(frozen=True)
class Way:
    """One way to the upstream's tokens: a port, a request, and the processes whose CPU counts."""

    port: int
    path: str
    body: dict[str, object]
    pids: list[int]


@dataclass(frozen=True)
class Figure:
    """One path at one rate and load, over all its rounds."""

    rate: float
    streams: int
    path: str
    tokens_per_s: list[float]  # a round each, sorted
    ratio: float  # the median's, to direct's median
    ttft_p50: float  # seconds, every stream of every round
    ttft_p99: float
    added_p50: float  # over direct's
    added_p99: float
    cpu_us: float  # the proxy's CPU a token (nan for direct)
    counts: list[int]  # tokens each stream delivered
    asked: int  # tokens each stream asked for

    @property
    def off(self) -> int:
        """Streams that delivered other than the tokens asked."""
        return sum(c != self.asked for c in self.counts)


def run(load: Load) -> list[Figure]:
    """Every round of `load`: direct, oars with `store: false` then `store: true` (then
    LiteLLM), in turn."""
    if load.litellm and not LITELLM.exists():
        sys.exit(f"--litellm: {LITELLM} is missing; run `make litellm` first")
    up_port = free_port()
    folder = Path(tempfile.mkdtemp(prefix="oars-bench-"))
    upstream = subprocess.Popen([sys.executable, "-c", UPSTREAM, str(up_port)])
    oars = _oars(folder, up_port, load.workers, load.plain, load.checkout)
    litellm = _litellm(folder, up_port) if load.litellm else None
    figures: list[Figure] = []
    try:
        oars.start()
        if litellm:
            litellm.start()
        for rate in load.rates:
            for n in load.streams:
                paths = _paths(up_port, oars, litellm, rate, load.tokens)
                figures += _summary(rate, n, load.tokens, _rounds(paths, rate, n, load))
    finally:
        oars.stop()
        if litellm:
            litellm.stop()
        upstream.terminate()
    return figures


def _paths(
    up_port: int, oars: Server, litellm: Server | None, rate: float, tokens: int
) -> dict[str, Way]:
    seed = int(rate * 1000) or None  # the upstream's pace, as it reads it
    direct: dict[str, object] = {"model": "m", "stream": True}
    direct.update(messages=[{"role": "user", "content": "x"}], max_tokens=tokens, seed=seed)
    responses: dict[str, object] = {"model": "m", "input": "x", "stream": True}
    responses.update(temperature=0, top_p=1, seed=seed, max_output_tokens=tokens)
    oars_pids = _tree(oars.pid)
    paths = {
        "direct": Way(up_port, "/v1/chat/completions", direct, []),
        "store off": Way(oars.port, "/v1/responses", {**responses, "store": False}, oars_pids),
        "store on": Way(oars.port, "/v1/responses", {**responses, "store": True}, oars_pids),
    }
    if litellm:
        body = {**responses, "store": False}
        paths["litellm"] = Way(litellm.port, "/v1/responses", body, _tree(litellm.pid))
    return paths


def _rounds(
    paths: dict[str, Way], rate: float, n: int, load: Load
) -> dict[str, list[dict[str, Any]]]:
    results: dict[str, list[dict[str, Any]]] = {k: [] for k in paths}
    # paced: `n` users, arriving over one stream's length, two streams each
    stagger, each = (load.tokens / rate, 2) if rate else (0.0, 1)
    for rep in range(load.reps + 1):  # the first round warms up
        for name, way in paths.items():
            before = sum(_cpu(p) for p in way.pids)
            result = _round(way.port, way.path, way.body, n, stagger, each)
            result["cpu"] = sum(_cpu(p) for p in way.pids) - before
            if rep:
                results[name].append(result)
    return results


def _ttfts(rounds: list[dict[str, Any]]) -> tuple[float, float]:
    times: list[float] = sorted(t for r in rounds for t in r["ttft"])
    return statistics.median(times), times[min(len(times) - 1, int(len(times) * 0.99))]


def _summary(
    rate: float, n: int, tokens: int, results: dict[str, list[dict[str, Any]]]
) -> list[Figure]:
    def tps(r: dict[str, Any]) -> float:
        return float(r["tokens"]) / float(r["seconds"])

    direct = median(tps(r) for r in results["direct"])
    direct_p50, direct_p99 = _ttfts(results["direct"])
    out = []
    for name, rounds in results.items():
        rates = sorted(tps(r) for r in rounds)
        p50, p99 = _ttfts(rounds)
        cpu = (
            median(r["cpu"] / max(r["tokens"], 1) for r in rounds) * 1e6
            if name != "direct"
            else float("nan")
        )
        counts: list[int] = [c for r in rounds for c in r["counts"]]
        ratio = median(rates) / direct
        added = (p50 - direct_p50, p99 - direct_p99)
        out.append(Figure(rate, n, name, rates, ratio, p50, p99, *added, cpu, counts, tokens))
    return out


def _row(f: Figure) -> str:
    added = f.path != "direct"
    rates = f.tokens_per_s
    delivered = (
        f"{sum(f.counts):,} of {f.asked * len(f.counts):,}; {f.off} of {len(f.counts)} streams off"
        if f.off
        else "all"
    )
    return (
        f"| {f.rate:g} | {f.streams} | {f.path} | {median(rates):,.0f} "
        f"({rates[0]:,.0f}-{rates[-1]:,.0f}) | {f.ratio:.2f} | "
        f"{f.ttft_p50 * 1000:.1f}{f' ({f.added_p50 * 1000:+.1f})' if added else ''} | "
        f"{f.ttft_p99 * 1000:.1f}{f' ({f.added_p99 * 1000:+.1f})' if added else ''} | "
        f"{f'{f.cpu_us:.0f}' if added else '-'} | {delivered} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
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
    parser.add_argument("--oars", type=Path, default=Path("."), help="the checkout of oars to run")
    parser.add_argument(
        "--litellm", action="store_true", help="LiteLLM's proxy as a fourth path (`make litellm`)"
    )
    args = parser.parse_args()
    load = Load(
        streams=[int(s) for s in args.streams.split(",")],
        rates=[float(r) for r in args.rates.split(",")],
        tokens=args.tokens,
        reps=args.reps,
        workers=args.workers,
        plain=args.plain,
        checkout=args.oars,
        litellm=args.litellm,
    )
    figures = run(load)
    print(f"{args.tokens} chunks a stream; {args.reps} rounds each, alternating; median (min-max)")
    print(
        "| rate/stream | streams | path | tokens/s | ratio to direct | median TTFT ms (added) | "
        "p99 TTFT ms (added) | proxy CPU µs/token | tokens delivered |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    print("\n".join(_row(f) for f in figures))
    for f in figures:
        if f.off:
            print(f"WARNING: {f.rate:g}/s, {f.streams} streams, {f.path}: {f.off} streams off")
    print(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}}))


if __name__ == "__main__":
    main()
