"""The server against the engine beneath it: one `oars serve` on the default model (SQLite
store) against the raw engine loop in this process (no server, builder or parser), on the same
prompts, each new from its first token so nothing comes from the KV cache; `store: true`
against `store: false` on the same server; a `json_schema` constraint against none; the
builder's events against the scripted engine's chunks. The targets of `bench.run`'s
`foundation` group."""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import httpx

from bench.servers import Server, oars_serve
from bench.targets import Figure, Figures
from oars.engines.llama import LlamaEngine
from oars.generation import ChatMessage, EngineRequest, OutputFormat, SamplingParams
from oars.http.sse import encode
from oars.normalize import normalize
from oars.service import ResponsesService
from oars.settings import EngineSettings
from oars.testing import ScriptedEngine
from oars.turn import Turn
from oars.weights import DEFAULT_MODEL, pull

PROMPT = "Count from 1 to 300, separated by commas, and nothing else."
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


@dataclass(frozen=True)
class Run:
    ttft: float  # seconds from request to first text
    decode_tps: float  # tokens/s after the first token


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
    """Events a second through service + builder + SSE encoding, and the scripted engine's
    own chunks a second."""
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

    return asyncio.run(through_builder()), asyncio.run(chunks_only())


def measure(reps: int, tokens: int) -> Figures:
    """Each figure of the group, `reps` alternating runs of `tokens`-token decodes."""
    settings = EngineSettings(model_id=DEFAULT_MODEL.name)
    engine = LlamaEngine(pull(), settings, gpu_layers=0, prefix_folder=None)
    with tempfile.TemporaryDirectory(prefix="oars-bench-") as folder:
        serve = ["--log-level", "warning", "--store", f"{folder}/oars.db"]
        with Server("oars", lambda port: oars_serve(port, *serve)) as server:
            base = server.base
            asyncio.run(_raw(engine, -1, 8))  # warm-up both
            _http(base, -1, 8)
            raw_runs, http_runs = [], []
            for rep in range(reps):
                raw_runs.append(asyncio.run(_raw(engine, rep, tokens)))
                http_runs.append(_http(base, rep + 1000, tokens))
            unstored, stored = [], []
            for rep in range(reps):
                unstored.append(_http(base, rep + 4000, tokens, store=False))
                stored.append(_http(base, rep + 5000, tokens, store=True))
            ttft_off, ttft_on = [], []
            for rep in range(8 * reps):  # TTFT is noisy: many short alternating runs
                ttft_off.append(_ttft(base, rep + 6000, store=False))
                ttft_on.append(_ttft(base, rep + 7000, store=True))
    constraint = OutputFormat(JSON_SCHEMA)
    free_runs, json_runs = [], []
    asyncio.run(_raw(engine, -2, 8, JSON_PROMPT, constraint))  # builds the tokenizer once
    for rep in range(reps):
        free_runs.append(asyncio.run(_raw(engine, 2000 + rep, tokens, JSON_PROMPT)))
        json_runs.append(asyncio.run(_raw(engine, 3000 + rep, tokens, JSON_PROMPT, constraint)))
    events, chunks = _builder(20000)
    return {
        "http": Figure.of([r.decode_tps for r in http_runs], [r.decode_tps for r in raw_runs]),
        "http_ttft": Figure.of([r.ttft for r in http_runs], [r.ttft for r in raw_runs]),
        "store": Figure.of([r.decode_tps for r in stored], [r.decode_tps for r in unstored]),
        "store_ttft": Figure.of(ttft_on, ttft_off),
        "json": Figure.of([r.decode_tps for r in json_runs], [r.decode_tps for r in free_runs]),
        "builder": Figure(events, chunks),
    }
