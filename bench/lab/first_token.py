"""Time to first token of cold ~100-token prompts on the embedded engine, in-process (no HTTP):
the very first request after the engine starts, then the next ones.

    .venv/bin/python -m bench.lab.first_token [--reps N]

Each prompt is new (nothing to reuse but the chat template's opening), greedy, 4 output tokens.
The first request shows what startup leaves to it (paging weights in, first-use buffers).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time

from oars.engines.llama import LlamaEngine
from oars.generation import ChatMessage, EngineRequest, SamplingParams
from oars.settings import EngineSettings
from oars.weights import pull

WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "river",
    "stone",
    "cloud",
    "paper",
    "window",
    "garden",
    "music",
    "silver",
]


async def _first_token(engine: LlamaEngine, seed: int) -> float:
    text = " ".join(random.Random(seed).choice(WORDS) for _ in range(75))
    request = EngineRequest(
        messages=(ChatMessage("user", f"{seed}: {text}"),),
        sampling=SamplingParams(temperature=0.0, max_output_tokens=4),
    )
    start = time.perf_counter()
    opened = await engine.open(request)
    async for _ in engine.generate(opened):
        return time.perf_counter() - start
    raise RuntimeError("no output")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    engine = LlamaEngine(pull(), EngineSettings(context=16384), gpu_layers=0, prefix_folder=None)
    time.sleep(5)  # let the start-up warming (grammar tokenizer, vocabulary scan) finish
    times = [asyncio.run(_first_token(engine, seed)) for seed in range(args.reps + 1)]
    later = statistics.median(times[1:])
    print(
        f"first request {times[0]:.3f} s; the next {args.reps}: median {later:.3f} s "
        f"(min {min(times[1:]):.3f}, max {max(times[1:]):.3f})"
    )


if __name__ == "__main__":
    main()
