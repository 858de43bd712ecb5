"""What choosing a token costs the embedded engine's thread, per sequence and pass: `sample()` on
one row of the default model's vocabulary (151,936 logits), greedy, at temperature 1 over the
whole vocabulary (OpenAI's defaults: top_p 1, no top_k), with top_p 0.95 and with top_k 40;
beside it, in the same run, the whole-vocabulary draw as one running sum of every weight (how
`sample()` drew before `draw()`).

    .venv/bin/python -m bench.sampler [--calls 300] [--reps 5]

CPU time of this process per call, median over the reps (each rep a fresh set of rows).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import numpy as np

from oars.engines.sampler import sample
from oars.generation import SamplingParams

VOCAB = 151_936


def _running_sum_draw(logits: np.ndarray, rng: np.random.Generator) -> int:
    scaled = logits / np.float32(1.0)
    candidates = np.arange(scaled.size)
    probs = np.exp(scaled[candidates] - scaled.max()).astype(np.float64)
    cum = np.cumsum(probs)
    return int(candidates[int(np.searchsorted(cum, rng.random() * cum[-1], side="right"))])


def _per_call(choose: Callable[[np.ndarray, np.random.Generator], int], rows: np.ndarray) -> float:
    rng = np.random.default_rng(0)
    start = time.process_time()
    for row in rows:
        choose(row, rng)
    return (time.process_time() - start) / len(rows) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    ways: dict[str, Callable[[np.ndarray, np.random.Generator], int]] = {
        "greedy": lambda row, rng: sample(row, SamplingParams(temperature=0), rng),
        "temperature 1, whole vocabulary": lambda row, rng: sample(
            row, SamplingParams(temperature=1.0), rng
        ),
        "  the same as one running sum (before)": _running_sum_draw,
        "top_p 0.95": lambda row, rng: sample(row, SamplingParams(top_p=0.95), rng),
        "top_k 40": lambda row, rng: sample(row, SamplingParams(top_k=40), rng),
    }
    ms: dict[str, list[float]] = {name: [] for name in ways}
    for rep in range(args.reps):
        # peaked like a model's rows: a few likely tokens over a long tail
        rows = np.random.default_rng(rep).normal(0, 2.5, (args.calls, VOCAB)).astype(np.float32)
        rows[:, :8] += 12
        for name, choose in ways.items():
            ms[name].append(_per_call(choose, rows))
    print(f"{VOCAB} logits a row, {args.calls} calls a rep, {args.reps} reps; CPU ms a call")
    print("| sampling | ms a call, median (min-max) |")
    print("|---|---|")
    for name, values in ms.items():
        spread = f"{min(values):.3f}-{max(values):.3f}"
        print(f"| {name.strip()} | {statistics.median(values):.3f} ({spread}) |")
    print(json.dumps({"args": vars(args)}))


if __name__ == "__main__":
    main()
