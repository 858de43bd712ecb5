"""What a pass of token rows costs by which sequences it feeds, in what order, raw llama.cpp.

    .venv/bin/python -m bench.lab.graphs [--reps 5] [--threads 2]

One context as `oars serve` makes it (one memory per sequence, no flash attention), 8 sequences
of 200 prompt tokens; each measure is the median of 15 passes of one token a sequence (each
token dropped again after its pass), and the reps alternate the measures' order. llama.cpp
computes a pass as one graph per run of consecutive sequences in increasing order, so:

- `0`, `0,1`, `0,1,2`, `0-3`, `0-7`: rows in order, one graph each;
- `1,0,3,2` and `3,2,1,0`: the same four rows out of order (three and four graphs);
- `0,1,3` and `0,2`: a gap (two graphs).

Then the batch independence of a sequence's logits (the largest difference from its lone pass):
token rows of 7 sequences and of 8 (llama.cpp multiplies its K-quant weights by 8 rows or more
with another kernel), and a prompt's last 5 tokens fed beside 3 token rows rather than in its
own pass (what the batcher does not do).

Last, prompts evaluated together in one pass, as llama-server evaluates the prompts waiting for
its slots, against each in a pass of its own (what the batcher does): the time of all of them
(median of `--reps`), and the largest difference of a prompt's last logits between the two.
llama.cpp cuts such a pass into graphs of the same number of tokens a sequence, so prompts of
different lengths leave short graphs behind.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from bench.lab.kernels import raw_context
from bench.lab.passes import split
from oars.engines.batching import Feed
from oars.engines.llama_context import LlamaContext, LlamaLog
from oars.weights import pull

PROMPT, PASSES = 200, 15
SETS = {
    "0": [0],
    "0,1": [0, 1],
    "0,1,2": [0, 1, 2],
    "0-3": [0, 1, 2, 3],
    "1,0,3,2": [1, 0, 3, 2],
    "3,2,1,0": [3, 2, 1, 0],
    "0,1,3": [0, 1, 3],
    "0,2": [0, 2],
    "0-7": list(range(8)),
}


def _pass_ms(context: LlamaContext, seqs: list[int]) -> float:
    times = []
    for i in range(PASSES):
        feeds = [Feed(s, (100 + i,), PROMPT, True) for s in seqs]
        began = time.perf_counter()
        context.decode(feeds)
        times.append(time.perf_counter() - began)
        for s in seqs:
            context.forget(s, PROMPT)
    return statistics.median(times) * 1000


def _rows_difference(context: LlamaContext, n: int) -> float:
    alone = []
    for s in range(n):
        context.decode([Feed(s, (100 + s,), PROMPT, True)])
        alone.append(context.logits(0).copy())
        context.forget(s, PROMPT)
    context.decode([Feed(s, (100 + s,), PROMPT, True) for s in range(n)])
    together = [context.logits(s).copy() for s in range(n)]
    for s in range(n):
        context.forget(s, PROMPT)
    return max(float(np.abs(a - b).max()) for a, b in zip(alone, together, strict=True))


def _tail_difference(context: LlamaContext, rng: np.random.Generator) -> float:
    """A 40-token prompt on sequence 3: whole in one pass, against its first 35 tokens in one
    pass and its last 5 beside the token rows of sequences 0-2."""
    prompt = [int(t) for t in rng.integers(1000, 30000, 40)]
    context.forget(3, 0)
    context.decode([Feed(3, prompt, 0, True)])
    alone = context.logits(0).copy()
    context.forget(3, 0)
    context.decode([Feed(3, prompt[:35], 0, False)])
    rows = [Feed(s, (100 + s,), PROMPT, False) for s in range(3)]
    context.decode([*rows, Feed(3, prompt[35:], 35, True)])
    beside = context.logits(0).copy()
    for s in range(4):
        context.forget(s, PROMPT)
    return float(np.abs(alone - beside).max())


PROMPT_SETS = ([60, 60, 60, 60], [60, 61, 73, 41], [12, 60], [5, 60], [9, 9])


def _prompts_together(
    context: LlamaContext, rng: np.random.Generator, lengths: list[int], reps: int
) -> tuple[float, float, float, int]:
    """Prompts of `lengths` on sequences 0.., each in its own pass and all in one: ms of
    each way (medians), their last logits' largest difference, and the one pass's graphs."""
    prompts = [[int(t) for t in rng.integers(1000, 30000, n)] for n in lengths]
    alone: list[float] = []
    together: list[float] = []
    for rep in range(reps):
        for way in ("alone", "together") if rep % 2 == 0 else ("together", "alone"):
            for seq in range(len(prompts)):
                context.forget(seq, 0)
            began = time.perf_counter()
            if way == "alone":
                last = []
                for seq, prompt in enumerate(prompts):
                    context.decode([Feed(seq, prompt, 0, True)])
                    last.append(context.logits(0).copy())
                alone.append(time.perf_counter() - began)
            else:
                context.decode([Feed(seq, prompt, 0, True) for seq, prompt in enumerate(prompts)])
                together.append(time.perf_counter() - began)
                mixed = [context.logits(seq).copy() for seq in range(len(prompts))]
    difference = max(float(np.abs(a - b).max()) for a, b in zip(last, mixed, strict=True))
    graphs = len(split([(seq, 0, n) for seq, n in enumerate(lengths)]))
    return statistics.median(alone) * 1000, statistics.median(together) * 1000, difference, graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    import llama_cpp

    LlamaLog.install(llama_cpp)
    context = raw_context(
        llama_cpp, str(pull()), repack=False, n_seq=8, n_ctx_seq=1024, threads=args.threads
    )
    rng = np.random.default_rng(7)
    for seq in range(8):
        context.decode([Feed(seq, [int(t) for t in rng.integers(1000, 30000, PROMPT)], 0, False)])
    times: dict[str, list[float]] = {name: [] for name in SETS}
    for rep in range(args.reps):
        for name in SETS if rep % 2 == 0 else reversed(SETS):
            times[name].append(_pass_ms(context, SETS[name]))
    print(f"{args.reps} reps of {PASSES} passes, {args.threads} threads; medians\n")
    print("| sequences fed, in order | graphs | pass ms | reps' range ms |\n|---|---|---|---|")
    for name, seqs in SETS.items():
        graphs = len(split([(seq, PROMPT, 1) for seq in seqs]))
        low, high = min(times[name]), max(times[name])
        print(
            f"| {name} | {graphs} | {statistics.median(times[name]):.1f} | {low:.1f}-{high:.1f} |"
        )
    print("\n| largest logit difference from a sequence's lone pass | |\n|---|---|")
    print(f"| token rows of 7 sequences in one pass | {_rows_difference(context, 7):.3g} |")
    print(f"| token rows of 8 sequences in one pass | {_rows_difference(context, 8):.3g} |")
    print(
        f"| a prompt's last 5 tokens beside 3 token rows | {_tail_difference(context, rng):.3g} |"
    )
    print(
        "\n| prompts' lengths | each in its own pass, ms | all in one pass, ms | its graphs "
        "| largest logit difference |\n|---|---|---|---|---|"
    )
    for lengths in PROMPT_SETS:
        alone, together, difference, graphs = _prompts_together(context, rng, lengths, args.reps)
        names = ", ".join(map(str, lengths))
        print(f"| {names} | {alone:.0f} | {together:.0f} | {graphs} | {difference:.3g} |")


if __name__ == "__main__":
    main()
