"""The targets table: each figure oars keeps, as a ratio against a reference run beside it.

    make bench                                    # = .venv/bin/python -m bench.run
    .venv/bin/python -m bench.run --list          # the targets and their goals; nothing runs
    .venv/bin/python -m bench.run --only foundation,gateway [--reps 3] [--tokens 128]

Three groups, each measured in one session, the sides alternating rep by rep:

- `foundation`: one `oars serve` on the default model (SQLite store) against the raw engine
  loop in this process (no server, builder or parser), on the same prompts, each new from its
  first token so nothing comes from the KV cache; `store: true` against `store: false` on the
  same server; a `json_schema` constraint against none; the builder's events against the
  scripted engine's chunks.
- `llama-server`: the targets of `bench.vs_llama_server` (decode, prefill, 4 and 16 streams, an
  agent's next turn, a restarted session) against llama.cpp's own server on the same GGUF, by
  default with the kernels oars runs (`-fa off --no-repack`). Skipped if `make llama-server`
  has not built it.
- `gateway`: `bench.gateway_load`'s paced upstream (160 chunks a second a stream), read directly
  and through `oars serve --upstream`, at 1 and at 64 streams.

A ratio is figure / reference (its medians) with the range of the reps' own ratios; a goal is
on the ratio, on what the figure adds to the reference, or on the figure itself. On 2 cores the
whole table takes about 20 minutes, most of it llama-server's group.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from bench import gateway_load, vs_llama_server
from bench.servers import Server, median, oars_serve, paired, spread
from oars.engines.llama import LlamaEngine
from oars.generation import ChatMessage, EngineRequest, OutputFormat, SamplingParams
from oars.http.sse import encode
from oars.normalize import normalize
from oars.service import ResponsesService
from oars.testing import ScriptedEngine
from oars.turn import Turn
from oars.weights import DEFAULT_MODEL, pull


@dataclass(frozen=True)
class Figure:
    """A target's figure and its reference's, medians of the same reps."""

    value: float
    reference: float
    ratios: tuple[float, ...] = ()  # rep by rep

    @property
    def ratio(self) -> float:
        return self.value / self.reference if self.reference else float("nan")

    @classmethod
    def of(cls, values: list[float], references: list[float]) -> Figure:
        return cls(median(values), median(references), tuple(paired(values, references)))


@dataclass(frozen=True)
class Goal:
    """What a target asks: a bound on the ratio, on what the figure adds to its reference
    (`added`, in the figure's unit), or on the figure itself (`value`)."""

    bound: float
    at_least: bool
    on: str = "ratio"

    def met(self, figure: Figure) -> bool:
        measured = {
            "ratio": figure.ratio,
            "added": figure.value - figure.reference,
            "value": figure.value,
        }[self.on]
        return measured >= self.bound if self.at_least else measured <= self.bound

    def text(self, unit: str) -> str:
        sign = "≥" if self.at_least else "≤"
        if self.on == "ratio":
            return f"{sign} {self.bound:.2f}"
        if self.on == "added":
            return f"{sign} +{self.bound:g} {unit} added"
        return f"{sign} {self.bound:g} {unit}"


@dataclass(frozen=True)
class Target:
    key: str
    group: str
    figure: str  # what is measured of oars
    reference: str  # what it is set against, in the same run
    unit: str
    goal: Goal | None  # None: tracked for scale, nothing asked

    @property
    def digits(self) -> int:
        return {"s": 3, "ms": 1, "tok/s": 1}.get(self.unit, 0)


def at_least(bound: float, on: str = "ratio") -> Goal:
    return Goal(bound, True, on)


def at_most(bound: float, on: str = "ratio") -> Goal:
    return Goal(bound, False, on)


RAW, OFF, FREE = "the raw engine loop", "`store: false`", "no constraint"
LLAMA, DIRECT = "llama-server", "the upstream, direct"
F, L, G = "foundation", "llama-server", "gateway"
TARGETS = (
    Target("http", F, "decode through HTTP+SSE", RAW, "tok/s", at_least(0.95)),
    Target("http_ttft", F, "time to first token, HTTP+SSE", RAW, "s", None),
    Target("store", F, "decode, `store: true`", OFF, "tok/s", at_least(0.98)),
    Target("store_ttft", F, "time to first token, `store: true`", OFF, "s", at_most(1.02)),
    Target("json", F, "decode, `json_schema`", FREE, "tok/s", None),
    Target("builder", F, "builder events/s", "scripted engine chunks/s", "/s", None),
    Target("decode", L, "decode, 1 stream", LLAMA, "tok/s", at_least(1.0)),
    Target("prefill", L, "time to first token, 2,000-token prompt", LLAMA, "s", at_most(1.0)),
    Target("streams4", L, "4 streams, aggregate", LLAMA, "tok/s", at_least(1.0)),
    Target("streams16", L, "16 streams, aggregate", LLAMA, "tok/s", at_least(1.0)),
    Target("first16", L, "16 streams, slowest first token", LLAMA, "s", at_most(1.0)),
    Target("agent", L, "an agent's next turn, first token", LLAMA, "s", at_most(1.0)),
    Target("restart", L, "a restarted 8k session, first token", LLAMA, "s", at_most(1, "value")),
    Target("gw_rate", G, "1 stream × 160/s, tokens/s", DIRECT, "/s", at_least(0.98)),
    Target("gw_ttft", G, "1 stream × 160/s, median TTFT", DIRECT, "ms", at_most(5, "added")),
    Target("gw_rate64", G, "64 × 160/s, store on, tokens/s", DIRECT, "/s", at_least(0.98)),
    Target("gw_p99", G, "64 × 160/s, store on, p99 TTFT", DIRECT, "ms", at_most(20, "added")),
    Target("gw_p99_off", G, "64 × 160/s, store off, p99 TTFT", DIRECT, "ms", at_most(20, "added")),
)
Figures = dict[str, Figure]


# ---- foundation -----------------------------------------------------------------------------

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


def foundation(args: argparse.Namespace) -> Figures:
    reps, tokens = args.reps, args.tokens
    engine = LlamaEngine(pull(), model_id=DEFAULT_MODEL.name)
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


# ---- llama-server ---------------------------------------------------------------------------


def llama_server(args: argparse.Namespace) -> Figures:
    if not vs_llama_server.LLAMA_SERVER.exists():
        print("llama-server: skipped, `make llama-server` builds it", file=sys.stderr)
        return {}
    only = ("decode", "prefill", "scaling", "sixteen", "agent", "codex")
    chosen = vs_llama_server.steps(args.reps, args.tokens, only=only)
    with tempfile.TemporaryDirectory(prefix="oars-bench-") as home:
        setup = vs_llama_server.Setup(pull(), Path(home), llama_args=(args.llama_args,))
        rows = vs_llama_server.running(
            setup, lambda endpoints: vs_llama_server.measure(endpoints, chosen)
        )
    return {r.target: Figure(r.oars, r.reference, tuple(r.ratios)) for r in rows if r.target}


# ---- gateway --------------------------------------------------------------------------------


def gateway(args: argparse.Namespace) -> Figures:
    load = gateway_load.Load(streams=(1, 64), rates=(160.0,), tokens=400, reps=args.gateway_reps)
    found = {(f.streams, f.path): f for f in gateway_load.run(load)}

    def rate(n: int, path: str) -> Figure:
        ours, direct = found[n, path], found[n, "direct"]
        return Figure(median(ours.tokens_per_s), median(direct.tokens_per_s))

    def ttft(n: int, path: str, p99: bool) -> Figure:
        ours, direct = found[n, path], found[n, "direct"]
        if p99:
            return Figure(ours.ttft_p99 * 1000, direct.ttft_p99 * 1000)
        return Figure(ours.ttft_p50 * 1000, direct.ttft_p50 * 1000)

    return {
        "gw_rate": rate(1, "store off"),
        "gw_ttft": ttft(1, "store off", p99=False),
        "gw_rate64": rate(64, "store on"),
        "gw_p99": ttft(64, "store on", p99=True),
        "gw_p99_off": ttft(64, "store off", p99=True),
    }


GROUPS: dict[str, Callable[[argparse.Namespace], Figures]] = {
    "foundation": foundation,
    "llama-server": llama_server,
    "gateway": gateway,
}


def render(figures: Figures, groups: list[str]) -> str:
    """The targets of `groups` as a markdown table, with the figures measured (a target with
    none: not run)."""
    lines = [
        "| target | against | oars | reference | ratio | rep by rep | goal | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for target in (t for t in TARGETS if t.group in groups):
        goal = target.goal.text(target.unit) if target.goal else "—"
        found = figures.get(target.key)
        if found is None:
            lines.append(f"| {target.figure} | {target.reference} | | | | | {goal} | |")
            continue
        unit = f" {target.unit}" if target.unit else ""
        value = f"{found.value:,.{target.digits}f}{unit}"
        reference = f"{found.reference:,.{target.digits}f}{unit}"
        verdict = "" if target.goal is None else "met" if target.goal.met(found) else "**not met**"
        lines.append(
            f"| {target.figure} | {target.reference} | {value} | {reference} | "
            f"{found.ratio:.3f} | {spread(found.ratios)} | {goal} | {verdict} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128, help="output tokens of a decode")
    parser.add_argument("--gateway-reps", type=int, default=2, help="rounds of each gateway path")
    parser.add_argument(
        "--llama-args",
        default=vs_llama_server.SAME_KERNELS,
        help="llama-server's flags (default: the kernels oars runs; '' for as it comes)",
    )
    parser.add_argument("--only", default="", help=f"some groups, of {', '.join(GROUPS)}")
    parser.add_argument("--list", action="store_true", help="the targets only; nothing runs")
    args = parser.parse_args()
    groups = [g.strip() for g in args.only.split(",") if g.strip()] or list(GROUPS)
    unknown = set(groups) - set(GROUPS)
    if unknown:
        parser.error(f"no such group: {', '.join(sorted(unknown))}")
    figures: Figures = {}
    if not args.list:
        for group in groups:
            start = time.perf_counter()
            figures |= GROUPS[group](args)
            print(f"{group}: {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
    print(
        f"median of {args.reps} alternating reps ({args.tokens}-token decodes), gateway "
        f"{args.gateway_reps} rounds a path; llama-server {args.llama_args or 'as it comes'}\n"
    )
    print(render(figures, groups))


if __name__ == "__main__":
    main()
