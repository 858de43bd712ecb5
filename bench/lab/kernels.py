"""llama.cpp's plain CPU weights (what oars loads) against its repacked ones, raw passes.

    .venv/bin/python -m bench.lab.kernels [--reps 5] [--threads 2]

llama-server repacks by default the tensors it can for the CPU's kernels (llama.cpp's "extra"
buffer types); oars does not, and this is the evidence for that choice. Both loads of the
default model live in this process, each with a context of 4 sequences (as `oars serve` makes
it, no flash attention); the reps alternate between them. Per load:

- one pass of 1 sequence × 1 token (a lone stream's step) and of 4 × 1 (four streams' step),
  median milliseconds, after 200 prompt tokens per sequence;
- a 1,024-token prompt fed in 256-token chunks (what the batcher does), seconds;
- batch independence: the largest difference between a sequence's logits in a pass of its own
  and in a pass of 4 (0 means a request's text cannot depend on what runs beside it).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import numpy as np

from oars.engines.batching import Feed
from oars.engines.llama_context import LlamaContext, LlamaLog
from oars.weights import pull

PROMPT, STEPS, CHUNK = 200, 20, 256


def raw_context(
    llama_cpp: Any, path: str, *, repack: bool, n_seq: int, n_ctx_seq: int, threads: int
) -> LlamaContext:
    """The GGUF's weights (llama.cpp's repacked ones or not) in a context of `n_seq`
    sequences, as `oars serve` makes it (512-token passes, no flash attention)."""
    model = raw_model(llama_cpp, path, repack=repack)
    return model_context(llama_cpp, model, n_seq=n_seq, n_ctx_seq=n_ctx_seq, threads=threads)


def raw_model(llama_cpp: Any, path: str, *, repack: bool) -> Any:
    """The GGUF's weights, llama.cpp's repacked ones or not (`oars serve` loads them plain)."""
    params = llama_cpp.llama_model_default_params()
    params.use_extra_bufts = repack
    return llama_cpp.llama_model_load_from_file(path.encode(), params)


def model_context(
    llama_cpp: Any, model: Any, *, n_seq: int, n_ctx_seq: int, threads: int
) -> LlamaContext:
    """A context of `n_seq` sequences on a loaded model, as `oars serve` makes it."""
    vocab = llama_cpp.llama_model_get_vocab(model)
    return LlamaContext(
        llama_cpp,
        model,
        n_seq=n_seq,
        n_ctx_seq=n_ctx_seq,
        n_batch=512,
        n_threads=threads,
        n_vocab=llama_cpp.llama_vocab_n_tokens(vocab),
        flash_attn=False,
    )


class Load:
    def __init__(self, llama_cpp: Any, path: str, *, repack: bool, threads: int) -> None:
        self.name = "repacked" if repack else "plain"
        self.ctx = raw_context(
            llama_cpp, path, repack=repack, n_seq=4, n_ctx_seq=4096, threads=threads
        )
        rng = np.random.default_rng(7)  # the same tokens for both loads
        self.prompts = [[int(t) for t in rng.integers(1000, 30000, PROMPT)] for _ in range(4)]
        self.long = [int(t) for t in rng.integers(1000, 30000, 1024)]
        for seq, tokens in enumerate(self.prompts):
            self.ctx.decode([Feed(seq, tokens, 0, False)])

    def steps(self, seqs: list[int]) -> float:
        """Median ms of a pass feeding one token to each of `seqs` (then dropped again)."""
        times = []
        for i in range(STEPS):
            feeds = [Feed(s, (100 + i,), PROMPT, True) for s in seqs]
            began = time.perf_counter()
            self.ctx.decode(feeds)
            times.append(time.perf_counter() - began)
            for s in seqs:
                self.ctx.forget(s, PROMPT)
        return statistics.median(times) * 1000

    def prefill(self) -> float:
        self.ctx.forget(3, 0)
        began = time.perf_counter()
        for start in range(0, len(self.long), CHUNK):
            chunk = self.long[start : start + CHUNK]
            self.ctx.decode([Feed(3, chunk, start, start + CHUNK >= len(self.long))])
        took = time.perf_counter() - began
        self.ctx.forget(3, 0)
        self.ctx.decode([Feed(3, self.prompts[3], 0, False)])
        return took

    def batch_difference(self) -> float:
        """Largest |logit difference| of a sequence alone against in a pass of 4."""
        alone = []
        for s in range(4):
            self.ctx.decode([Feed(s, (100 + s,), PROMPT, True)])
            alone.append(self.ctx.logits(0).copy())
            self.ctx.forget(s, PROMPT)
        self.ctx.decode([Feed(s, (100 + s,), PROMPT, True) for s in range(4)])
        together = [self.ctx.logits(s).copy() for s in range(4)]
        for s in range(4):
            self.ctx.forget(s, PROMPT)
        return max(float(np.abs(a - b).max()) for a, b in zip(alone, together, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    import llama_cpp

    LlamaLog.install(llama_cpp)  # llama.cpp's lines to logging (not shown), as `oars serve` does
    path = str(pull())
    loads = [Load(llama_cpp, path, repack=r, threads=args.threads) for r in (False, True)]
    results: dict[str, dict[str, list[float]]] = {
        load.name: {"one": [], "four": [], "prefill": []} for load in loads
    }
    for rep in range(args.reps):
        for load in loads if rep % 2 == 0 else loads[::-1]:
            out = results[load.name]
            out["one"].append(load.steps([0]))
            out["four"].append(load.steps([0, 1, 2, 3]))
            out["prefill"].append(load.prefill())
    plain, repacked = (results[load.name] for load in loads)
    print(f"{args.reps} reps, {args.threads} threads, medians; ratio repacked / plain\n")
    print("| measure | plain | repacked | ratio |\n|---|---|---|---|")
    for key, label, unit in (
        ("one", "pass, 1 sequence", "ms"),
        ("four", "pass, 4 sequences", "ms"),
        ("prefill", "1,024-token prompt, 256 a pass", "s"),
    ):
        a, b = statistics.median(plain[key]), statistics.median(repacked[key])
        print(f"| {label} | {a:.2f} {unit} | {b:.2f} {unit} | {b / a:.3f} |")
    a, b = (load.batch_difference() for load in loads)
    print(f"| largest logit difference, alone vs in a pass of 4 | {a:.3g} | {b:.3g} | |")


if __name__ == "__main__":
    main()
