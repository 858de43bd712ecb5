"""Benchmarks of the foundation, each a ratio against a reference measured in the same run.

    make bench            # or: .venv/bin/python -m bench.run [--reps N] [--tokens N]

1. Decode tokens/s through HTTP+SSE (a real `oars serve` subprocess, streamed with httpx) versus
   the raw engine loop in this process with no server, builder or parser, on the same prompts.
   Runs alternate raw/HTTP so that machine noise hits both alike. Each run gets a fresh prompt
   prefix so nothing comes from the KV cache, and time to first token includes the prefill.
2. The cost of storing: the same HTTP+SSE runs with `store: true` (the response, its items and
   its event log written to SQLite as it streams) versus `store: false`, alternating, same server.
3. The builder: events per second through service + builder + SSE encoding on the scripted engine,
   versus the scripted engine's own chunks per second.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

from oars.engines.llama import LlamaEngine
from oars.generation import ChatMessage, EngineRequest, OutputFormat, SamplingParams
from oars.http.sse import encode
from oars.normalize import normalize
from oars.service import ResponsesService
from oars.settings import EngineSettings
from oars.testing import ScriptedEngine
from oars.turn import Turn
from oars.weights import DEFAULT_MODEL, pull
from tests.model.conftest import _free_port, _wait_ready

PROMPT = "Count from 1 to 300, separated by commas, and nothing else."


@dataclass
class Run:
    ttft: float  # seconds from request to first text
    decode_tps: float  # tokens/s after the first token


JSON_PROMPT = "Describe three fictional people as JSON: name, age, hobbies, city."
JSON_SCHEMA = {
    "type": "object",
    "properties": {
        "people": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {
                    "name": {"type": "string"},
                    "age": {"type": "integer"},
                    "hobbies": {"type": "array", "items": {"type": "string"}},
                    "city": {"type": "string"},
                },
                "required": ["name", "age", "hobbies", "city"],
            },
        }
    },
    "required": ["people"],
}


async def _raw(
    engine: LlamaEngine,
    rep: int,
    tokens: int,
    prompt: str = PROMPT,
    output: OutputFormat | None = None,
) -> Run:
    request = EngineRequest(
        (ChatMessage("user", f"Run {rep}. {prompt}"),),
        SamplingParams(temperature=0, max_output_tokens=tokens),
        output=output,
    )
    start = time.perf_counter()
    prepared = await engine.open(request)
    first = last = 0.0
    produced = 0
    async for chunk in engine.generate(prepared):
        now = time.perf_counter()
        if chunk.num_tokens and not first:
            first = now
        produced += chunk.num_tokens
        if chunk.num_tokens:
            last = now
    return Run(first - start, (produced - 1) / (last - first))


def _http(base: str, rep: int, tokens: int, *, store: bool = False) -> Run:
    body = {
        "model": "bench",
        "input": f"Run {rep}. {PROMPT}",
        "temperature": 0,
        "max_output_tokens": tokens,
        "stream": True,
        "store": store,
    }
    start = time.perf_counter()
    first = last = 0.0
    usage: dict[str, Any] = {}
    with httpx.stream("POST", f"{base}/v1/responses", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            now = time.perf_counter()
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta":
                first = first or now
                last = now
            elif event["type"] in ("response.completed", "response.incomplete"):
                usage = event["response"]["usage"]
    # A token that ends mid-character sends no delta of its own: count tokens from usage.
    return Run(first - start, (usage["output_tokens"] - 1) / (last - first))


def _ttft(base: str, rep: int, *, store: bool) -> float:
    """Seconds to the first text delta of a short streamed reply."""
    body = {
        "model": "bench",
        "input": f"Run {rep}. Say hello.",
        "temperature": 0,
        "max_output_tokens": 4,
        "stream": True,
        "store": store,
    }
    start = time.perf_counter()
    with httpx.stream("POST", f"{base}/v1/responses", json=body, timeout=300) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and '"response.output_text.delta"' in line:
                return time.perf_counter() - start
    raise RuntimeError("no text delta")


def _builder(n: int) -> tuple[float, float]:
    engine = ScriptedEngine(["tok"] * n)

    async def chunks_only() -> float:
        start = time.perf_counter()
        turn = Turn.of(normalize({"input": "x"}, served_model="m"))
        prepared = await engine.open(turn.engine_request())
        count = sum([1 async for _ in engine.generate(prepared)])
        return count / (time.perf_counter() - start)

    async def through_builder() -> float:
        start = time.perf_counter()
        turn = Turn.of(normalize({"input": "x"}, served_model="m"))
        run = await ResponsesService(engine).start(turn)
        count = 0
        async for event in run.events():
            encode(event)
            count += 1
        return count / (time.perf_counter() - start)

    return asyncio.run(chunks_only()), asyncio.run(through_builder())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    args = parser.parse_args()
    path = pull()
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
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        from pathlib import Path

        _wait_ready(base, server, Path("/dev/null"))
        engine = LlamaEngine(
            path,
            EngineSettings(model_id=DEFAULT_MODEL.name),
            gpu_layers=0,
            prefix_folder=None,
        )
        raw_runs, http_runs = [], []
        asyncio.run(_raw(engine, -1, 8))  # warm-up both
        _http(base, -1, 8)
        for rep in range(args.reps):
            raw_runs.append(asyncio.run(_raw(engine, rep, args.tokens)))
            http_runs.append(_http(base, rep + 1000, args.tokens))
        unstored, stored = [], []
        for rep in range(args.reps):
            unstored.append(_http(base, rep + 4000, args.tokens, store=False))
            stored.append(_http(base, rep + 5000, args.tokens, store=True))
        ttft_off, ttft_on = [], []
        for rep in range(8 * args.reps):  # TTFT is noisy: many short alternating runs
            ttft_off.append(_ttft(base, rep + 6000, store=False))
            ttft_on.append(_ttft(base, rep + 7000, store=True))
        constraint = OutputFormat(JSON_SCHEMA)
        free_runs, json_runs = [], []
        asyncio.run(_raw(engine, -2, 8, JSON_PROMPT, constraint))  # builds the tokenizer once
        for rep in range(args.reps):
            free_runs.append(asyncio.run(_raw(engine, 2000 + rep, args.tokens, JSON_PROMPT)))
            json_runs.append(
                asyncio.run(_raw(engine, 3000 + rep, args.tokens, JSON_PROMPT, constraint))
            )
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(folder, ignore_errors=True)
    med = statistics.median
    raw_tps, http_tps = med(r.decode_tps for r in raw_runs), med(r.decode_tps for r in http_runs)
    chunks_ps, events_ps = _builder(20000)
    print(f"| measure ({args.reps} alternating runs, {args.tokens} tokens, median) | value |")
    print("|---|---|")
    print(f"| decode tok/s, raw engine loop (reference) | {raw_tps:.1f} |")
    print(f"| decode tok/s, HTTP+SSE | {http_tps:.1f} |")
    print(f"| **ratio HTTP+SSE / raw** | **{http_tps / raw_tps:.3f}** |")
    print(f"| time to first token, raw (s) | {med(r.ttft for r in raw_runs):.3f} |")
    print(f"| time to first token, HTTP+SSE (s) | {med(r.ttft for r in http_runs):.3f} |")
    off_tps, on_tps = med(r.decode_tps for r in unstored), med(r.decode_tps for r in stored)
    print(f"| decode tok/s, HTTP+SSE, store false (reference) | {off_tps:.1f} |")
    print(f"| decode tok/s, HTTP+SSE, store true (SQLite) | {on_tps:.1f} |")
    print(f"| **ratio store true / false, tok/s** | **{on_tps / off_tps:.3f}** |")
    off_ttft, on_ttft = med(ttft_off), med(ttft_on)
    print(
        f"| time to first token, store false / true, {len(ttft_on)} short runs each (s) | "
        f"{off_ttft:.3f} / {on_ttft:.3f} |"
    )
    print(f"| **ratio TTFT store false / true** | **{off_ttft / on_ttft:.3f}** |")
    free_tps = med(r.decode_tps for r in free_runs)
    json_tps = med(r.decode_tps for r in json_runs)
    print(f"| decode tok/s, JSON prompt, unconstrained (reference) | {free_tps:.1f} |")
    print(f"| decode tok/s, JSON prompt, json_schema constraint | {json_tps:.1f} |")
    print(f"| **ratio constrained / unconstrained** | **{json_tps / free_tps:.3f}** |")
    print(f"| scripted engine chunks/s (reference) | {chunks_ps:,.0f} |")
    print(f"| builder events/s (service+builder+SSE encode) | {events_ps:,.0f} |")
    print(f"| **ratio builder events / engine chunks** | **{events_ps / chunks_ps:.3f}** |")


if __name__ == "__main__":
    main()
