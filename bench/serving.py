"""What serving costs each server: its decode against the loop beneath it and the thinnest server.

    make llama-server    # once: llama-server and llama-bench, from the sources oars runs
    .venv/bin/python -m bench.serving [--reps 15] [--tokens 128] [--llama-args "-fa off --no-repack"]
    .venv/bin/python -m bench.serving --streams 4 [--reps 11]

Each rep decodes `--tokens` greedy tokens six ways, one at a time, in an order that rotates:

- `llama-bench -p 0 -n N`: llama.cpp's own decode loop, C++, no server and no sampling;
- oars's engine loop, no server: the context `oars serve` decodes in (its sequences, its
  kernels), fed one token a pass and choosing the next by argmax, in this process's Python;
- `oars serve`, one stream, timed on the client from the first text delta to the last, as
  `bench.vs_llama_server` times its decode;
- `llama-server` (with `--llama-args`), the same;
- `bench.floor`, the thinnest server a Python token path allows on oars's context and
  handover (oars's delta event a token, nothing else), the same: what a token costs any
  Python server; and the same floor with its engine thread writing each event to the socket
  itself, no event loop on the way (no wake-up, no second thread).

It reports each one's tokens a second and its ratio to llama-bench in the same rep (median and
spread), and oars's server and the floor against llama-server. The loops show what the kernels
give a step with nothing else to do; a server's shortfall from them is what serving a token
costs it (its events, its writes, its threads and the client's reads, all on the same two
cores). Between the floor and `oars serve` are oars's own layers.

With `--streams N` above 1, the servers alone run N concurrent streams a rep (the floor
batches them much as oars does: one pass a step for all, each prompt in a pass of its own),
each reported by its output tokens a second together, against llama-server's.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.kernels import raw_context
from bench.vs_llama_server import (
    COUNT,
    LLAMA_SERVER,
    Server,
    _alternate,
    _chat,
    _oars_body,
    _oars_event,
    _servers,
)
from oars.engines.batching import Feed
from oars.engines.llama import LlamaLog, default_parallel
from oars.weights import pull

LLAMA_BENCH = LLAMA_SERVER.with_name("llama-bench")
FLOOR, DIRECT = "the Python floor", "the Python floor, no loop"


class EngineLoop:
    """oars's context without a server: the sequences and kernels `oars serve` gives it."""

    def __init__(self, model: Path, threads: int, ctx: int) -> None:
        import llama_cpp

        LlamaLog.install(llama_cpp)
        self.context = raw_context(
            llama_cpp,
            str(model),
            repack=False,
            n_seq=default_parallel(ctx),
            n_ctx_seq=ctx,
            threads=threads,
        )

    def decode(self, tokens: int) -> float:
        """Tokens a second of `tokens` passes of one token each, from an empty sequence."""
        context = self.context
        context.forget(0, 0)
        token = 1000
        began = time.perf_counter()
        for position in range(tokens):
            context.decode([Feed(0, (token,), position, True)])
            token = int(np.argmax(context.logits(0)))
        return tokens / (time.perf_counter() - began)


def kernel_flags(llama_args: str) -> list[str]:
    """llama-bench's flags for the kernels that llama-server's `llama_args` choose: its flash
    attention (`-fa`/`--flash-attn`, else auto) and repacked weights (off with `--no-repack`)."""
    flags = shlex.split(llama_args)
    flash = "auto"
    for flag, value in itertools.pairwise(flags):
        if flag in ("-fa", "--flash-attn"):
            flash = value
    return ["-fa", flash, "--repack", "0" if "--no-repack" in flags else "1"]


