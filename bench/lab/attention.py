"""llama.cpp's attention kernels on the CPU, with and without flash attention: speed where agents
spend their time, and whether a sequence's logits depend on the rest of its batch.

    .venv/bin/python -m bench.lab.attention [--fill 3000] [--reps 3]

Each setting gets its own context (4 sequences, as `oars serve` makes it, weights not repacked),
in a process of its own, alternating. On each: the prefill of `--fill` random tokens (512 a pass),
then passes of 13 new tokens (a short agent turn) and of 1 token after them; then four sequences
of unequal lengths (300, 200, 100, 50 tokens) decode 12 steps, each step once alone per sequence
and once as a pass of all four, and the largest difference between the two logits is reported.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from typing import Any

from oars.weights import pull


def _measure(flash: bool, fill: int) -> dict[str, Any]:
    import llama_cpp
    import numpy as np

    llama_cpp.llama_backend_init()
    model_params = llama_cpp.llama_model_default_params()
    model_params.use_extra_bufts = False
    model = llama_cpp.llama_model_load_from_file(str(pull()).encode(), model_params)
    params = llama_cpp.llama_context_default_params()
    params.n_ctx, params.n_seq_max, params.kv_unified = 4 * 16384, 4, False
    params.n_batch = params.n_ubatch = 512
    params.n_threads = params.n_threads_batch = 2
    params.flash_attn_type = (
        llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
        if flash
        else llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED
    )
    ctx = llama_cpp.llama_init_from_model(model, params)
    memory = llama_cpp.llama_get_memory(ctx)
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    batch = llama_cpp.llama_batch_init(512, 0, 1)
    rng = random.Random(5)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(1000, 30000) for _ in range(n)]

    def decode(feeds: list[tuple[int, list[int], int]]) -> tuple[float, list[Any]]:
        i, outputs = 0, []
        for seq, toks, start in feeds:
            for k, token in enumerate(toks):
                batch.token[i], batch.pos[i], batch.logits[i] = token, start + k, 0
                batch.n_seq_id[i], batch.seq_id[i][0] = 1, seq
                i += 1
            batch.logits[i - 1] = 1
            outputs.append(i - 1)
        batch.n_tokens = i
        began = time.perf_counter()
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed")
        took = time.perf_counter() - began
        rows = [llama_cpp.llama_get_logits_ith(ctx, o) for o in outputs]
        return took, [np.ctypeslib.as_array(r, shape=(n_vocab,)).copy() for r in rows]

    prefill, position = 0.0, 0
    while position < fill:
        n = min(512, fill - position)
        prefill += decode([(0, tokens(n), position)])[0]
        position += n
    turn, single = [], []
    for _ in range(3):
        turn.append(decode([(0, tokens(13), fill)])[0])
        llama_cpp.llama_memory_seq_rm(memory, 0, fill, -1)
        single.append(decode([(0, tokens(1), fill)])[0])
        llama_cpp.llama_memory_seq_rm(memory, 0, fill, -1)
    llama_cpp.llama_memory_seq_rm(memory, 0, 0, -1)
    lengths = [300, 200, 100, 50]
    for seq, n in enumerate(lengths):
        decode([(seq, tokens(n), 0)])
    worst = 0.0
    for step in range(12):
        fed = [(seq, tokens(1), n + step) for seq, n in enumerate(lengths)]
        alone = []
        for feed in fed:
            alone += decode([feed])[1]
            llama_cpp.llama_memory_seq_rm(memory, feed[0], feed[2], -1)
        together = decode(fed)[1]
        worst = max(
            worst, *(float(np.abs(a - b).max()) for a, b in zip(alone, together, strict=True))
        )
    return {
        "flash": flash,
        "prefill_s": prefill,
        "turn_ms": statistics.median(turn) * 1000,
        "token_ms": statistics.median(single) * 1000,
        "batch_difference": worst,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--fill", type=int, default=3000, help="tokens in context before a turn")
    parser.add_argument("--reps", type=int, default=1, help="processes per setting")
    parser.add_argument("--one", choices=("on", "off"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(_measure(args.one == "on", args.fill)))
        return
    results: dict[str, list[dict[str, Any]]] = {"on": [], "off": []}
    for rep in range(args.reps):
        for setting in ("on", "off") if rep % 2 == 0 else ("off", "on"):
            out = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "bench.lab.attention",
                    "--one",
                    setting,
                    "--fill",
                    str(args.fill),
                ],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            results[setting].append(json.loads(out.strip().splitlines()[-1]))
    print(f"{args.fill} tokens in context, median of {args.reps} processes per setting\n")
    print(
        "| flash attention | prefill s | 13 new tokens ms | 1 token ms | "
        "max logit difference, alone vs in a batch of 4 |"
    )
    print("|---|---|---|---|---|")
    for setting, runs in results.items():

        def med(key: str, runs: list[dict[str, Any]] = runs) -> float:
            return float(statistics.median(r[key] for r in runs))

        print(
            f"| {setting} | {med('prefill_s'):.1f} | {med('turn_ms'):.0f} | "
            f"{med('token_ms'):.1f} | {max(r['batch_difference'] for r in runs):.3g} |"
        )


if __name__ == "__main__":
    main()