def llama_bench(model: Path, threads: int, tokens: int, llama_args: str) -> float:
    """llama-bench's tokens a second for one `tokens`-token decode, with llama-server's kernels."""
    command = [str(LLAMA_BENCH), "-m", str(model), "-p", "0", "-n", str(tokens), "-r", "1"]
    out = subprocess.run(
        [*command, "-t", str(threads), *kernel_flags(llama_args), "-o", "json"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return float(json.loads(out)[0]["avg_ts"])


def floor_server(args: argparse.Namespace, name: str, path: str, log: Path) -> Server:
    """`bench.floor` on the model, threads and context `oars serve` gets, asked at `path`."""
    return Server(
        name,
        lambda port: [
            sys.executable,
            "-m",
            "bench.floor",
            "--port",
            str(port),
            "--model",
            str(args.model),
            "--threads",
            str(args.threads),
            "--ctx",
            str(args.ctx),
        ],
        path,
        _oars_body,
        _oars_event,
        log,
    )


def _served(server: Server, streams: int, tokens: int, rep: int) -> float:
    """One stream's decode tokens a second (from its first text to its last), or for several
    their output tokens a second together, from the first request sent to the last stream's
    end (the prompts included)."""
    chats = [_chat(f"serve {rep} {i}" if i else f"serve {rep}", 20, COUNT) for i in range(streams)]
    if streams == 1:
        return server.one(chats[0], tokens).decode_tps
    done = server.many(chats, tokens)
    wall = max(s.end for s in done) - min(s.start for s in done)
    return sum(s.output_tokens for s in done) / wall


def _spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=15)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument(
        "--streams",
        type=int,
        default=1,
        help="concurrent streams; above 1, the servers only, by their aggregate tokens a second",
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--ctx", type=int, default=16384, help="context of each sequence")
    parser.add_argument("--parallel", type=int, default=4, help="llama-server's slots")
    parser.add_argument("--llama-args", default="-fa off --no-repack")
    parser.add_argument("--llama-server", type=Path, default=LLAMA_SERVER)
    parser.add_argument("--model", type=Path, default=None, help="a GGUF (default: oars's own)")
    args = parser.parse_args()
    for binary in (args.llama_server, LLAMA_BENCH):
        if not binary.exists():
            sys.exit(f"{binary} is missing: run `make llama-server` first")
    args.model = args.model or pull()
    # what bench.vs_llama_server's servers need of the arguments
    args.account, args.oars_args, args.oars_env = False, "", []
    args.llama_args = [args.llama_args]
    with tempfile.TemporaryDirectory(prefix="oars-serving-") as tmp:
        oars, llama = _servers(args, args.model, Path(tmp))
        floor = floor_server(args, FLOOR, "/v1/responses", Path(tmp) / "floor.log")
        direct = floor_server(args, DIRECT, "/direct/v1/responses", Path(tmp) / "direct.log")
        ways: dict[str, Callable[[int], float]] = {}
        if args.streams == 1:
            loop = EngineLoop(args.model, args.threads, args.ctx)
            ways["llama-bench"] = lambda rep: llama_bench(
                args.model, args.threads, args.tokens, args.llama_args[0]
            )
            ways["oars's engine loop"] = lambda rep: loop.decode(args.tokens)
        for name, server in (
            ("oars serve", oars),
            (f"llama-server {args.llama_args[0]}", llama),
            (FLOOR, floor),
            (DIRECT, direct),
        ):
            ways[name] = functools.partial(_served, server, args.streams, args.tokens)
        try:
            oars.start()
            llama.start()
            floor.start()
            direct.start()
            for way in ways.values():  # a first run of each, not counted
                way(-1)
            names = list(ways)
            runs = _alternate(names, args.reps, lambda name, rep: ways[name](rep))
            found = dict(zip(names, runs, strict=True))
        finally:
            oars.stop()
            llama.stop()
            floor.stop()
            direct.stop()
    print(_table(args, found))


def _table(args: argparse.Namespace, found: dict[str, list[float]]) -> str:
    llama_server = next(k for k in found if k.startswith("llama-server"))
    base_name = "llama-bench" if "llama-bench" in found else llama_server
    base = found[base_name]
    if args.streams == 1:
        title = (
            f"One stream of {args.tokens} greedy tokens, {args.reps} reps, {args.threads} threads "
            f"(llama-bench with the kernels of `{args.llama_args[0]}`)\n"
        )
    else:
        title = (
            f"{args.streams} concurrent streams of {args.tokens} greedy tokens, aggregate, "
            f"{args.reps} reps, {args.threads} threads\n"
        )
    lines = [
        title,
        f"| | tok/s, median | / {base_name}, median of reps | spread |",
        "|---|---|---|---|",
    ]
    for name, values in found.items():
        ratios = _paired(values, base)
        lines.append(
            f"| {name} | {statistics.median(values):.2f} | "
            f"{statistics.median(ratios):.3f} | {_spread(ratios)} |"
        )
    lines.append("")
    for name in ("oars serve", FLOOR, DIRECT):
        ratios = _paired(found[name], found[llama_server])
        lines.append(
            f"{name} / llama-server: {statistics.median(ratios):.3f} ({_spread(ratios)}) "
            f"over {len(ratios)} reps"
        )
    ratios = _paired(found["oars serve"], found[FLOOR])
    lines.append(f"oars serve / {FLOOR}: {statistics.median(ratios):.3f} ({_spread(ratios)})")
    return "\n".join(lines)


def _paired(ours: list[float], theirs: list[float]) -> list[float]:
    """Rep by rep, ours over theirs (the reps ran side by side)."""
    return [a / b for a, b in zip(ours, theirs, strict=True)]


if __name__ == "__main__":
    main()
